"""What a finished run leaves: metrics.parquet (one row per logged step and per validation
point) and summary.json (identity, result, parameter counts, speed, provenance).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from vitplasticity.finetune.gradients import GROUPS
from vitplasticity.finetune.loop import TrainingOutcome
from vitplasticity.finetune.resumable import ResumableState
from vitplasticity.finetune.setup import RunContext
from vitplasticity.finetune.tasks import CLASSIFICATION, Task
from vitplasticity.provenance import provenance
from vitplasticity.utils.io import TableKind, write_json, write_parquet

TRAIN_COLUMNS: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "kind": pl.String(),
    "lr": pl.Float64(),
    "train_loss": pl.Float64(),
    "grad_norm": pl.Float64(),
    **{f"grad_norm_{group}": pl.Float64() for group in GROUPS},
}
"""The columns of metrics.parquet every task has; its validation columns follow
(:attr:`Task.metric_columns`)."""


def metrics_schema(task: Task) -> dict[str, pl.DataType]:
    """Columns of a run's metrics.parquet: one row per logged train step and per validation
    point."""
    return {**TRAIN_COLUMNS, **task.metric_columns}


METRICS_SCHEMA = metrics_schema(CLASSIFICATION)
"""Columns of an image run's metrics.parquet."""

METRICS_TABLE = TableKind("a run's metrics.parquet (finetune)", METRICS_SCHEMA)


TIMING_FIELDS: tuple[str, ...] = ("steps_per_second", "images_per_second", "wall_seconds")
"""Summary fields of an image run that depend on the machine's speed, not on the computation
(a text run has ``sequences_per_second`` in place of ``images_per_second``)."""


def _metrics_frame(rows: list[dict[str, Any]], task: Task) -> pl.DataFrame:
    schema = metrics_schema(task)
    columns = {name: [row.get(name) for row in rows] for name in schema}
    return pl.DataFrame(columns, schema=schema)


def summary(context: RunContext, state: ResumableState, outcome: TrainingOutcome) -> dict[str, Any]:
    """What summary.json holds: the run's identity and result (the fields the report
    aggregates), its parameter counts and speed, and the provenance."""
    run, training, task = context.settings.run, context.settings.training, context.task
    done = outcome.final_step - state.start_step
    steps_per_second = done / outcome.train_seconds if outcome.train_seconds > 0 else None
    return {
        "experiment": run.experiment,
        "model": run.model,
        "dataset": run.dataset,
        "configuration": run.configuration,
        "optimizer": training.optimizer,
        "lr": float(run.lr),
        "seed": int(run.seed),
        "status": "diverged" if outcome.diverged else "completed",
        "diverged": outcome.diverged,
        **task.result_fields(state.best),
        "final_step": outcome.final_step,
        "steps": training.steps,
        "demo": training.demo,
        "trainable_parameters": sum(p.numel() for _, p in context.run_model.trainable),
        "total_parameters": sum(p.numel() for p in context.run_model.model.parameters()),
        "steps_per_second": steps_per_second,
        task.samples_field: steps_per_second * training.batch_size if steps_per_second else None,
        "wall_seconds": state.wall_seconds(context),
        "resumed": state.resumed,
        **provenance({**context.record, "resolved": context.resolved}, context.device),
    }


def write_outputs(context: RunContext, state: ResumableState, run_summary: dict[str, Any]) -> None:
    """Write metrics.parquet (the summary in its footer) and summary.json (the caller deletes
    the checkpoint once it has kept their copy: :mod:`vitplasticity.finetune.finished`)."""
    write_parquet(
        context.out_dir / "metrics.parquet",
        _metrics_frame(state.rows, context.task),
        metadata={"summary": run_summary},
    )
    write_json(context.out_dir / "summary.json", run_summary)
