"""All finetuning runs in one table, and the learning rate each cell selects.

A *cell* is one (model, dataset, configuration) of an experiment; its runs span the LR grid
and the seeds. Conventions (docs/protocol.md, "Aggregation"):

- A diverged run (NaN loss) keeps its row in ``runs`` with ``diverged`` true and null
  accuracies; it is excluded from every mean and std and counted in ``n_diverged``.
- Seed statistics are the mean and the sample std (ddof 1); with one seed the std is null.
- ``lr_selection="val"`` picks the LR with the best seed-mean ``best_val_accuracy`` (the sound
  choice); ``"test"`` picks on seed-mean ``test_accuracy`` (what the reference code does).
  Either way the reported accuracy is the seed-mean/std of ``test_accuracy`` at that LR.
  Ties go to the smaller LR. An LR whose runs all diverged cannot be selected.
- LR sensitivity: max minus min over LRs of the seed-mean test accuracy (LRs with at least one
  finished run); it is null when fewer than two LRs finished.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from vitplasticity.components import parse_configuration
from vitplasticity.utils.io import TableKind, read_json, unreadable

LR_SELECTIONS: tuple[str, ...] = ("val", "test")

# summary.json key -> runs column. Every key must be present in every summary.
_RUN_FIELDS: dict[str, pl.DataType] = {
    "experiment": pl.String(),
    "model": pl.String(),
    "dataset": pl.String(),
    "configuration": pl.String(),
    "optimizer": pl.String(),
    "lr": pl.Float64(),
    "seed": pl.Int64(),
    "status": pl.String(),
    "diverged": pl.Boolean(),
    "best_step": pl.Int64(),
    "best_val_accuracy": pl.Float64(),
    "test_accuracy": pl.Float64(),
    "trainable_parameters": pl.Int64(),
    "total_parameters": pl.Int64(),
    "wall_seconds": pl.Float64(),
}
# Optional keys: absent ones become null.
_OPTIONAL_FIELDS: dict[str, pl.DataType] = {
    "steps_per_second": pl.Float64(),
    "images_per_second": pl.Float64(),
    "demo": pl.Boolean(),
}
RUN_SCHEMA: dict[str, pl.DataType] = {**_RUN_FIELDS, **_OPTIONAL_FIELDS, "summary": pl.String()}
"""Columns of ``runs.parquet`` (``summary``: the path of the run's summary.json)."""

RUNS_TABLE = TableKind("runs tables (aggregate --runs-out)", RUN_SCHEMA)

CELL: tuple[str, ...] = ("experiment", "model", "dataset", "configuration")
"""The columns that identify one selected-LR cell."""


def _accuracy(value: Any, key: str, path: str | os.PathLike[str]) -> float | None:
    if value is None:
        return None
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{path}: {key}={value} is not a fraction in [0, 1]")
    return value


# The Python types a summary.json value of each column's type may have (bool is an int in
# Python, so it is told apart explicitly).
_JSON_TYPES: dict[type[pl.DataType], tuple[tuple[type, ...], str]] = {
    pl.String: ((str,), "a string"),
    pl.Float64: ((int, float), "a number"),
    pl.Int64: ((int,), "an integer"),
    pl.Boolean: ((bool,), "true or false"),
}
# What to do about a summary.json that cannot be used.
_SUMMARY_REMEDY = "it is written by the finetune job: delete it and rerun that run"
# Keys that identify a run: never null.
_IDENTITY = ("experiment", "model", "dataset", "configuration", "optimizer", "lr", "seed")
_ACCURACIES = ("best_val_accuracy", "test_accuracy")


def _check_types(summary: dict[str, Any], path: Path) -> None:
    """Raise UnreadableFileError naming the first key whose value has the wrong type, is not
    a finite number (NaN, Infinity: finetune writes null for what it has not measured, and a
    diverged run's accuracies are dropped whatever they are), or, for ``configuration``, is
    no finetuning configuration."""
    diverged = summary.get("diverged") is True or summary.get("status") == "diverged"
    for key, dtype in {**_RUN_FIELDS, **_OPTIONAL_FIELDS}.items():
        value = summary.get(key)
        if value is None and key not in _IDENTITY:
            continue
        allowed, word = _JSON_TYPES[type(dtype)]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise unreadable(path, f"{key} is {json.dumps(value)}, not {word}", _SUMMARY_REMEDY)
        dropped = diverged and key in _ACCURACIES
        if isinstance(value, float) and not math.isfinite(value) and not dropped:
            raise unreadable(path, f"{key} is {value}, not a finite number", _SUMMARY_REMEDY)
    try:
        parse_configuration(summary["configuration"])
    except ValueError as error:
        raise unreadable(path, f"configuration: {error}", _SUMMARY_REMEDY) from error


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """One run's summary.json as a ``runs`` row.

    Raises:
        FileNotFoundError: if the file is missing.
        UnreadableFileError: if it is not JSON, misses a key or holds a value of the wrong
            type, NaN or Infinity, or an unknown configuration, naming the key and the remedy.
        ValueError: if it holds an accuracy outside [0, 1].
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"finetuning summary not found: {path}")
    remedy = _SUMMARY_REMEDY
    summary = read_json(path, remedy)
    if not isinstance(summary, dict):
        raise unreadable(path, f"expected a JSON object, found {type(summary).__name__}", remedy)
    missing = [key for key in _RUN_FIELDS if key not in summary]
    if missing:
        raise unreadable(path, f"summary misses key(s) {', '.join(missing)}", remedy)
    _check_types(summary, path)
    row = {key: summary.get(key) for key in (*_RUN_FIELDS, *_OPTIONAL_FIELDS)}
    row["diverged"] = bool(row["diverged"]) or row["status"] == "diverged"
    for key in _ACCURACIES:
        # Whatever a run reached before it blew up is not a result: excluded everywhere.
        row[key] = None if row["diverged"] else _accuracy(row[key], key, path)
    row["summary"] = str(path)
    return row


def collect_runs(summaries: Iterable[str | os.PathLike[str]]) -> pl.DataFrame:
    """Every run's summary in one table (one row per run), sorted by cell, LR and seed.

    Raises:
        ValueError: if no summary is given, or two summaries describe the same run.
    """
    rows = [read_summary(path) for path in summaries]
    if not rows:
        raise ValueError("no finetuning summaries given")
    runs = pl.DataFrame(rows, schema=RUN_SCHEMA, orient="row")
    duplicated = runs.filter(pl.struct(*CELL, "lr", "seed").is_duplicated())
    if duplicated.height:
        raise ValueError(
            "several summaries describe the same run: " + ", ".join(duplicated["summary"])
        )
    return runs.sort(*CELL, "lr", "seed")


def concat_runs(tables: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Stack per-experiment ``runs`` tables into one (columns aligned by name)."""
    if not tables:
        raise ValueError("no runs tables given")
    return pl.concat(tables, how="diagonal_relaxed").sort(*CELL, "lr", "seed")


def _seed_stats(runs: pl.DataFrame) -> pl.DataFrame:
    """Per cell and LR: seed counts and the seed mean/std of both accuracies."""
    return runs.group_by(*CELL, "optimizer", "lr").agg(
        n_seeds=pl.len(),
        n_finished=pl.col("diverged").not_().sum(),
        n_diverged=pl.col("diverged").sum(),
        val_accuracy_mean=pl.col("best_val_accuracy").mean(),
        val_accuracy_std=pl.col("best_val_accuracy").std(ddof=1),
        test_accuracy_mean=pl.col("test_accuracy").mean(),
        test_accuracy_std=pl.col("test_accuracy").std(ddof=1),
        trainable_parameters=pl.col("trainable_parameters").first(),
    )


def select_learning_rates(runs: pl.DataFrame, lr_selection: str = "val") -> pl.DataFrame:
    """Per cell, the LR with the best seed-mean accuracy and the test accuracy there.

    Args:
        runs: the table of :func:`collect_runs`.
        lr_selection: ``val`` (pick on validation accuracy) or ``test`` (the reference code).

    Returns:
        One row per (experiment, model, dataset, configuration): ``lr`` (null when every LR
        diverged), ``n_seeds``/``n_diverged`` at that LR, ``n_runs``/``n_diverged_total`` over
        the grid, ``val_accuracy_mean/std``, ``test_accuracy_mean/std``, ``lr_sensitivity``,
        ``n_lrs``, ``trainable_parameters`` and ``lr_selection``.
    """
    if lr_selection not in LR_SELECTIONS:
        raise ValueError(f"lr_selection must be one of {LR_SELECTIONS}, got {lr_selection!r}")
    key = "val_accuracy_mean" if lr_selection == "val" else "test_accuracy_mean"
    per_lr = _seed_stats(runs)
    return (
        _best_lr(per_lr, key)
        .join(_grid_stats(per_lr), on=list(CELL), how="left")
        .with_columns(lr_selection=pl.lit(lr_selection))
        .select(*CELL, *SELECTED_COLUMNS)
        .sort(*CELL)
    )


SELECTED_COLUMNS: tuple[str, ...] = (
    "optimizer",
    "lr_selection",
    "lr",
    "n_seeds",
    "n_diverged",
    "n_lrs",
    "n_runs",
    "n_diverged_total",
    "val_accuracy_mean",
    "val_accuracy_std",
    "test_accuracy_mean",
    "test_accuracy_std",
    "lr_sensitivity",
    "trainable_parameters",
)
"""The columns of :func:`select_learning_rates`' table after the cell's, in order."""

_COUNT = pl.UInt32()  # what polars' len and sum of booleans give
SELECTED_TABLE = TableKind(
    "a selected-LR table (aggregate --selected-out)",
    {
        **dict.fromkeys(CELL, pl.String()),
        "optimizer": pl.String(),
        "lr_selection": pl.String(),
        "lr": pl.Float64(),
        **dict.fromkeys(("n_seeds", "n_diverged", "n_lrs", "n_runs", "n_diverged_total"), _COUNT),
        **dict.fromkeys(
            ("val_accuracy_mean", "val_accuracy_std", "test_accuracy_mean", "test_accuracy_std"),
            pl.Float64(),
        ),
        "lr_sensitivity": pl.Float64(),
        "trainable_parameters": pl.Int64(),
    },
)
"""What :func:`select_learning_rates` gives, written to ``<experiment>_selected.parquet``."""


def _grid_stats(per_lr: pl.DataFrame) -> pl.DataFrame:
    """Per cell, over its LR grid: the LRs, runs and diverged runs, and the LR sensitivity
    (the spread of the seed-mean test accuracy over LRs, when two or more have one)."""
    return per_lr.group_by(*CELL).agg(
        n_lrs=pl.len(),
        n_runs=pl.col("n_seeds").sum(),
        n_diverged_total=pl.col("n_diverged").sum(),
        lr_sensitivity=pl.when(pl.col("test_accuracy_mean").count() >= 2).then(
            pl.col("test_accuracy_mean").max() - pl.col("test_accuracy_mean").min()
        ),
    )


def _best_lr(per_lr: pl.DataFrame, key: str) -> pl.DataFrame:
    """Per cell, the LR row with the best ``key``; its ``lr`` null when no LR has a result."""
    # Best first; the smaller LR wins a tie; LRs without a finished run sort last.
    best = (
        per_lr.sort(
            pl.col(key).is_null(), pl.col(key), pl.col("lr"), descending=[False, True, False]
        )
        .group_by(*CELL, maintain_order=True)
        .first()
    )
    no_result = pl.col(key).is_null()
    return best.with_columns(
        pl.when(no_result).then(None).otherwise(pl.col("lr")).alias("lr"),
    )
