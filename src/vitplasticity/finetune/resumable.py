"""What a run has done so far (:class:`ResumableState`): its metric rows and best validation
point, saved in a checkpoint and restored from one written with the same settings.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from vitplasticity.data import loader
from vitplasticity.finetune.checkpoint import (
    load_checkpoint,
    restore_run,
    rng_states,
    save_checkpoint,
)
from vitplasticity.finetune.setup import RunContext
from vitplasticity.finetune.tasks import Task
from vitplasticity.utils.tracking import NO_TRACKER, Tracker

log = logging.getLogger(__name__)


@dataclass
class ResumableState:
    """What a run has done so far and what its checkpoint carries to the next process:
    the metric rows, the best validation point, the step it starts from, the wall time
    of the processes before and the tracker runs it logs to."""

    key: str  # fingerprint of the settings the checkpoint must match
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best: dict[str, Any] | None = None
    start_step: int = 0
    wall_before: float = 0.0
    resumed: bool = False
    # Where every recorded row is also logged, and the ids of the tracker runs a checkpoint
    # carries to the next process (neither is part of the run's identity).
    tracker: Tracker = dataclasses.field(default=NO_TRACKER, repr=False)
    tracker_runs: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def resume(cls, context: RunContext) -> ResumableState:
        """The state of a fresh run, or that of the checkpoint in the run's folder when one
        written with the same settings is there: its trained parameters, optimizer state and
        RNG states are restored into ``context``."""
        state = cls(context.key)
        # Loaded on the CPU: RNG states must stay CPU tensors; copy_ and the optimizer's
        # load_state_dict move the rest to the parameters' device.
        saved = load_checkpoint(context.checkpoint_path, state.key)
        if saved is None:
            return state
        restore_run(
            state, saved, context.run_model.trainable, context.optimizer, context.checkpoint_path
        )
        return state

    def record(self, row: dict[str, Any], task: Task) -> None:
        """Add a metrics row; a validation row better on the ``task``'s metric than every
        earlier one becomes the best (so ties keep the earliest); the row goes to the tracker
        too."""
        self.rows.append(row)
        self.tracker.log_row(row)
        if row["kind"] == "val" and task.better(row, self.best):
            self.best = {name: row[name] for name in task.best_fields}

    def save(self, context: RunContext, step: int) -> None:
        """Write the checkpoint of the run after ``step`` steps (atomically)."""
        save_checkpoint(
            context.checkpoint_path,
            {
                "step": step,
                "trainable": {name: p.detach() for name, p in context.run_model.trainable},
                "optimizer": context.optimizer.state_dict(),
                "rng": rng_states(),
                "rows": self.rows,
                "best": self.best,
                "wall_seconds": self.wall_seconds(context),
                "tracker_runs": {**self.tracker_runs, **self.tracker.run_ids()},
                "data_position": loader.loader_position(
                    step, context.settings.training.batch_size, context.inputs.size
                ),
            },
            self.key,
        )

    def wall_seconds(self, context: RunContext) -> float:
        """Wall time of the run so far, over every process that worked on it."""
        return self.wall_before + time.perf_counter() - context.started
