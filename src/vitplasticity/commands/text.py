"""``text-plasticity``: every component's plasticity of a transformers text model on pairs of
token sequences (:mod:`vitplasticity.plasticity.text`); the tables have the image plasticity's
schema.
"""

from __future__ import annotations

import argparse

from vitplasticity.commands import add_measurement_outputs, write_measurement
from vitplasticity.plasticity.settings import TextPlasticitySettings
from vitplasticity.settings.declaration import (
    add_settings_arguments,
    json_argument,
    settings_from_args,
)


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
    # Every measuring flag, its type, choices and default from TextPlasticitySettings (the
    # config key each mirrors in its help).
    add_settings_arguments(parser, TextPlasticitySettings)
    add_measurement_outputs(parser)
    parser.set_defaults(handler=run_text_plasticity)


def run_text_plasticity(args: argparse.Namespace) -> int:
    """Measure (:func:`vitplasticity.plasticity.text.measure_text`) and write both tables."""
    from vitplasticity.models.text import check_stated_positions
    from vitplasticity.plasticity.text import measure_text

    settings = settings_from_args(TextPlasticitySettings, args)
    check_stated_positions(args.model, args.model_spec, settings.sequence_length)
    result = measure_text(
        args.model, args.model_spec, args.reference, args.text, settings, dataset=args.dataset
    )
    write_measurement(result, args.out, args.summary)
    return 0
