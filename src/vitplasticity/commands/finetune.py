"""``finetune``: one single-component finetuning run (one job of the workflow's grid)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from typing import TYPE_CHECKING

from vitplasticity.commands import json_argument

if TYPE_CHECKING:
    from vitplasticity.finetune import TrainingSettings

log = logging.getLogger(__name__)

# Exit status of a run stopped by SIGTERM after writing its checkpoint (128 + SIGTERM):
# the scheduler sees a failed job and reruns it, which resumes.
PREEMPTED_EXIT = 143


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``finetune`` subcommand."""
    parser = subparsers.add_parser(
        "finetune",
        help="finetune one configuration of a ViT on one prepared dataset (resumable)",
        description="Single-component finetuning (arXiv 2602.06883): train the named "
        "components plus the new head and final norm; write metrics.parquet and summary.json "
        "into --out-dir. Resumes from --out-dir/checkpoint.pt; SIGTERM writes a checkpoint.",
    )
    run = parser.add_argument_group("the run")
    run.add_argument("--experiment", required=True, help="experiment name (labels the outputs)")
    run.add_argument("--model", required=True, help="model name (config key)")
    run.add_argument("--dataset", required=True, help="dataset name (config key)")
    run.add_argument(
        "--model-spec", required=True, type=json_argument, help="the model's config entry, as JSON"
    )
    run.add_argument("--dataset-dir", required=True, help="the prepared dataset folder")
    run.add_argument(
        "--configuration",
        help="full|emb|ln1|mha|ln2|fc1|fc2|head|lora, or a combination a+b (e.g. mha+fc1)",
    )
    run.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
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
    run.add_argument("--demo", action="store_true", help="label the outputs as a demo")

    training = parser.add_argument_group("training (PROTOCOL.md defaults)")
    training.add_argument("--steps", type=int, required=True, help="optimizer steps")
    training.add_argument("--val-every", type=int, required=True, help="validation period")
    training.add_argument("--batch-size", type=int, default=512, help="images per step")
    training.add_argument(
        "--micro-batch-size", type=int, default=512, help="images per forward pass"
    )
    training.add_argument("--warmup-steps", type=int, default=2000)
    training.add_argument("--clip-grad-norm", type=float, default=1.0)
    training.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    training.add_argument(
        "--adam-betas", type=float, nargs=2, default=[0.9, 0.999], metavar=("B1", "B2")
    )
    training.add_argument("--val-fraction", type=float, default=0.2, help="pool share for val")
    training.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    training.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    training.add_argument("--num-workers", type=int, default=0, help="data worker processes")
    training.add_argument(
        "--augment",
        choices=["auto", "cpu", "device"],
        default="auto",
        help="where train crops/flips run: auto (on the GPU when the run is on one) | cpu | device",
    )
    training.add_argument(
        "--compile",
        type=_boolean,
        default=False,
        metavar="{true,false}",
        help="torch.compile the model (GPU throughput)",
    )
    training.add_argument("--log-every", type=int, default=50, help="steps between train rows")
    training.add_argument("--checkpoint-every", type=int, default=500)
    training.add_argument(
        "--lora-rank", type=int, default=8, help="LoRA rank r (configuration lora; paper: 8)"
    )
    training.add_argument(
        "--lora-alpha", type=float, default=16.0, help="LoRA alpha (configuration lora; paper: 16)"
    )
    parser.set_defaults(handler=run_finetune)


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return lowered == "true"


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


def _training_settings(args: argparse.Namespace) -> TrainingSettings:
    """The settings every requested run shares (every training flag)."""
    from vitplasticity.finetune import TrainingSettings

    names = [field.name for field in dataclasses.fields(TrainingSettings)]
    values = {name: getattr(args, name) for name in names}
    return TrainingSettings(**{**values, "adam_betas": tuple(args.adam_betas)})


def run_finetune(args: argparse.Namespace) -> int:
    """Train each requested run in turn (``--runs``, or the single-run flags)."""
    from vitplasticity.config import Run
    from vitplasticity.finetune import Preempted, check_identity, train

    settings = _training_settings(args)
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
    for run, _ in runs:  # every run is checked before the first one starts
        check_identity(run)
    settings.validate(args.model)
    for run, out_dir in runs:
        try:
            summary = train(run, settings, args.dataset_dir, out_dir)
        except Preempted as stop:
            log.warning("%s; rerun to resume", stop)
            return PREEMPTED_EXIT
        log.info(
            "%s: %s at step %s, best val %s (step %s), test %s",
            out_dir,
            summary["status"],
            summary["final_step"],
            summary["best_val_accuracy"],
            summary["best_step"],
            summary["test_accuracy"],
        )
    return 0
