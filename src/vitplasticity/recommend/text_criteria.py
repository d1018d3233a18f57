"""The criteria of a causal language model's components on token ids: the text counterpart
of :func:`vitplasticity.recommend.criteria.measure_criteria`, which
:mod:`vitplasticity.recommend.text` (the ``recommend --text`` stage) measures.

Components are ranked on the causal LM itself (:func:`ranked_module`: every text family takes
its task classes, ``GPT2LMHeadModel`` and ``XForCausalLM``), so the names are the causal LM's. The gradients are of the *next-token* cross-entropy
(:func:`next_token_loss`); the user's sequences come from every file in turn
(:func:`user_sequences`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.models.architectures import (
    Architecture,
    UnsupportedModel,
    architecture_for,
    parameter_map,
)
from vitplasticity.plasticity.measure import measure
from vitplasticity.recommend.criteria import Measurements, weight_statistics
from vitplasticity.recommend.gradients import gradient_statistics
from vitplasticity.recommend.nfn import NFN_SCHEMA, feature_norm_statistics

NFN_NA = "NFN is n/a for every configuration:"
"""How the log and the report start the reason NFN is undefined for a model."""


def ranked_module(lm: nn.Module) -> nn.Module:
    """The module whose components are ranked: ``lm`` itself, once an architecture knows it
    (every text family takes the causal LM around its base model).

    Raises:
        UnsupportedModel: naming the class, when no architecture knows it.
    """
    architecture_for(lm)
    return lm


def prefix_in(lm: nn.Module, module: nn.Module) -> str:
    """The dotted prefix of ``module``'s names inside ``lm`` ("" when it is ``lm``)."""
    for name, candidate in lm.named_modules():
        if candidate is module:
            return f"{name}." if name else ""
    raise ValueError(f"{type(module).__name__} is not inside {type(lm).__name__}")


@dataclass(frozen=True)
class RankedLM:
    """A causal LM and the module in it whose components are ranked (:func:`ranked_lm`)."""

    lm: nn.Module
    ranked: nn.Module
    prefix: str
    """The dotted prefix of the ranked module's names inside the LM ("" when it is the LM)."""
    head: list[str]
    """The names, in the LM, of the ranked module's classifier head and final norm."""


def ranked_lm(lm: nn.Module, ranked: nn.Module, architecture: Architecture) -> RankedLM:
    """Where ``ranked`` (of ``architecture``) sits in the causal LM ``lm``."""
    prefix = prefix_in(lm, ranked)
    head = architecture.head(ranked).modules
    return RankedLM(lm, ranked, prefix, [prefix + name for name in module_names(ranked, head)])


def module_names(model: nn.Module, modules: Sequence[nn.Module]) -> list[str]:
    """The names of ``modules`` in ``model``, in ``named_modules`` order."""
    wanted = {id(module) for module in modules}
    return [name for name, module in model.named_modules() if id(module) in wanted]


def next_token_loss(lm: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The loss of a batch of token ids (B, L): the mean cross-entropy of ``lm``'s logits at
    positions 0..L-2 against the tokens at 1..L-1, over the B (L - 1) predicted tokens, in the
    logits' dtype (transformers' own ``labels=`` loss upcasts float64 logits to float32)."""

    def loss(ids: torch.Tensor) -> torch.Tensor:
        logits = lm(input_ids=ids, use_cache=False).logits  # (B, L, V)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    return loss


def user_sequences(
    paths: Sequence[str | os.PathLike[str]],
    tokenize: Callable[[str], list[int]],
    sequence_length: int,
    max_sequences: int,
) -> np.ndarray:
    """The user's sequences (N, sequence_length): each file cut as
    :func:`~vitplasticity.data.text.read_sequences` cuts it (at most ``max_sequences`` read per
    file), then taken in turn from each file (first of every file, then second...; a file that
    runs out drops out), at most ``max_sequences`` in all. So the first pairs and batches draw
    on every file, not on the first one alone.

    Raises:
        ValueError: naming a file that holds fewer tokens than one sequence.
        FileNotFoundError: naming a file that does not exist.
    """
    from vitplasticity.data.text import read_sequences

    per_file = [read_sequences(p, tokenize, sequence_length, max_sequences) for p in paths]
    # (row, file) pairs sorted: row 0 of every file in file order, then row 1...
    order = sorted((row, file) for file, rows in enumerate(per_file) for row in range(len(rows)))
    return np.stack([per_file[file][row] for row, file in order[:max_sequences]])


def measure_text_criteria(
    lm: nn.Module,
    reference: torch.Tensor,
    downstream: torch.Tensor,
    gradient_batches: Sequence[Any],
    *,
    n_pairs: int,
    batch_size: int = 64,
    protocol: str = "embedding",
    progress: Callable[[int], None] | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
    warm_up: Callable[[], object] | None = None,
    nfn_inputs: torch.Tensor | None = None,
) -> Measurements:
    """Measure every criterion of the five components of a text model, on token ids.

    The text counterpart of :func:`.criteria.measure_criteria`, on the module
    :func:`ranked_module` finds in ``lm``: the weight statistic, the plasticity, then
    ``warm_up`` (a new classifier head's warm-up; None for a causal LM, whose head is
    pretrained), the NFN of one batch of token ids, then the relative gradient norm and
    gradient SNR of the task's loss over the gradient batches.

    Args:
        lm: a causal LM (:func:`vitplasticity.models.text.causal_lm`) or a sequence classifier
            (:func:`vitplasticity.models.text.sequence_classifier`) in eval mode, on the
            batches' device.
        reference: reference token ids (N, L); ``downstream`` likewise (pair i: reference i,
            downstream i, cycled).
        gradient_batches: what ``loss`` takes (>= 2): token-id batches (B, L) of the user's
            text for the next-token loss.
        n_pairs, batch_size, protocol, progress: the plasticity's pairs, pairs per forward
            pass, protocol (embedding: the paper's) and progress callback (pairs done).
        loss: the loss of a gradient batch (None: :func:`next_token_loss` of ``lm``).
        warm_up: run after the plasticity, before the NFN and the gradients.
        nfn_inputs: the token ids (B, L) of the NFN (None: the first gradient batch).

    Raises:
        ValueError: for fewer than 2 gradient batches.
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    if len(gradient_batches) < 2:
        raise ValueError(f"gradient criteria need at least 2 batches, got {len(gradient_batches)}")
    ranked = ranked_module(lm)
    parameter_map(ranked)  # names a part the architecture cannot account for, before compute
    weights = weight_statistics(ranked)
    counts = {"batch_size": batch_size, "n_pairs": n_pairs}
    pairs = measure(ranked, reference, downstream, protocol=protocol, **counts, progress=progress)
    if warm_up is not None:
        warm_up()
    try:
        features = feature_norm_statistics(
            ranked, gradient_batches[0] if nfn_inputs is None else nfn_inputs
        )
    except UnsupportedModel as error:
        # NFN is undefined for this model (DeBERTa-v3 applies its query and key projections
        # to the relative positions too): n/a, with the reason the report quotes, not a crash
        # after the plasticity was measured.
        logging.getLogger("vitplasticity.recommend.criteria").warning("%s %s", NFN_NA, error)
        features = pl.DataFrame(schema=NFN_SCHEMA)
    return Measurements.of_components(
        ranked,
        pairs=pairs,
        weights=weights,
        features=features,
        gradients=lambda names: gradient_statistics(
            ranked, gradient_batches, names, loss=next_token_loss(lm) if loss is None else loss
        ),
    )
