"""``finetune-text``: one single-component finetuning run of a text model on a text file (a
causal LM with the next-token loss, an encoder with the masked-LM loss; resumable)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from vitplasticity.commands import PREEMPTED_EXIT
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.text_settings import TextFinetuneSettings
from vitplasticity.settings.declaration import add_settings_arguments, settings_from_args
from vitplasticity.settings.tracking import add_tracking_arguments, tracking_from_args
from vitplasticity.utils.io import check_writable

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``finetune-text`` subcommand."""
    parser = subparsers.add_parser(
        "finetune-text",
        help="finetune one configuration of a text model on a text file (resumable)",
        description="Single-component finetuning of a transformers text model on --text: "
        "a causal LM with the next-token loss, an encoder (its ...ForMaskedLM class) with the "
        "masked-LM loss. The file is cut into sequences of --sequence-length tokens; sequence "
        "i is a validation sequence when floor((i+1) f) > floor(i f), f = --val-fraction. "
        "Trains the named components plus the LM head's own parameters and the final norm; "
        "the result is the lowest validation loss and its perplexity. Writes metrics.parquet "
        "and summary.json into --out-dir; resumes from --out-dir/checkpoint.pt; SIGTERM writes "
        "a checkpoint.",
    )
    run = parser.add_argument_group("the run")
    run.add_argument("--experiment", required=True, help="experiment name (labels the outputs)")
    run.add_argument("--model", required=True, help="model name (config key)")
    run.add_argument("--dataset", required=True, help="text dataset name (config key)")
    run.add_argument("--text", required=True, help="the text file, one document per line")
    run.add_argument(
        "--configuration",
        required=True,
        help="full|emb|ln1|mha|ln2|fc1|fc2|head, or a combination a+b (e.g. mha+fc1)",
    )
    run.add_argument("--lr", required=True, type=float, help="peak learning rate")
    run.add_argument("--seed", required=True, type=int, help="data order, masks, dropout")
    run.add_argument("--out-dir", required=True, help="the run's output folder")
    training = parser.add_argument_group("training (defaults: the config schema's)")
    add_settings_arguments(training, TrainingSettings)
    text = parser.add_argument_group("text (defaults: the config schema's)")
    add_settings_arguments(text, TextFinetuneSettings)
    add_tracking_arguments(parser)
    parser.set_defaults(handler=run_finetune_text)


def run_finetune_text(args: argparse.Namespace) -> int:
    """Train the run (:func:`vitplasticity.finetune.text_run.train_text_run`)."""
    from vitplasticity.finetune.loop import Preempted
    from vitplasticity.finetune.run import Run
    from vitplasticity.finetune.text_run import train_text_run

    training = settings_from_args(TrainingSettings, args)
    text = settings_from_args(TextFinetuneSettings, args)
    tracking_options = tracking_from_args(args)
    run = Run(args.experiment, args.model, args.dataset, args.configuration, args.lr, args.seed)
    if Path(args.out_dir).exists() and not Path(args.out_dir).is_dir():
        raise ValueError(f"--out-dir {args.out_dir}: a file, not a folder; give a folder")
    check_writable(args.out_dir, "--out-dir", folder=True)
    try:
        train_text_run(
            run, training, text, args.text, args.out_dir, tracking_options=tracking_options
        )
    except Preempted as stop:
        log.warning("%s; rerun to resume", stop)
        return PREEMPTED_EXIT
    return 0
