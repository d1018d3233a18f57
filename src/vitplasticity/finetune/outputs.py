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
from vitplasticity.provenance import provenance
from vitplasticity.utils.io import TableKind, write_json, write_parquet

METRICS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "kind": pl.String(),
    "lr": pl.Float64(),
    "train_loss": pl.Float64(),
    "grad_norm": pl.Float64(),
    **{f"grad_norm_{group}": pl.Float64() for group in GROUPS},
    "val_loss": pl.Float64(),
    "val_accuracy": pl.Float64(),
    "test_accuracy": pl.Float64(),
}
"""Columns of metrics.parquet: one row per logged train step and per validation point."""

METRICS_TABLE = TableKind("a run's metrics.parquet (finetune)", METRICS_SCHEMA)


TIMING_FIELDS: tuple[str, ...] = ("steps_per_second", "images_per_second", "wall_seconds")
"""Summary fields that depend on the machine's speed, not on the computation."""


def _metrics_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    columns = {name: [row.get(name) for row in rows] for name in METRICS_SCHEMA}
    return pl.DataFrame(columns, schema=METRICS_SCHEMA)


def summary(context: RunContext, state: ResumableState, outcome: TrainingOutcome) -> dict[str, Any]:
    """What summary.json holds: the run's identity and result (the fields the report
    aggregates), its parameter counts and speed, and the provenance."""
    run, training, best = context.settings.run, context.settings.training, state.best
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
        "best_step": best["step"] if best else None,
        "best_val_accuracy": best["val_accuracy"] if best else None,
        "best_val_loss": best["val_loss"] if best else None,
        "test_accuracy": best["test_accuracy"] if best else None,
        "final_step": outcome.final_step,
        "steps": training.steps,
        "demo": training.demo,
        "trainable_parameters": sum(p.numel() for _, p in context.run_model.trainable),
        "total_parameters": sum(p.numel() for p in context.run_model.model.parameters()),
        "steps_per_second": steps_per_second,
        "images_per_second": steps_per_second * training.batch_size if steps_per_second else None,
        "wall_seconds": state.wall_seconds(context),
        "resumed": state.resumed,
        **provenance({**context.settings.record(), "resolved": context.resolved}, context.device),
    }


def write_outputs(context: RunContext, state: ResumableState, run_summary: dict[str, Any]) -> None:
    """Write metrics.parquet (the summary in its footer) and summary.json (the caller deletes
    the checkpoint once it has kept their copy: :mod:`vitplasticity.finetune.finished`)."""
    write_parquet(
        context.out_dir / "metrics.parquet",
        _metrics_frame(state.rows),
        metadata={"summary": run_summary},
    )
    write_json(context.out_dir / "summary.json", run_summary)
