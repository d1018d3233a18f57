"""A run paused at a rung of successive halving: its record (``rung_step<s>.json``), what a
rung decision reads.

A run asked to stop at step ``s`` (``vitplasticity finetune --stop-at-step s``) trains under
the schedule of its full ``steps``, writes its checkpoint at ``s`` and this record; a later
process without the stop (or with a later one) continues it from the checkpoint, to the same
numbers as a run never paused (tests/finetune/test_rungs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitplasticity.finetune.tasks import Task
from vitplasticity.utils.io import write_json


def rung_record_path(out_dir: str | Path, stop_at: int) -> Path:
    """Where the record of the rung ending at step ``stop_at`` goes in a run's folder."""
    return Path(out_dir) / f"rung_step{stop_at}.json"


def rung_record(
    rows: list[dict[str, Any]], stop_at: int, steps: int, status: str, final_step: int, task: Task
) -> dict[str, Any]:
    """The record of a run at the rung ending at ``stop_at``: its best validation point up
    to that step on the ``task``'s metric (``best_val_accuracy`` for images, ``best_val_loss``
    for text; ties keep the earliest, as the run's own model selection does).

    Args:
        rows: the run's metric rows so far (train and val).
        stop_at: the rung's last step.
        steps: the run's full budget (its schedule's length).
        status: ``paused`` (checkpoint at the rung), ``completed`` or ``diverged``.
        final_step: the last step the run has taken.
        task: what the run learns (its selection metric).
    """
    best: dict[str, Any] | None = None
    for row in rows:
        if row["kind"] != "val" or row["step"] > stop_at:
            continue
        if task.better(row, best):
            best = row
    return {
        "rung_step": stop_at,
        "steps": steps,
        "status": status,
        "final_step": final_step,
        "best_step": best["step"] if best else None,
        f"best_{task.selection}": best[task.selection] if best else None,
    }


def write_rung_record(out_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` (atomically) as the run's ``rung_step<s>.json``; return its path."""
    path = rung_record_path(out_dir, record["rung_step"])
    write_json(path, record)
    return path
