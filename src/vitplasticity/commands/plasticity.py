"""``plasticity``: measure every component's plasticity for one (model, downstream dataset):
an image model on pairs of images (:mod:`vitplasticity.plasticity.images`), or with ``--text`` a
transformers text model on pairs of token sequences (:mod:`vitplasticity.plasticity.text`);
the tables have one schema."""

from __future__ import annotations

import argparse

from vitplasticity.commands import (
    add_measurement_outputs,
    add_model_arguments,
    add_text_settings,
    own_defaults,
    refuse_given,
    write_measurement,
)
from vitplasticity.plasticity.settings import PlasticitySettings, TextPlasticitySettings
from vitplasticity.settings.declaration import add_settings_arguments, settings_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plasticity`` subcommand."""
    parser = subparsers.add_parser(
        "plasticity",
        help="plasticity of every component of every block, per pair of images or of token "
        "sequences",
        description="Pair reference image i with downstream image i (the downstream split "
        "cycled when shorter) and measure ||f(x)-f(y)|| / ||x-y|| for ln1, mha, ln2, fc1 and "
        "fc2 of every block. With --text, a transformers text model: the reference and "
        "downstream text files cut into sequences of --sequence-length tokens, reference "
        "sequence i paired with downstream sequence i. Writes the per-pair table and its "
        "per-(block, component) summary.",
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--reference",
        required=True,
        help="reference set Parquet file; with --text, the reference text file",
    )
    data = parser.add_mutually_exclusive_group(required=True)
    data.add_argument("--dataset-dir", help="prepared downstream dataset folder")
    data.add_argument("--text", help="a text model's downstream text file")
    parser.add_argument(
        "--dataset", help="with --text: downstream dataset name (default: the file's stem)"
    )
    # Every measuring flag, its type, choices and default from PlasticitySettings, and how
    # text is cut from TextPlasticitySettings (the config key each mirrors in its help).
    add_settings_arguments(parser, PlasticitySettings)
    add_text_settings(parser, PlasticitySettings, TextPlasticitySettings)
    add_measurement_outputs(parser)
    parser.set_defaults(handler=run_plasticity)


def run_plasticity(args: argparse.Namespace) -> int:
    """Measure (:func:`vitplasticity.plasticity.images.measure_dataset`, or with --text
    :func:`vitplasticity.plasticity.text.measure_text`) and write both tables.

    Raises:
        ValueError: for a flag of the other kind of input (an image flag with --text, a text
            flag with --dataset-dir).
    """
    from vitplasticity.settings.tracking import tracking_from_args

    if args.text is not None:
        refuse_given(args, own_defaults(PlasticitySettings, TextPlasticitySettings), "images")
        return _run_text(args)
    text_only = {**own_defaults(TextPlasticitySettings, PlasticitySettings), "dataset": None}
    refuse_given(args, text_only, "--text")
    from vitplasticity.plasticity.images import measure_dataset

    settings = settings_from_args(PlasticitySettings, args)
    tracking_options = tracking_from_args(args)  # a bad value stops the job before it measures
    result = measure_dataset(
        args.model, args.model_spec, args.reference, args.dataset_dir, settings
    )
    write_measurement(result, args.out, args.summary, tracking_options)
    return 0


def _run_text(args: argparse.Namespace) -> int:
    """Measure a text model (:func:`vitplasticity.plasticity.text.measure_text`) and write
    both tables."""
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
