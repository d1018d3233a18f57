"""The plasticity stage on text: every component's plasticity of a GPT2 model between pairs of
token sequences cut from text files.

The text counterpart of :func:`vitplasticity.plasticity.measure_dataset`: pair i is reference
sequence i with downstream sequence i (cycled), both cut from text files
(:mod:`vitplasticity.data.text`); the tables have the image plasticity's schema. Torch and
transformers are imported when a measurement starts, so that the CLI's ``--help`` stays fast.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vitplasticity.plasticity import Measurement

log = logging.getLogger(__name__)

TEXT_MODEL_KEYS = frozenset({"source", "hf_id", "config", "init_seed"})
"""Keys of a ``text_plasticity.models`` entry."""

AUTO_TOKENIZER = "auto"
"""Tokenizer setting: ``bytes`` for a random-init model, else the model's hf_id tokenizer."""


def gpt2_entry(spec: Any) -> dict[str, Any]:
    """The :func:`vitplasticity.text_models.build_gpt2` entry of a ``text_plasticity.models`` entry.

    Raises:
        ValueError: when ``spec`` is not a mapping or has an unknown key, naming it.
    """
    if not isinstance(spec, dict):
        raise ValueError(f"--model-spec: expected a JSON object, got {spec!r}")
    unknown = set(spec) - TEXT_MODEL_KEYS
    if unknown:
        raise ValueError(
            f"--model-spec: unknown keys {sorted(unknown)}; known: {sorted(TEXT_MODEL_KEYS)}"
        )
    return {
        "family": "gpt2",
        "hf_id": spec.get("hf_id", "gpt2"),
        "weights": spec.get("source", "hub"),
        "config": dict(spec.get("config") or {}),
    }


def tokenizer_name(requested: str, entry: dict[str, Any]) -> str:
    """The tokenizer to load: ``auto`` resolves to ``bytes`` for random-init weights, else
    to the model's hf_id (a local model folder: that folder)."""
    from vitplasticity.data.text import BYTE_TOKENIZER

    if requested != AUTO_TOKENIZER:
        return requested
    if entry["weights"] == "random":
        return BYTE_TOKENIZER
    return entry["hf_id"] if entry["weights"] == "hub" else entry["weights"]


def measure_text(
    model_name: str,
    model_spec: dict[str, Any],
    reference: str | Path,
    text: str | Path,
    *,
    dataset: str | None = None,
    tokenizer: str = AUTO_TOKENIZER,
    sequence_length: int = 128,
    n_pairs: int = 12800,
    batch_size: int = 64,
    protocols: Sequence[str] = ("embedding",),
    device: str = "auto",
    dtype: str = "float32",
    demo: bool = False,
) -> Measurement:
    """The plasticity of GPT2 model ``model_name`` (its ``text_plasticity.models`` entry
    ``model_spec``) between a reference and a downstream text file: the ``text-plasticity``
    stage. ``dataset`` names the downstream data (default: the file's stem).

    Raises:
        ValueError: for a bad argument (naming its CLI flag), a sequence longer than the
            model's positions, fewer reference sequences than ``n_pairs``, or a ``source``
            that is not a complete GPT2 checkpoint (:func:`~vitplasticity.text_models.build_gpt2`).
        FileNotFoundError: for a missing text file, or a ``source`` folder without config.json.
    """
    import torch

    from vitplasticity.data.text import cycled, load_tokenizer, read_sequences
    from vitplasticity.models import pick_device
    from vitplasticity.plasticity import check_protocols, measure_protocols, measurement
    from vitplasticity.progress import ProgressReporter
    from vitplasticity.text_models import build_gpt2

    # Every argument and file is checked before the model runs.
    protocols = check_protocols(protocols)
    for flag, value in (
        ("--n-pairs", n_pairs),
        ("--batch-size", batch_size),
        ("--sequence-length", sequence_length),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    entry = gpt2_entry(model_spec)
    for flag, path in (("--reference", reference), ("--text", text)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag}: text file not found: {path}")
    target = pick_device(device)
    # A random init depends on init_seed alone: every job of the model measures the same weights.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(model_spec.get("init_seed", 0)))
        model = build_gpt2(entry)
    positions = model.config.n_positions
    if sequence_length > positions:
        raise ValueError(
            f"--sequence-length {sequence_length} exceeds the {positions} positions of "
            f"model {model_name!r}"
        )
    tokenizer = tokenizer_name(tokenizer, entry)
    tokenize = load_tokenizer(tokenizer, model.config.vocab_size)
    n, length = n_pairs, sequence_length
    references = read_sequences(reference, tokenize, length, max_sequences=n)
    if len(references) < n:
        raise ValueError(
            f"{reference}: {len(references)} reference sequences of {length} tokens, "
            f"fewer than --n-pairs {n}"
        )
    downstream = read_sequences(text, tokenize, length, max_sequences=n)
    dataset = dataset or Path(text).stem
    model = model.to(device=target, dtype=getattr(torch, dtype))
    log.info(
        "%s on %s (%d sequences of %d tokens, cycled to %d; tokenizer %s): protocols %s, %s on %s",
        model_name,
        dataset,
        len(downstream),
        length,
        n,
        tokenizer,
        ", ".join(protocols),
        dtype,
        target,
    )
    with ProgressReporter(n, f"text plasticity {model_name}/{dataset}") as progress:
        pairs = measure_protocols(
            model,
            torch.from_numpy(references),
            torch.from_numpy(cycled(downstream, n)),
            protocols=protocols,
            batch_size=batch_size,
            n_pairs=n,
            progress=progress,
        )
    settings: dict[str, Any] = {
        "model_spec": model_spec,
        "reference": str(reference),
        "text": str(text),
        "tokenizer": tokenizer,
        "sequence_length": length,
        "downstream_sequences": len(downstream),
        "protocols": list(protocols),
        "n_pairs": n,
        "batch_size": batch_size,
        "device": device,
        "dtype": dtype,
    }
    return measurement(
        pairs, model=model_name, dataset=dataset, settings=settings, device=target, demo=demo
    )
