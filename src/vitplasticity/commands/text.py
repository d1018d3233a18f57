"""``text-plasticity``: every component's plasticity of a GPT2 model on pairs of token sequences.

The text counterpart of ``plasticity``: pair i is reference sequence i with downstream sequence
i (cycled), both cut from text files (:mod:`vitplasticity.data.text`); the tables it writes
have the image plasticity's schema.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from vitplasticity.commands import json_argument
from vitplasticity.commands.plasticity import DTYPES, ProgressReporter, write_outputs

log = logging.getLogger(__name__)

TEXT_MODEL_KEYS = frozenset({"source", "hf_id", "config", "init_seed"})
"""Keys of a ``text_plasticity.models`` entry."""

AUTO_TOKENIZER = "auto"
"""Tokenizer setting: ``bytes`` for a random-init model, else the model's hf_id tokenizer."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``text-plasticity`` subcommand."""
    parser = subparsers.add_parser(
        "text-plasticity",
        help="plasticity of every component of a GPT2 model, per pair of token sequences",
        description="Cut the reference and downstream text files into sequences of "
        "--sequence-length tokens, pair reference sequence i with downstream sequence i (the "
        "downstream cycled when shorter) and measure ||f(x)-f(y)|| / ||x-y|| for ln1, mha, "
        "ln2, fc1 and fc2 of every block. Writes the per-pair table and its summary.",
    )
    parser.add_argument("--model", required=True, help="model name (config key)")
    parser.add_argument(
        "--model-spec",
        required=True,
        type=json_argument,
        help='its config entry, as JSON: {"source": hub|random|<folder>, "hf_id": ..., '
        '"config": {GPT2Config overrides}, "init_seed": seed of a random init (default 0)}',
    )
    parser.add_argument("--reference", required=True, help="reference text file")
    parser.add_argument("--text", required=True, help="downstream text file")
    parser.add_argument("--dataset", help="downstream dataset name (default: the file's stem)")
    parser.add_argument(
        "--tokenizer",
        default=AUTO_TOKENIZER,
        help="auto (bytes for a random-init model, else its hf_id), bytes, a hub id or folder",
    )
    parser.add_argument("--sequence-length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--n-pairs", type=int, default=12800, help="sequence pairs")
    parser.add_argument("--batch-size", type=int, default=64, help="pairs per forward pass")
    parser.add_argument(
        "--protocols",
        nargs="+",
        default=["embedding"],
        metavar="P",
        help="embedding (the reference code) and/or in_situ",
    )
    parser.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="compute dtype (norms are float64)"
    )
    parser.add_argument("--demo", action="store_true", help="label the outputs as a demo")
    parser.add_argument("--out", required=True, help="per-pair Parquet file")
    parser.add_argument("--summary", required=True, help="per-(block, component) Parquet file")
    parser.set_defaults(handler=run_text_plasticity)


def gpt2_entry(spec: Any) -> dict[str, Any]:
    """The :func:`vitplasticity.adapters.build_gpt2` entry of a ``text_plasticity.models`` entry.

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


def run_text_plasticity(args: argparse.Namespace) -> int:
    import torch

    from vitplasticity.adapters import build_gpt2
    from vitplasticity.data.text import cycled, load_tokenizer, read_sequences
    from vitplasticity.models import pick_device
    from vitplasticity.plasticity import check_protocols, measure_protocols

    # Every argument and file is checked before the model runs.
    protocols = check_protocols(args.protocols)
    for flag, value in (
        ("--n-pairs", args.n_pairs),
        ("--batch-size", args.batch_size),
        ("--sequence-length", args.sequence_length),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    entry = gpt2_entry(args.model_spec)
    for flag, path in (("--reference", args.reference), ("--text", args.text)):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{flag}: text file not found: {path}")
    device = pick_device(args.device)
    # A random init depends on init_seed alone: every job of the model measures the same weights.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(args.model_spec.get("init_seed", 0)))
        model = build_gpt2(entry)
    positions = model.config.n_positions
    if args.sequence_length > positions:
        raise ValueError(
            f"--sequence-length {args.sequence_length} exceeds the {positions} positions of "
            f"model {args.model!r}"
        )
    tokenizer = tokenizer_name(args.tokenizer, entry)
    tokenize = load_tokenizer(tokenizer, model.config.vocab_size)
    n, length = args.n_pairs, args.sequence_length
    reference = read_sequences(args.reference, tokenize, length, max_sequences=n)
    if len(reference) < n:
        raise ValueError(
            f"{args.reference}: {len(reference)} reference sequences of {length} tokens, "
            f"fewer than --n-pairs {n}"
        )
    downstream = read_sequences(args.text, tokenize, length, max_sequences=n)
    dataset = args.dataset or Path(args.text).stem
    model = model.to(device=device, dtype=getattr(torch, args.dtype))
    log.info(
        "%s on %s (%d sequences of %d tokens, cycled to %d; tokenizer %s): protocols %s, %s on %s",
        args.model,
        dataset,
        len(downstream),
        length,
        n,
        tokenizer,
        ", ".join(protocols),
        args.dtype,
        device,
    )
    progress = ProgressReporter(n, f"text plasticity {args.model}/{dataset}")
    try:
        pairs = measure_protocols(
            model,
            torch.from_numpy(reference),
            torch.from_numpy(cycled(downstream, n)),
            protocols=protocols,
            batch_size=args.batch_size,
            n_pairs=n,
            progress=progress,
        )
    finally:
        progress.close()

    settings: dict[str, Any] = {
        "model_spec": args.model_spec,
        "reference": str(args.reference),
        "text": str(args.text),
        "tokenizer": tokenizer,
        "sequence_length": length,
        "downstream_sequences": len(downstream),
        "protocols": list(protocols),
        "n_pairs": n,
        "batch_size": args.batch_size,
        "device": args.device,
        "dtype": args.dtype,
    }
    write_outputs(args, pairs, dataset=dataset, settings=settings, device=device)
    return 0
