"""The entry point: one run trained from start (or checkpoint) to its outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitplasticity.config import Run
from vitplasticity.finetune.checkpointing import ResumableState
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.loop import train_steps
from vitplasticity.finetune.outputs import summary, write_outputs
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.setup import setup_run


def train(
    run: Run, settings: TrainingSettings, dataset_dir: str | Path, out_dir: str | Path
) -> dict[str, Any]:
    """Finetune ``run`` with ``settings``; write metrics.parquet and summary.json into ``out_dir``.

    Resumes from ``out_dir/checkpoint.pt`` when one written with the same settings exists.

    Returns:
        The summary (what summary.json holds).

    Raises:
        ValueError: for a bad setting, naming its flag and config key.
        FileNotFoundError: when ``dataset_dir`` is not a prepared dataset.
        Preempted: when SIGTERM arrived; the checkpoint is written first.
    """
    context = setup_run(FinetuneSettings.of(run, settings), dataset_dir, out_dir)
    state = ResumableState.resume(context)
    outcome = train_steps(context, state)
    run_summary = summary(context, state, outcome)
    write_outputs(context, state, run_summary)
    return run_summary


def run(settings: FinetuneSettings, dataset_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """:func:`train` for a run given as one :class:`FinetuneSettings` (identity + settings)."""
    return train(settings.identity, settings.training, dataset_dir, out_dir)
