"""runs table and selected-LR table against hand-made run directories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.helpers.report_inputs import write_grid, write_run
from vitplasticity.cli import main
from vitplasticity.report.aggregate import collect_runs, select_learning_rates
from vitplasticity.utils.io import read_parquet_metadata

# (lr, seed) -> (val, test) of one cell: val prefers lr 0.01, test prefers lr 0.03.
CELL = {
    (0.01, 0): (0.80, 0.70),
    (0.01, 1): (0.82, 0.72),
    (0.03, 0): (0.78, 0.75),
    (0.03, 1): (0.76, 0.77),
    (0.1, 0): (0.50, 0.40),
}


def _cell(root: Path) -> list[Path]:
    paths = [
        write_run(root, lr=lr, seed=seed, val=val, test=test)
        for (lr, seed), (val, test) in CELL.items()
    ]
    # lr 0.1 seed 1 diverged: excluded from the means, counted.
    paths.append(write_run(root, lr=0.1, seed=1, val=0.9, test=0.9, diverged=True))
    return paths


def test_runs_table_has_one_row_per_run(tmp_path: Path) -> None:
    paths = write_grid(tmp_path, datasets=("a", "b"), configurations=("mha", "head"))
    runs = collect_runs(paths)
    assert runs.height == 2 * 2 * 2 * 2
    for column in (
        "experiment",
        "model",
        "dataset",
        "configuration",
        "optimizer",
        "lr",
        "seed",
        "best_val_accuracy",
        "test_accuracy",
        "diverged",
        "trainable_parameters",
        "wall_seconds",
    ):
        assert column in runs.columns
    summary = json.loads(paths[3].read_text())
    row = runs.filter(
        (pl.col("dataset") == summary["dataset"])
        & (pl.col("configuration") == summary["configuration"])
        & (pl.col("lr") == summary["lr"])
        & (pl.col("seed") == summary["seed"])
    ).row(0, named=True)
    assert row["test_accuracy"] == summary["test_accuracy"]
    assert row["wall_seconds"] == summary["wall_seconds"]


@pytest.mark.parametrize(("selection", "lr"), [("val", 0.01), ("test", 0.03)])
def test_selection_and_seed_statistics(tmp_path: Path, selection: str, lr: float) -> None:
    runs = collect_runs(_cell(tmp_path))
    diverged = runs.filter(pl.col("diverged"))
    assert diverged.height == 1 and diverged["test_accuracy"][0] is None
    row = select_learning_rates(runs, selection).row(0, named=True)
    tests = np.array([CELL[(lr, s)][1] for s in (0, 1)])
    vals = np.array([CELL[(lr, s)][0] for s in (0, 1)])
    assert row["lr"] == lr
    assert row["test_accuracy_mean"] == pytest.approx(tests.mean(), abs=1e-12)
    assert row["test_accuracy_std"] == pytest.approx(tests.std(ddof=1), abs=1e-12)
    assert row["val_accuracy_mean"] == pytest.approx(vals.mean(), abs=1e-12)
    assert (row["n_seeds"], row["n_diverged"]) == (2, 0)
    assert (row["n_runs"], row["n_diverged_total"], row["n_lrs"]) == (6, 1, 3)
    # Sensitivity: max - min seed-mean test accuracy over LRs (lr 0.1: its finished seed only).
    means = [0.71, 0.76, 0.40]
    assert row["lr_sensitivity"] == pytest.approx(max(means) - min(means), abs=1e-12)
    assert row["lr_selection"] == selection


def test_one_seed_gives_null_std_and_ties_go_to_the_smaller_lr(tmp_path: Path) -> None:
    paths = [
        write_run(tmp_path, lr=lr, seed=0, val=0.6, test=t) for lr, t in ((0.03, 0.5), (0.01, 0.4))
    ]
    row = select_learning_rates(collect_runs(paths)).row(0, named=True)
    assert row["lr"] == 0.01 and row["test_accuracy_mean"] == pytest.approx(0.4)
    assert row["test_accuracy_std"] is None


def test_an_lr_whose_runs_all_diverged_is_never_selected(tmp_path: Path) -> None:
    paths = [
        write_run(tmp_path, lr=0.1, seed=0, val=None, test=None, diverged=True),
        write_run(tmp_path, lr=0.01, seed=0, val=0.2, test=0.3),
    ]
    row = select_learning_rates(collect_runs(paths)).row(0, named=True)
    assert row["lr"] == 0.01 and row["lr_sensitivity"] is None
    only = select_learning_rates(collect_runs(paths[:1])).row(0, named=True)
    assert only["lr"] is None and only["test_accuracy_mean"] is None


def test_bad_summaries_are_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "summary.json"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        collect_runs([missing])
    path = write_run(tmp_path)
    summary = json.loads(path.read_text())
    del summary["test_accuracy"]
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"summary.json: summary misses key\(s\) test_accuracy"):
        collect_runs([path])
    summary["test_accuracy"] = 91.0  # a percentage, not a fraction
    path.write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"test_accuracy=91\.0"):
        collect_runs([path])
    with pytest.raises(ValueError, match="lr_selection"):
        select_learning_rates(collect_runs(_cell(tmp_path / "c")), "best")


def test_cli_aggregate_and_concat(tmp_path: Path) -> None:
    sgd = write_grid(tmp_path, datasets=("a",), configurations=("mha",), demo=True)
    adam = write_grid(
        tmp_path,
        experiment="adam",
        optimizer="adamw",
        datasets=("a",),
        configurations=("mha", "fc1"),
    )
    out = tmp_path / "out"
    for name, paths in (("sgd", sgd), ("adam", adam)):
        assert (
            main(
                [
                    "aggregate",
                    "--experiment",
                    name,
                    "--summaries",
                    *map(str, paths),
                    "--runs-out",
                    str(out / f"{name}_runs.parquet"),
                    "--selected-out",
                    str(out / f"{name}_selected.parquet"),
                ]
            )
            == 0
        )
    assert read_parquet_metadata(out / "sgd_selected.parquet")["demo"] is True
    assert read_parquet_metadata(out / "adam_selected.parquet")["demo"] is False
    assert (
        main(
            [
                "concat",
                "--inputs",
                str(out / "sgd_runs.parquet"),
                str(out / "adam_runs.parquet"),
                "--out",
                str(out / "runs.parquet"),
            ]
        )
        == 0
    )
    runs = pl.read_parquet(out / "runs.parquet")
    assert runs.height == len(sgd) + len(adam)
    assert read_parquet_metadata(out / "runs.parquet")["demo"] is True
    # A summary of another experiment is refused, naming it.
    assert (
        main(
            [
                "aggregate",
                "--experiment",
                "sgd",
                "--summaries",
                str(adam[0]),
                "--runs-out",
                str(out / "x.parquet"),
                "--selected-out",
                str(out / "y.parquet"),
            ]
        )
        == 2
    )
