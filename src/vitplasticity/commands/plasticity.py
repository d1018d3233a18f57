"""``plasticity``: measure every component's plasticity for one (model, downstream dataset)."""

from __future__ import annotations

import argparse

from vitplasticity.commands import write_measurement
from vitplasticity.plasticity.settings import PlasticitySettings
from vitplasticity.settings.declaration import (
    add_settings_arguments,
    json_argument,
    settings_from_args,
)


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
    # Every measuring flag, its type, choices and default from PlasticitySettings (the config
    # key each mirrors in its help).
    add_settings_arguments(parser, PlasticitySettings)
    parser.add_argument("--out", required=True, help="per-pair Parquet file")
    parser.add_argument("--summary", required=True, help="per-(block, component) Parquet file")
    parser.set_defaults(handler=run_plasticity)


def run_plasticity(args: argparse.Namespace) -> int:
    """Measure (:func:`vitplasticity.plasticity.images.measure_dataset`) and write both
    tables."""
    from vitplasticity.plasticity.images import measure_dataset

    settings = settings_from_args(PlasticitySettings, args)
    result = measure_dataset(
        args.model, args.model_spec, args.reference, args.dataset_dir, settings
    )
    write_measurement(result, args.out, args.summary)
    return 0
