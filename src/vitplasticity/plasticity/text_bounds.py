"""The text bounds stage (``vitplasticity bounds --text``): the paper's upper bounds (Section 4) of a transformers text model
(GPT2, BERT, RoBERTa and their task classes; GPT-NeoX and Falcon, whose MHA bound is refused for
their rotary positions; DeBERTa-v2, whose MHA bound is refused for its relative attention),
beside its plasticity measured on text.

The text counterpart of :func:`vitplasticity.plasticity.bounds.model_bounds`, as
:mod:`vitplasticity.plasticity.text` is that of the image plasticity. The bounds are stated for
the embedding protocol, where every component of every block is fed the embedding output
(docs/protocol.md, 1.1): the token set whose extreme values (sigma, r, E) they assume is the
embedding output of the reference sequences, cut from the reference text as the text
plasticity stage cuts them (same tokenizer, same length, the first ``n_sequences``); the
measured plasticity they are set beside is that stage's embedding-protocol ratios.

A family whose bounds the paper does not state is refused by name with the reason, before any
text is read: Llama, Mistral, Qwen and Gemma (RMSNorm, rotary positions). Torch and
transformers are imported when a computation starts, so that the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from vitplasticity.models.architectures import Architecture
    from vitplasticity.plasticity.bounds import BoundsResult
    from vitplasticity.plasticity.settings import TextBoundsSettings

log = logging.getLogger(__name__)


def reference_sequences(
    reference: str | os.PathLike[str], tokenizer: str, vocab_size: int, settings: TextBoundsSettings
) -> np.ndarray:
    """The first ``n_sequences`` sequences (N, sequence_length) of ``reference``, cut by
    ``tokenizer`` for a vocabulary of ``vocab_size`` tokens: the text plasticity stage's
    reference sequences.

    Raises:
        ValueError: when the file gives fewer than ``n_sequences`` sequences.
    """
    from vitplasticity.data.text import load_tokenizer, read_sequences

    n, length = settings.n_sequences, settings.sequence_length
    tokenize = load_tokenizer(tokenizer, vocab_size)
    sequences = read_sequences(reference, tokenize, length, max_sequences=n)
    if len(sequences) < n:
        raise ValueError(
            f"{reference}: {len(sequences)} reference sequences of {length} tokens, fewer than "
            f"--n-sequences {n}"
        )
    return sequences


def embedded_sequences(
    architecture: Architecture,
    model: nn.Module,
    sequences: np.ndarray,
    batch_size: int,
    device: torch.device,
) -> Iterator[torch.Tensor]:
    """The embedding outputs (N, n, d) of ``sequences`` (token ids), ``batch_size`` at a time,
    in the model's dtype: what the embedding protocol feeds every component."""
    import torch

    with torch.inference_mode():
        for start in range(0, len(sequences), batch_size):
            ids = torch.from_numpy(sequences[start : start + batch_size]).to(device)  # (B, L)
            yield architecture.embed(model, ids).tokens


def text_model_bounds(
    model_name: str,
    model_spec: dict[str, Any],
    reference: str | os.PathLike[str],
    settings: TextBoundsSettings,
    plasticity_files: Sequence[str | os.PathLike[str]] = (),
) -> BoundsResult:
    """The bounds of text model ``model_name`` (its ``models:`` entry ``model_spec``, ``family:
    transformers``) for the embedding outputs of the first ``n_sequences`` reference
    sequences, joined with the plasticity measured in ``plasticity_files`` (text plasticity
    pairs files; :func:`~vitplasticity.plasticity.bounds.measured_plasticity`). A component
    whose bound is not defined gets no rows, only its reason in the log and the metadata's
    ``undefined``.

    Raises:
        ValueError: for a bad setting (naming its CLI flag and config key), an entry that is
            not a transformers text model's, a model that takes images, sequences longer
            than the model's positions, or fewer reference sequences than ``n_sequences``.
        FileNotFoundError: for a missing reference text or plasticity file.
        UnsupportedModel, UndefinedStage: for a model without bounds (a family that refuses
            the stage: Llama, Gemma), before the text is read.
    """
    import polars as pl
    import torch

    from vitplasticity.models.build import pick_device
    from vitplasticity.models.text import tokenizer_name
    from vitplasticity.plasticity.bounds import (
        BoundsResult,
        beside_measured,
        bounds_metadata,
        counted,
        measured_plasticity,
    )
    from vitplasticity.plasticity.text import checked_text_spec, text_model
    from vitplasticity.plasticity.upper_bounds import (
        TokenStatistics,
        bound_rows,
        bounds_architecture,
        log_undefined,
        undefined_bounds,
    )
    from vitplasticity.provenance import provenance
    from vitplasticity.settings.declaration import check_settings, recorded_settings
    from vitplasticity.utils.progress import ProgressReporter

    # Every setting and file is checked before the model is built.
    settings = check_settings(settings)
    spec = checked_text_spec(model_name, model_spec, files={"--reference": reference})
    measured = measured_plasticity(plasticity_files)
    target = pick_device(settings.device)
    model = text_model(model_name, spec, settings.sequence_length)
    # Refusals (no bounds in the family, a part it cannot account for, an undefined bound)
    # are known before any text is read.
    architecture = bounds_architecture(model)
    undefined = undefined_bounds(model, architecture)
    log_undefined(model, undefined)
    tokenizer = tokenizer_name(settings.tokenizer, spec)
    sequences = reference_sequences(reference, tokenizer, model.config.vocab_size, settings)

    # float64 throughout: the bounds' extreme values come from these tokens.
    model = model.eval().to(device=target, dtype=torch.float64)
    embedded = embedded_sequences(architecture, model, sequences, settings.batch_size, target)
    label = f"text bounds {model_name}: embedding"
    with ProgressReporter(settings.n_sequences, label) as progress:
        stats = TokenStatistics.from_tokens(counted(embedded, progress))
    table = beside_measured(bound_rows(architecture, model.cpu(), stats, undefined), measured)
    recorded: dict[str, Any] = {
        "model_spec": model_spec,
        "reference": str(reference),
        **recorded_settings(settings),
        "tokenizer": tokenizer,
        "plasticity": [str(p) for p in plasticity_files],
        "token_statistics": asdict(stats),
    }
    metadata = bounds_metadata(model_name, provenance(recorded, target), settings.demo, undefined)
    table = table.select(pl.lit(model_name).alias("model"), pl.all())
    return BoundsResult(table, metadata, stats)
