"""``plasticity``: measure every component's plasticity for one (model, downstream dataset)."""

from __future__ import annotations

import argparse

from vitplasticity import FC1_MODES
from vitplasticity.commands import DTYPES, json_argument, write_measurement


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plasticity`` subcommand."""
    parser = subparsers.add_parser(
        "plasticity",
        help="plasticity of every component of every block, per image pair",
        description="Pair reference image i with downstream image i (the downstream split "
        "cycled when shorter) and measure ||f(x)-f(y)|| / ||x-y|| for ln1, mha, ln2, fc1 and "
        "fc2 of every block. Writes the per-pair table and its per-(block, component) summary.",
    )
    parser.add_argument("--model", required=True, help="model name (config key)")
    parser.add_argument(
        "--model-spec", required=True, type=json_argument, help="its config entry, as JSON"
    )
    parser.add_argument("--reference", required=True, help="reference set Parquet file")
    parser.add_argument("--dataset-dir", required=True, help="prepared downstream dataset folder")
    parser.add_argument("--split", default="test", help="downstream split (default: test)")
    parser.add_argument(
        "--protocols",
        nargs="+",
        default=["embedding"],
        metavar="P",
        help="embedding (the reference code) and/or in_situ",
    )
    parser.add_argument("--n-pairs", type=int, default=12800, help="image pairs (paper: 12,800)")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="pairs per forward pass (2x images)"
    )
    parser.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="compute dtype (norms are float64)"
    )
    parser.add_argument(
        "--fc1",
        choices=FC1_MODES,
        default="stage",
        help="a gated MLP's FC1: stage (gate + up projections) or up (the up projection alone, "
        "the reference code's DINOv3 ablation)",
    )
    parser.add_argument("--demo", action="store_true", help="label the outputs as a demo")
    parser.add_argument("--out", required=True, help="per-pair Parquet file")
    parser.add_argument("--summary", required=True, help="per-(block, component) Parquet file")
    parser.set_defaults(handler=run_plasticity)


def run_plasticity(args: argparse.Namespace) -> int:
    """Measure (:func:`vitplasticity.plasticity.measure_dataset`) and write both tables."""
    from vitplasticity.plasticity import measure_dataset

    result = measure_dataset(
        args.model,
        args.model_spec,
        args.reference,
        args.dataset_dir,
        split=args.split,
        protocols=args.protocols,
        n_pairs=args.n_pairs,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        fc1=args.fc1,
        demo=args.demo,
    )
    write_measurement(result, args.out, args.summary)
    return 0
