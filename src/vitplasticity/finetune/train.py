"""The entry point: the runs of one job (one, or a packed job's several) checked once, then
each trained from its start (or its checkpoint) to its outputs."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from vitplasticity.finetune import finished
from vitplasticity.finetune.checkpoint import CHECKPOINT_NAME, remove_checkpoint
from vitplasticity.finetune.identity import FinetuneSettings, check_runs, tracked_job
from vitplasticity.finetune.loop import train_steps
from vitplasticity.finetune.outputs import summary, write_outputs
from vitplasticity.finetune.resumable import ResumableState
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.rungs import rung_record, write_rung_record
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.setup import ImageSource, RunSource
from vitplasticity.utils.folder_lock import FolderBusy, hold_folder
from vitplasticity.utils.io import remove_stale_temporaries
from vitplasticity.utils.tracking import TrackingOptions, tracking

log = logging.getLogger(__name__)


class RunsRefused(RuntimeError):
    """Runs of the job were left alone: another process holds their folders (the others were
    done)."""


def train_runs(
    runs: Sequence[tuple[Run, str | Path]],
    training: TrainingSettings,
    source: RunSource | str | os.PathLike[str],
    stop_at: int | None = None,
    tracking_options: TrackingOptions | None = None,
) -> list[dict[str, Any]]:
    """Finetune each ``(run, out_dir)`` in turn with ``training`` on ``source`` (a prepared
    image dataset's folder, or a :class:`~vitplasticity.finetune.setup.RunSource`: a text
    file's :class:`~vitplasticity.finetune.text_run.TextSource`); write metrics.parquet and
    summary.json into each ``out_dir``.

    Every run, the settings, the data and the device are checked once, before the first
    run starts. Each run's folder is locked while it is worked on
    (:func:`vitplasticity.utils.folder_lock.hold_folder`); a run whose folder another process
    holds is skipped, and the others are done. A run resumes from ``out_dir/checkpoint.pt``
    when one written with the same settings exists. Each finished run keeps a verified copy of
    its outputs in its folder, and a run whose copy matches is put back instead of trained
    (:mod:`vitplasticity.finetune.finished`): the finished runs of an interrupted pack or
    group job, whose outputs Snakemake deleted, are not trained again.

    With ``stop_at`` (a rung of successive halving), each run stops after that step under
    the schedule of its full ``training.steps``, writes its checkpoint and its
    ``rung_step<stop_at>.json`` (:mod:`vitplasticity.finetune.rungs`); a run that ends
    (diverges, or ``stop_at`` >= steps) before writes its outputs as well as the record.

    With ``tracking_options``, each run also logs its config, its metrics rows and its
    summary to a tracker run (:mod:`vitplasticity.utils.tracking`), which a resumed run
    continues; a failing tracker is warned about once and changes nothing else.

    Returns:
        The summaries (what each summary.json holds), in the order of ``runs``; a run
        paused at ``stop_at`` gives its rung record instead.

    Raises:
        ValueError: for a bad setting, naming its flag and config key, or a GPU device
            asked for where none is visible.
        FileNotFoundError: when ``source`` is not a prepared dataset (or text file).
        Preempted: when SIGTERM arrived; the checkpoint of the run it stopped is written.
        RunsRefused: after the other runs, naming each run whose folder another process held.
    """
    if isinstance(source, str | os.PathLike):
        source = ImageSource(Path(source))
    check_runs([run for run, _ in runs], training)
    if stop_at is not None and stop_at < 1:
        raise ValueError(f"--stop-at-step: must be >= 1, got {stop_at}")
    device = source.check(training)
    summaries, refused = [], []
    for run, out_dir in runs:
        try:
            with hold_folder(out_dir):
                # A run killed mid-write (SIGKILL) leaves atomic_path's temporary file; this
                # process holds the folder now, so no one else is writing it.
                for stale in remove_stale_temporaries(out_dir):
                    log.info("removed %s, left by a run killed while writing it", stale)
                summaries.append(
                    _finished_run(
                        run, training, device, source, Path(out_dir), stop_at, tracking_options
                    )
                )
        except FolderBusy as busy:
            log.error("%s", busy)
            refused.append(str(busy))
    if refused:
        raise RunsRefused(f"{len(refused)} of {len(runs)} runs not done: " + "; ".join(refused))
    return summaries


def _finished_run(
    run: Run,
    training: TrainingSettings,
    device: torch.device,
    source: RunSource,
    out_dir: Path,
    stop_at: int | None = None,
    tracking_options: TrackingOptions | None = None,
) -> dict[str, Any]:
    """The summary of ``run`` trained into ``out_dir`` (or put back from the copy an earlier
    job of the run kept); the rung record of a run paused at ``stop_at``."""
    settings = FinetuneSettings(run, training)
    key = source.key(settings)
    if finished.restore(out_dir, key):
        log.info("%s: finished by an earlier job, put back from %s", out_dir, finished.KEPT_DIR)
        remove_checkpoint(out_dir / CHECKPOINT_NAME)  # left by a job killed after the copy
        return json.loads((out_dir / "summary.json").read_text())
    context = source.setup(settings, device, out_dir)
    state = ResumableState.resume(context)
    with tracking(tracking_options, tracked_job(settings), state.tracker_runs) as tracker:
        state.tracker = tracker
        outcome = train_steps(context, state, stop_at)
        if stop_at is not None and not outcome.diverged and outcome.final_step < training.steps:
            state.save(context, outcome.final_step)
            record = rung_record(
                state.rows, stop_at, training.steps, "paused", outcome.final_step, context.task
            )
            log.info(
                "%s: paused at step %d (rung), checkpoint written", out_dir, outcome.final_step
            )
            write_rung_record(out_dir, record)
            return record
        run_summary = summary(context, state, outcome)
        write_outputs(context, state, run_summary)
        tracker.log_summary(run_summary)
    # The checkpoint goes only once the copy is recorded: a job killed in between resumes
    # from it instead of training the run from its start.
    finished.keep(out_dir, key)
    remove_checkpoint(context.checkpoint_path)
    if stop_at is not None:
        status = run_summary["status"]
        write_rung_record(
            out_dir,
            rung_record(
                state.rows, stop_at, training.steps, status, outcome.final_step, context.task
            ),
        )
    result = {k: v for k, v in context.task.result_fields(state.best).items() if k != "task"}
    log.info("%s: %s at step %s, %s", out_dir, run_summary["status"], outcome.final_step, result)
    return run_summary


def train(
    run: Run,
    training: TrainingSettings,
    source: RunSource | str | os.PathLike[str],
    out_dir: str | Path,
    stop_at: int | None = None,
    tracking_options: TrackingOptions | None = None,
) -> dict[str, Any]:
    """Finetune one run (:func:`train_runs` of ``[(run, out_dir)]``); return its summary
    (its rung record when paused at ``stop_at``).

    Raises:
        ValueError, FileNotFoundError, Preempted, RunsRefused: as :func:`train_runs`.
    """
    return train_runs([(run, out_dir)], training, source, stop_at, tracking_options)[0]
