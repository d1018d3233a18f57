"""``plasticity``: measure every component's plasticity for one (model, downstream dataset)."""

from __future__ import annotations

import argparse

from vitplasticity.commands import (
    add_image_model_arguments,
    add_measurement_outputs,
    write_measurement,
)
from vitplasticity.plasticity.settings import PlasticitySettings
from vitplasticity.settings.declaration import (
    add_settings_arguments,
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
    add_image_model_arguments(parser)
    parser.add_argument("--dataset-dir", required=True, help="prepared downstream dataset folder")
    # Every measuring flag, its type, choices and default from PlasticitySettings (the config
    # key each mirrors in its help).
    add_settings_arguments(parser, PlasticitySettings)
    add_measurement_outputs(parser)
    parser.set_defaults(handler=run_plasticity)


def run_plasticity(args: argparse.Namespace) -> int:
    """Measure (:func:`vitplasticity.plasticity.images.measure_dataset`) and write both
    tables."""
    from vitplasticity.plasticity.images import measure_dataset
    from vitplasticity.settings.tracking import tracking_from_args

    settings = settings_from_args(PlasticitySettings, args)
    tracking_options = tracking_from_args(args)  # a bad value stops the job before it measures
    result = measure_dataset(
        args.model, args.model_spec, args.reference, args.dataset_dir, settings
    )
    write_measurement(result, args.out, args.summary, tracking_options)
    return 0
