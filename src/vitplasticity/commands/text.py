"""``text-plasticity``: every component's plasticity of a transformers text model on pairs of
token sequences (:mod:`vitplasticity.plasticity.text`); the tables have the image plasticity's
schema.
"""

from __future__ import annotations

import argparse

from vitplasticity.commands import DTYPES, write_measurement
from vitplasticity.plasticity.text import AUTO_TOKENIZER
from vitplasticity.settings import json_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``text-plasticity`` subcommand."""
    parser = subparsers.add_parser(
        "text-plasticity",
        help="plasticity of every component of a transformers text model, per pair of token "
        "sequences",
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
        help='its models: entry, as JSON: {"family": "transformers", "hf_id": ..., "weights": '
        'hub|random|<saved model folder>, "config": {overrides; with random the whole config, '
        'model_type included}, "model_class": ..., "init_seed": seed of a random init}',
    )
    parser.add_argument("--reference", required=True, help="reference text file")
    parser.add_argument("--text", required=True, help="downstream text file")
    parser.add_argument("--dataset", help="downstream dataset name (default: the file's stem)")
    parser.add_argument(
        "--tokenizer",
        default=AUTO_TOKENIZER,
        help="auto (bytes for a random-init model, else the model's own: its weights folder), "
        "bytes, or a tokenizer folder",
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


def run_text_plasticity(args: argparse.Namespace) -> int:
    """Measure (:func:`vitplasticity.plasticity.text.measure_text`) and write both tables."""
    from vitplasticity.plasticity.text import measure_text

    result = measure_text(
        args.model,
        args.model_spec,
        args.reference,
        args.text,
        dataset=args.dataset,
        tokenizer=args.tokenizer,
        sequence_length=args.sequence_length,
        n_pairs=args.n_pairs,
        batch_size=args.batch_size,
        protocols=args.protocols,
        device=args.device,
        dtype=args.dtype,
        demo=args.demo,
    )
    write_measurement(result, args.out, args.summary)
    return 0
