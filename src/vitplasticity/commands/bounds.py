"""``bounds``: the theoretical plasticity bounds of one model, against its measured plasticity:
an image model's from the reference images (:mod:`vitplasticity.plasticity.bounds`), or with
``--text`` a transformers text model's from the reference text's sequences
(:mod:`vitplasticity.plasticity.text_bounds`); the table has one schema."""

from __future__ import annotations

import argparse
import logging

from vitplasticity.commands import (
    add_model_arguments,
    add_text_settings,
    own_defaults,
    refuse_given,
    write_bounds,
)
from vitplasticity.plasticity.settings import BoundsSettings, TextBoundsSettings
from vitplasticity.settings.declaration import add_settings_arguments, settings_from_args

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bounds`` subcommand."""
    parser = subparsers.add_parser(
        "bounds",
        help="theoretical plasticity bounds per block and component",
        description="Compute the paper's upper bounds (LayerNorm, linear, MHA and the "
        "energy-based MHA bound) from the model's weights and the embedding outputs of the "
        "reference images, beside the measured plasticity (embedding protocol). With --text, "
        "a text model's (GPT2, BERT, RoBERTa; GPT-NeoX and Falcon without the MHA bound: "
        "rotary positions; DeBERTa-v2 without it: relative attention) from the embedding "
        "outputs of the first --n-sequences sequences of the reference text, cut as the "
        "plasticity cuts them; a family whose bounds the paper does not state (Llama, Gemma: "
        "RMSNorm, rotary positions) is refused with the reason. A component whose bound the "
        "paper does not define for the model gets no rows; the log, the table's footer "
        "('undefined') and the figure say which and why.",
    )
    add_model_arguments(parser)
    reference = parser.add_mutually_exclusive_group(required=True)
    reference.add_argument("--reference", help="reference set Parquet file")
    reference.add_argument("--text", help="a text model's reference text file")
    # --n-images, --batch-size, --device and --demo from BoundsSettings, and how text is cut
    # from TextBoundsSettings (the config key each mirrors in its help).
    add_settings_arguments(parser, BoundsSettings)
    add_text_settings(parser, BoundsSettings, TextBoundsSettings)
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
    """Compute (:func:`vitplasticity.plasticity.bounds.model_bounds`, or with --text
    :func:`vitplasticity.plasticity.text_bounds.text_model_bounds`) and write the table (and
    figure).

    Raises:
        ValueError: for a flag of the other kind of input.
    """
    if args.text is not None:
        refuse_given(args, own_defaults(BoundsSettings, TextBoundsSettings), "images")
        from vitplasticity.models.text import check_stated_positions
        from vitplasticity.plasticity.text_bounds import text_model_bounds

        text = settings_from_args(TextBoundsSettings, args)
        check_stated_positions(args.model, args.model_spec, text.sequence_length)
        write_bounds(
            args, text_model_bounds(args.model, args.model_spec, args.text, text, args.plasticity)
        )
        return 0
    refuse_given(args, own_defaults(TextBoundsSettings, BoundsSettings), "--text")
    from vitplasticity.plasticity.bounds import model_bounds

    settings = settings_from_args(BoundsSettings, args)
    result = model_bounds(args.model, args.model_spec, args.reference, settings, args.plasticity)
    write_bounds(args, result)
    return 0
