"""``bounds``: the theoretical plasticity bounds of one model, against its measured plasticity."""

from __future__ import annotations

import argparse
import logging

from vitplasticity.commands import add_image_model_arguments, write_bounds
from vitplasticity.plasticity.settings import BoundsSettings
from vitplasticity.settings.declaration import (
    add_settings_arguments,
    settings_from_args,
)

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bounds`` subcommand."""
    parser = subparsers.add_parser(
        "bounds",
        help="theoretical plasticity bounds per block and component",
        description="Compute the paper's upper bounds (LayerNorm, linear, MHA and the "
        "energy-based MHA bound) from the model's weights and the embedding outputs of the "
        "reference images, beside the measured plasticity (embedding protocol). A component "
        "whose bound the paper does not define for the model (MHA with rotary positions, a "
        "norm that is not a LayerNorm) gets no rows; the log, the table's footer "
        "('undefined') and the figure say which and why.",
    )
    add_image_model_arguments(parser)
    # --n-images, --batch-size, --device and --demo from BoundsSettings (the config key each
    # mirrors in its help).
    add_settings_arguments(parser, BoundsSettings)
    parser.add_argument("--out", required=True, help="bounds Parquet file")
    parser.add_argument(
        "--plasticity", nargs="*", default=[], metavar="FILE", help="per-pair plasticity Parquets"
    )
    parser.add_argument(
        "--figure-prefix",
        help="also draw the figure at this path without suffix (.pdf and .png); the workflow "
        "draws it in its own rule (vitplasticity figure --kind bounds)",
    )
    parser.set_defaults(handler=run_bounds)


def run_bounds(args: argparse.Namespace) -> int:
    """Compute (:func:`vitplasticity.plasticity.bounds.model_bounds`) and write the table (and figure)."""
    from vitplasticity.plasticity.bounds import model_bounds

    settings = settings_from_args(BoundsSettings, args)
    result = model_bounds(args.model, args.model_spec, args.reference, settings, args.plasticity)
    write_bounds(args, result)
    return 0
