"""The entry point: the runs of one job (one, or a packed job's several) checked once, then
each trained from its start (or its checkpoint) to its outputs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitplasticity.finetune.identity import FinetuneSettings, check_runs
from vitplasticity.finetune.loop import train_steps
from vitplasticity.finetune.outputs import summary, write_outputs
from vitplasticity.finetune.resumable import ResumableState
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.setup import checked_device, setup_run
from vitplasticity.workflow.config import Run

log = logging.getLogger(__name__)


def train_runs(
    runs: Sequence[tuple[Run, str | Path]], training: TrainingSettings, dataset_dir: str | Path
) -> list[dict[str, Any]]:
    """Finetune each ``(run, out_dir)`` in turn with ``training``; write metrics.parquet and
    summary.json into each ``out_dir``.

    Every run, the settings, the dataset and the device are checked once, before the first
    run starts. A run resumes from ``out_dir/checkpoint.pt`` when one written with the same
    settings exists.

    Returns:
        The summaries (what each summary.json holds), in the order of ``runs``.

    Raises:
        ValueError: for a bad setting, naming its flag and config key, or a GPU device
            asked for where none is visible.
        FileNotFoundError: when ``dataset_dir`` is not a prepared dataset.
        Preempted: when SIGTERM arrived; the checkpoint of the run it stopped is written.
    """
    check_runs([run for run, _ in runs], training)
    device = checked_device(training, dataset_dir)
    summaries = []
    for run, out_dir in runs:
        context = setup_run(FinetuneSettings(run, training), device, dataset_dir, out_dir)
        state = ResumableState.resume(context)
        outcome = train_steps(context, state)
        run_summary = summary(context, state, outcome)
        write_outputs(context, state, run_summary)
        log.info(
            "%s: %s at step %s, best val %s (step %s), test %s",
            out_dir,
            run_summary["status"],
            run_summary["final_step"],
            run_summary["best_val_accuracy"],
            run_summary["best_step"],
            run_summary["test_accuracy"],
        )
        summaries.append(run_summary)
    return summaries


def train(
    run: Run, training: TrainingSettings, dataset_dir: str | Path, out_dir: str | Path
) -> dict[str, Any]:
    """Finetune one run (:func:`train_runs` of ``[(run, out_dir)]``); return its summary.

    Raises:
        ValueError, FileNotFoundError, Preempted: as :func:`train_runs`.
    """
    return train_runs([(run, out_dir)], training, dataset_dir)[0]
