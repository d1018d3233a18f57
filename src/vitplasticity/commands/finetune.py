"""``finetune``: single-component finetuning runs (one job of the workflow's grid) of an image
model on a prepared dataset (``--dataset-dir``) or of a text model on a text file (``--text``:
a causal LM with the next-token loss, an encoder with the masked-LM loss) or on labelled text
(``--labelled-text``: a new classification head)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from vitplasticity.commands import PREEMPTED_EXIT, run_source
from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
from vitplasticity.settings.declaration import (
    add_settings_arguments,
    json_argument,
    settings_from_args,
)
from vitplasticity.settings.tracking import add_tracking_arguments, tracking_from_args
from vitplasticity.utils.io import check_writable

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``finetune`` subcommand."""
    parser = subparsers.add_parser(
        "finetune",
        help="finetune one configuration of a model on one dataset, images or text (resumable)",
        description="Single-component finetuning (arXiv 2602.06883): train the named "
        "components plus the head and final norm; write metrics.parquet and summary.json "
        "into --out-dir. Resumes from --out-dir/checkpoint.pt; SIGTERM writes a checkpoint. "
        "An image model trains a new classifier head on --dataset-dir, selected by validation "
        "accuracy; a text model on --text, a causal LM with the next-token loss, an encoder "
        "(its ...ForMaskedLM class; a bare encoder's MLM head drawn from the seed) with the "
        "masked-LM loss, selected by the lowest validation loss. The text is cut into "
        "sequences of --sequence-length tokens; sequence i is a validation sequence when "
        "floor((i+1) f) > floor(i f), f = --val-fraction. A text model on --labelled-text "
        "trains a new head in its sequence-classification class, selected by validation "
        "accuracy, each document its first --sequence-length tokens.",
    )
    run = parser.add_argument_group("the run")
    run.add_argument("--experiment", required=True, help="experiment name (labels the outputs)")
    run.add_argument("--model", required=True, help="model name (config key)")
    run.add_argument("--dataset", required=True, help="dataset name (config key)")
    data = run.add_mutually_exclusive_group(required=True)
    data.add_argument("--dataset-dir", help="an image dataset's prepared folder")
    data.add_argument("--text", help="a text dataset's text file, one document per line")
    data.add_argument(
        "--labelled-text",
        help="a labelled text dataset: a .csv or .jsonl with text and label columns, a folder "
        "with train and test ones, or a folder of <class>/<document>.txt folders",
    )
    run.add_argument(
        "--configuration",
        help="full|emb|ln1|mha|ln2|fc1|fc2|head|lora, or a combination a+b (e.g. mha+fc1)",
    )
    run.add_argument("--lr", type=float, help="peak learning rate")
    run.add_argument("--seed", type=int, help="head init, val split, data order")
    run.add_argument("--out-dir", help="the run's output folder")
    run.add_argument(
        "--runs",
        type=json_argument,
        help="instead of --configuration/--lr/--seed/--out-dir: a JSON list of such runs "
        '([{"configuration": .., "lr": .., "seed": .., "out_dir": ..}]), done one after '
        "another in this process (saves the start-up of one process per run)",
    )
    run.add_argument(
        "--stop-at-step",
        type=int,
        help="pause each run after this step (a rung of successive halving): checkpoint and "
        "rung_step<N>.json written, the schedule stays that of --steps; rerun without it to "
        "continue to --steps exactly",
    )
    # Every training flag, its type, choices and default from TrainingSettings (the config
    # key each mirrors in its help).
    training = parser.add_argument_group("training (defaults: the config schema's)")
    add_settings_arguments(training, TrainingSettings)
    text = parser.add_argument_group(
        "text, with --text or --labelled-text (defaults: the config schema's)"
    )
    add_settings_arguments(text, TextFinetuneSettings)
    add_tracking_arguments(parser)
    parser.set_defaults(handler=run_finetune)


_RUN_KEYS = ("configuration", "lr", "seed", "out_dir")


def _requested_runs(args: argparse.Namespace) -> list[dict]:
    """The runs asked for: one from the single-run flags, or the --runs list."""
    single = {key: getattr(args, key) for key in _RUN_KEYS}
    if args.runs is None:
        missing = [f"--{key.replace('_', '-')}" for key, value in single.items() if value is None]
        if missing:
            raise ValueError(f"finetune: {', '.join(missing)} required (or --runs)")
        return [single]
    if any(value is not None for value in single.values()):
        raise ValueError("finetune: give either --runs or --configuration/--lr/--seed/--out-dir")
    if not isinstance(args.runs, list) or not args.runs:
        raise ValueError("--runs: expected a non-empty JSON list of runs")
    for index, entry in enumerate(args.runs):
        if not isinstance(entry, dict) or set(entry) != set(_RUN_KEYS):
            raise ValueError(f"--runs[{index}]: expected exactly the keys {list(_RUN_KEYS)}")
    return args.runs


def run_finetune(args: argparse.Namespace) -> int:
    """Train each requested run in turn (``--runs``, or the single-run flags)."""
    from vitplasticity.finetune.loop import Preempted
    from vitplasticity.finetune.run import Run
    from vitplasticity.finetune.train import train_runs

    settings = settings_from_args(TrainingSettings, args)
    source = run_source(args)
    tracking_options = tracking_from_args(args)
    if args.stop_at_step is not None and args.stop_at_step < 1:
        raise ValueError(f"--stop-at-step: must be >= 1, got {args.stop_at_step}")
    # Both ways give the LR as a float parsed from its shortest repr (--lr, or a JSON number):
    # a packed run and a run of its own train with the same LR, to the last bit.
    runs = [
        (
            Run(args.experiment, args.model, args.dataset, r["configuration"], float(r["lr"]),
                int(r["seed"])),
            r["out_dir"],
        )
        for r in _requested_runs(args)
    ]  # fmt: skip
    for index, (_, out_dir) in enumerate(runs):
        key = "--out-dir" if args.runs is None else f"--runs[{index}].out_dir"
        if Path(out_dir).exists() and not Path(out_dir).is_dir():
            raise ValueError(
                f"{key} {out_dir}: a file, not a folder; give a folder (it is created)"
            )
        # Here, not at the first checkpoint, minutes into training.
        check_writable(out_dir, key, folder=True)
    try:
        # every run checked before the first starts
        train_runs(runs, settings, source, args.stop_at_step, tracking_options)
    except Preempted as stop:
        log.warning("%s; rerun to resume", stop)
        return PREEMPTED_EXIT
    return 0
