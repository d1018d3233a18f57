"""Every reader of a result table refuses one that is not what its stage wrote: a column of
another type, no rows, or another kind of table, with one error line naming the file, what is
wrong and what it should be (the kind, with the command that writes it); exit 2, no
traceback, nothing written. One row per case: the builder writes real tables (aggregated
from run summaries, or in the writer's schema), damages one, and gives the command reading
it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from tests.helpers.cli_errors import refusal
from tests.helpers.report_inputs import plasticity_summary, write_grid
from vitplasticity import cli
from vitplasticity.plasticity.measure import PAIR_SCHEMA
from vitplasticity.report.aggregate import RUNS_TABLE, SELECTED_TABLE
from vitplasticity.report.stats import COMPARISON_TABLE
from vitplasticity.utils.io import write_parquet


@dataclass(frozen=True)
class Case:
    """A command reading one bad table, and what its error line must say."""

    argv: list[str]
    culprit: Path
    says: str  # what is wrong, and what the file should be
    outputs: Path  # the folder the command writes into: must stay empty


def selected_table(tmp_path: Path, experiment: str = "sgd") -> tuple[Path, Path]:
    """The runs and selected-LR tables aggregated from a small grid of run summaries."""
    root = tmp_path / experiment
    summaries = write_grid(root / "runs", experiment=experiment, optimizer=experiment,
                           datasets=("a", "b"), configurations=("mha", "fc1"), lrs=(0.01,),
                           seeds=(0, 1))  # fmt: skip
    runs, selected = root / "runs.parquet", root / "selected.parquet"
    argv = ["aggregate", "--experiment", experiment, "--summaries", *map(str, summaries)]
    assert cli.main([*argv, "--runs-out", str(runs), "--selected-out", str(selected)]) == 0
    return runs, selected


def emptied(path: Path) -> Path:
    """``path`` rewritten with its columns and no rows."""
    write_parquet(path, pl.read_parquet(path).clear())
    return path


def retyped(path: Path, column: str) -> Path:
    """``path`` rewritten with ``column`` as strings."""
    write_parquet(path, pl.read_parquet(path).with_columns(pl.col(column).cast(pl.String)))
    return path


def figure(kind: str, inputs: list[Path], out: Path) -> list[str]:
    return ["figure", "--kind", kind, "--inputs", *map(str, inputs), "--out", str(out / "f.png")]


def table(kind: str, inputs: list[Path], out: Path) -> list[str]:
    return ["table", "--kind", kind, "--inputs", *map(str, inputs), "--out", str(out / "t.tex"),
            "--csv", str(out / "t.csv")]  # fmt: skip


SELECTED = SELECTED_TABLE.name  # "a selected-LR table (aggregate --selected-out)"
SUMMARY = "plasticity summary files (plasticity --summary)"
NO_ROWS = "no rows: {} has one per result"


def summary_file(tmp_path: Path, **columns: pl.DataType) -> Path:
    path = tmp_path / "vit" / "ds_a_summary.parquet"
    frame = plasticity_summary().with_columns(pl.col(c).cast(t) for c, t in columns.items())
    write_parquet(path, frame)
    return path


def summary_with_a_string_mean_for_the_table(tmp_path: Path) -> Case:
    bad = summary_file(tmp_path, mean=pl.String())
    out = tmp_path / "out"
    return Case(table("plasticity", [bad], out), bad,
                f"not {SUMMARY} (column mean is String, not Float64)", out)  # fmt: skip


def summary_with_a_float_block_for_the_depth_figure(tmp_path: Path) -> Case:
    bad = summary_file(tmp_path, block=pl.Float64())
    out = tmp_path / "out"
    return Case(figure("plasticity-depth", [bad], out), bad,
                f"not {SUMMARY} (column block is Float64, not Int64)", out)  # fmt: skip


def empty_selected_for_the_accuracy_table(tmp_path: Path) -> Case:
    _, selected = selected_table(tmp_path)
    out = tmp_path / "out"
    return Case(table("accuracy", [emptied(selected)], out), selected,
                NO_ROWS.format(SELECTED), out)  # fmt: skip


def empty_selected_for_the_accuracy_figure(tmp_path: Path) -> Case:
    _, selected = selected_table(tmp_path)
    out = tmp_path / "out"
    return Case(figure("accuracy", [emptied(selected)], out), selected,
                NO_ROWS.format(SELECTED), out)  # fmt: skip


def empty_selected_for_the_optimizers_figure(tmp_path: Path) -> Case:
    _, sgd = selected_table(tmp_path, "sgd")
    _, adam = selected_table(tmp_path, "adam")
    out = tmp_path / "out"
    return Case(figure("optimizers", [sgd, emptied(adam)], out), adam,
                NO_ROWS.format(SELECTED), out)  # fmt: skip


def empty_selected_for_the_stats(tmp_path: Path) -> Case:
    _, selected = selected_table(tmp_path)
    out = tmp_path / "out"
    argv = ["stats", "--selected", str(emptied(selected)), "--out", str(out / "w.parquet")]
    return Case(argv, selected, NO_ROWS.format(SELECTED), out)


def selected_with_a_string_accuracy(tmp_path: Path) -> Case:
    _, selected = selected_table(tmp_path)
    out = tmp_path / "out"
    return Case(figure("accuracy", [retyped(selected, "test_accuracy_mean")], out), selected,
                f"not {SELECTED} (column test_accuracy_mean is String, not Float64)",
                out)  # fmt: skip


def runs_with_a_string_diverged(tmp_path: Path) -> Case:
    runs, _ = selected_table(tmp_path)
    out = tmp_path / "out"
    return Case(figure("robustness", [retyped(runs, "diverged")], out), runs,
                f"not {RUNS_TABLE.name} (column diverged is String, not Boolean)",
                out)  # fmt: skip


def comparison_with_a_string_p_value(tmp_path: Path) -> Case:
    _, selected = selected_table(tmp_path)
    comparison = tmp_path / "wilcoxon.parquet"
    argv = ["stats", "--selected", str(selected), "--reference", "mha"]
    assert cli.main([*argv, "--out", str(comparison)]) == 0
    out = tmp_path / "out"
    return Case(table("wilcoxon", [retyped(comparison, "wilcoxon_p")], out), comparison,
                f"not {COMPARISON_TABLE.name} (column wilcoxon_p is String, not Float64)",
                out)  # fmt: skip


def bounds_table(tmp_path: Path) -> Path:
    path = tmp_path / "bounds" / "vit.parquet"
    rows = {"model": ["vit"], "block": [0], "component": ["mha"], "bound": [2.0],
            "measured_mean": [1.0], "measured_max": [1.5]}  # fmt: skip
    write_parquet(path, pl.DataFrame(rows))
    return path


def empty_bounds_table_for_its_figure(tmp_path: Path) -> Case:
    bounds = emptied(bounds_table(tmp_path))
    out = tmp_path / "out"
    return Case(figure("bounds", [bounds], out), bounds,
                NO_ROWS.format("a bounds table (bounds --out)"), out)  # fmt: skip


def metrics_replaced_by_another_table(tmp_path: Path) -> Case:
    runs, selected = selected_table(tmp_path)
    metrics = [Path(p).with_name("metrics.parquet") for p in pl.read_parquet(runs)["summary"]]
    metrics[1].write_bytes(selected.read_bytes())
    out = tmp_path / "out"
    return Case(figure("curves", metrics, out), metrics[1],
                "not a run's metrics.parquet (finetune) (no column(s) step, kind, grad_norm,"
                " val_loss)", out)  # fmt: skip


FIGURE_AND_TABLE_CASES: list[Callable[[Path], Case]] = [
    summary_with_a_string_mean_for_the_table,
    summary_with_a_float_block_for_the_depth_figure,
    empty_selected_for_the_accuracy_table,
    empty_selected_for_the_accuracy_figure,
    empty_selected_for_the_optimizers_figure,
    empty_selected_for_the_stats,
    selected_with_a_string_accuracy,
    runs_with_a_string_diverged,
    comparison_with_a_string_p_value,
    empty_bounds_table_for_its_figure,
    metrics_replaced_by_another_table,
]


# The bounds stage reads the plasticity stage's pairs files before it builds the model.
PAIRS = "a plasticity pairs file (plasticity --out)"


def pairs_frame() -> pl.DataFrame:
    rows = [{"protocol": "embedding", "block": b, "component": c, "pair": p, "ratio": 1.0 + p,
             "numerator": 1.0 + p, "denominator": 1.0}
            for b in range(3) for c in ("ln1", "mha") for p in range(2)]  # fmt: skip
    return pl.DataFrame(rows, schema=PAIR_SCHEMA)


def pairs_with_a_string_ratio(tmp_path: Path) -> Path:
    path = tmp_path / "demo.parquet"
    write_parquet(path, pairs_frame().with_columns(pl.col("ratio").cast(pl.String)))
    return path


def pairs_without_rows(tmp_path: Path) -> Path:
    path = tmp_path / "demo.parquet"
    write_parquet(path, pairs_frame().clear())
    return path


PAIRS_CASES: list[tuple[Callable[[Path], Path], str]] = [
    (pairs_with_a_string_ratio, f"not {PAIRS} (column ratio is String, not Float64)"),
    (pairs_without_rows, NO_ROWS.format(PAIRS)),
]


def bounds_case(tmp_path: Path, pairs: Path, says: str, store: Path, spec: str) -> Case:
    out = tmp_path / "out"
    argv = ["bounds", "--model", "tiny", "--model-spec", spec,
            "--reference", str(store / "test.parquet"), "--n-images", "4", "--batch-size", "4",
            "--device", "cpu", "--out", str(out / "bounds.parquet"),
            "--plasticity", str(pairs)]  # fmt: skip
    return Case(argv, pairs, says, out)


def assert_refused(case: Case, caplog: pytest.LogCaptureFixture) -> None:
    """Exit 2 with one ERROR line (no traceback) naming the file and what is wrong; nothing
    written."""
    message = refusal(case.argv, caplog, case.outputs)
    assert message.startswith(f"{case.culprit}: "), message
    assert case.says in message, message


@pytest.mark.parametrize(
    "build", FIGURE_AND_TABLE_CASES, ids=[b.__name__ for b in FIGURE_AND_TABLE_CASES]
)
def test_a_report_command_refuses_a_bad_table(build, tmp_path, caplog):
    assert_refused(build(tmp_path), caplog)


@pytest.mark.parametrize(("build", "says"), PAIRS_CASES, ids=[b.__name__ for b, _ in PAIRS_CASES])
def test_the_bounds_stage_refuses_a_bad_pairs_file(
    build, says, tmp_path, caplog, demo_dataset, tiny_spec
):
    spec = json.dumps({"timm_id": tiny_spec.timm_id, "weights": "random",
                       "kwargs": tiny_spec.kwargs})  # fmt: skip
    case = bounds_case(tmp_path, build(tmp_path), says, demo_dataset, spec)
    assert_refused(case, caplog)
