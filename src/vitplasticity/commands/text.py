"""``text-plasticity``: every component's plasticity of a transformers text model on pairs of
token sequences (:mod:`vitplasticity.plasticity.text`); the tables have the image plasticity's
schema. ``text-bounds``: the paper's bounds of such a model on the same reference sequences
(:mod:`vitplasticity.plasticity.text_bounds`); the table has the image bounds' schema.
"""

from __future__ import annotations

import argparse
import logging

from vitplasticity.commands import add_measurement_outputs, write_bounds, write_measurement
from vitplasticity.plasticity.settings import TextBoundsSettings, TextPlasticitySettings
from vitplasticity.settings.declaration import (
    add_settings_arguments,
    json_argument,
    settings_from_args,
)

log = logging.getLogger(__name__)


MODEL_SPEC_HELP = (
    'its models: entry, as JSON: {"family": "transformers", "hf_id": ..., "weights": '
    'hub|random|<saved model folder>, "config": {overrides; with random the whole config, '
    'model_type included}, "model_class": ..., "init_seed": seed of a random init}'
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``text-plasticity`` and ``text-bounds`` subcommands."""
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
        help=MODEL_SPEC_HELP,
    )
    parser.add_argument("--reference", required=True, help="reference text file")
    parser.add_argument("--text", required=True, help="downstream text file")
    parser.add_argument("--dataset", help="downstream dataset name (default: the file's stem)")
    # Every measuring flag, its type, choices and default from TextPlasticitySettings (the
    # config key each mirrors in its help).
    add_settings_arguments(parser, TextPlasticitySettings)
    add_measurement_outputs(parser)
    parser.set_defaults(handler=run_text_plasticity)
    register_bounds(subparsers)


def register_bounds(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``text-bounds`` subcommand."""
    parser = subparsers.add_parser(
        "text-bounds",
        help="theoretical plasticity bounds per block and component of a transformers text model",
        description="Compute the paper's upper bounds (LayerNorm, linear, MHA and the "
        "energy-based MHA bound) of a text model (GPT2, BERT, RoBERTa; GPT-NeoX and Falcon "
        "without the MHA bound: rotary positions; DeBERTa-v2 without it: relative attention) "
        "from its weights and "
        "the embedding outputs of the first --n-sequences reference sequences (cut as "
        "text-plasticity cuts them), beside its measured plasticity (embedding protocol). A "
        "family whose bounds the paper does not state (Llama, Gemma: RMSNorm, rotary "
        "positions) is refused with the reason.",
    )
    parser.add_argument("--model", required=True, help="model name (config key)")
    parser.add_argument("--model-spec", required=True, type=json_argument, help=MODEL_SPEC_HELP)
    parser.add_argument("--reference", required=True, help="reference text file")
    # --tokenizer, --sequence-length, --n-sequences, --batch-size, --device and --demo from
    # TextBoundsSettings (the config key each mirrors in its help).
    add_settings_arguments(parser, TextBoundsSettings)
    parser.add_argument("--out", required=True, help="bounds Parquet file")
    parser.add_argument(
        "--plasticity",
        nargs="*",
        default=[],
        metavar="FILE",
        help="per-pair text plasticity Parquets (text-plasticity --out)",
    )
    parser.add_argument(
        "--figure-prefix", help="also draw the figure at this path without suffix (.pdf and .png)"
    )
    parser.set_defaults(handler=run_text_bounds)


def run_text_plasticity(args: argparse.Namespace) -> int:
    """Measure (:func:`vitplasticity.plasticity.text.measure_text`) and write both tables."""
    from vitplasticity.models.text import check_stated_positions
    from vitplasticity.plasticity.text import measure_text
    from vitplasticity.settings.tracking import tracking_from_args

    settings = settings_from_args(TextPlasticitySettings, args)
    tracking_options = tracking_from_args(args)  # a bad value stops the job before it measures
    check_stated_positions(args.model, args.model_spec, settings.sequence_length)
    result = measure_text(
        args.model, args.model_spec, args.reference, args.text, settings, dataset=args.dataset
    )
    write_measurement(result, args.out, args.summary, tracking_options, "text_plasticity")
    return 0


def run_text_bounds(args: argparse.Namespace) -> int:
    """Compute (:func:`vitplasticity.plasticity.text_bounds.text_model_bounds`) and write the
    table (and figure)."""
    from vitplasticity.models.text import check_stated_positions
    from vitplasticity.plasticity.text_bounds import text_model_bounds

    settings = settings_from_args(TextBoundsSettings, args)
    check_stated_positions(args.model, args.model_spec, settings.sequence_length)
    result = text_model_bounds(
        args.model, args.model_spec, args.reference, settings, args.plasticity
    )
    write_bounds(args, result)
    return 0
