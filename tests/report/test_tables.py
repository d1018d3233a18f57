"""LaTeX tables: the numbers printed equal the Parquet values; every table compiles."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.helpers.latex import compile_tables, needs_latex
from tests.helpers.report_inputs import plasticity_summary, write_grid, write_run
from vitplasticity.report.accuracy_table import accuracy_table
from vitplasticity.report.aggregate import collect_runs, select_learning_rates
from vitplasticity.report.stats import compare_selected
from vitplasticity.report.style import DEMO_NOTE
from vitplasticity.report.table_format import escape, parameter_count
from vitplasticity.report.tables import plasticity_table, wilcoxon_table

LABELS = {
    "Full": "full",
    "Emb": "emb",
    "LN1": "ln1",
    "MHA": "mha",
    "LN2": "ln2",
    "FC1": "fc1",
    "FC2": "fc2",
    "LP": "head",
}


def _rows(tex: str) -> list[list[str]]:
    """The cells of each tabular row between \\toprule and \\bottomrule."""
    body = tex.split(r"\toprule", 1)[1].split(r"\bottomrule", 1)[0]
    return [
        [cell.strip() for cell in line.rstrip("\\ ").split(" & ")]
        for line in body.splitlines()
        if line.endswith(r"\\")
    ]


def _accuracy(cell: str) -> tuple[float | None, float | None, bool]:
    """(mean, std, bold) of an accuracy cell like \\textbf{90.8}\\textsubscript{$\\pm$0.3}."""
    match = re.fullmatch(r"(\\textbf\{)?([\d.]+)\}?\\textsubscript\{\$\\pm\$([\d.]+|--)\}", cell)
    assert match, cell
    std = None if match.group(3) == "--" else float(match.group(3))
    return float(match.group(2)), std, match.group(1) is not None


def _number(cell: str) -> float:
    return float(cell.replace("$", "").replace(r"\textbf{", "").replace("}", ""))


@pytest.fixture(scope="module")
def selected(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    root = tmp_path_factory.mktemp("runs")
    paths = write_grid(root, datasets=("c10c-gaussian_noise", "pet", "flowers102"), rng_seed=3)
    # pet/fc2: a single finished seed at every LR -> std printed as "--".
    paths = [p for p in paths if not ("pet/fc2" in str(p) and "seed1" in str(p))]
    return select_learning_rates(collect_runs(paths), "val")


def test_accuracy_table_prints_the_parquet_values(selected: pl.DataFrame) -> None:
    tex = accuracy_table(selected)
    rows = _rows(tex)
    header = rows[0]
    columns = [LABELS[name] for name in header[1:]]
    assert columns == ["full", "ln1", "mha", "ln2", "fc1", "fc2", "head"]  # LP last
    datasets = selected["dataset"].unique(maintain_order=True).to_list()
    for row, dataset in zip(rows[1:], datasets, strict=False):
        assert row[0] == escape(dataset)
        printed = {}
        for name, cell in zip(columns, row[1:], strict=True):
            mean, std, bold = _accuracy(cell)
            expected = selected.filter(
                (pl.col("dataset") == dataset) & (pl.col("configuration") == name)
            ).row(0, named=True)
            assert mean == round(100 * expected["test_accuracy_mean"], 1)
            if expected["test_accuracy_std"] is None:
                assert std is None
            else:
                assert std == round(100 * expected["test_accuracy_std"], 1)
            printed[name] = (mean, bold)
        finetuned = {k: v for k, v in printed.items() if k != "head"}
        best = max(mean for mean, _ in finetuned.values())
        assert {k for k, (m, b) in finetuned.items() if b} == {
            k for k, (m, _) in finetuned.items() if m == best
        }
        assert not printed["head"][1]
    average = next(r for r in rows if r[0] == "Average")
    gain = next(r for r in rows if r[0].startswith("Gain over LP"))
    means = {
        c: selected.filter(pl.col("configuration") == c)["test_accuracy_mean"].mean()
        for c in columns
    }
    for name, cell, gain_cell in zip(columns, average[1:], gain[1:], strict=True):
        assert _number(cell) == round(100 * means[name], 1)
        if name == "head":
            assert gain_cell == "--"
        else:
            expected = 100 * (means[name] - means["head"]) / means["head"]
            assert _number(gain_cell) == round(expected, 1)
    params = next(r for r in rows if r[0] == "Trainable params")
    for name, cell in zip(columns, params[1:], strict=True):
        counts = selected.filter(pl.col("configuration") == name)["trainable_parameters"]
        expected = {parameter_count(counts.min()), parameter_count(counts.max())}
        assert set(cell.split("--")) == expected, (name, cell)


def test_parameter_counts_read_as_in_the_paper() -> None:
    assert [parameter_count(n) for n in (292, 28_436, 85_800_000)] == ["292", "28.4K", "85.8M"]


def test_wilcoxon_table_prints_the_parquet_values(selected: pl.DataFrame) -> None:
    comparison = compare_selected(selected)
    rows = _rows(wilcoxon_table(comparison, experiment="sgd"))[1:]
    assert len(rows) == comparison.height
    for row, expected in zip(rows, comparison.iter_rows(named=True), strict=True):
        assert LABELS[row[0]] == expected["component"]
        assert int(row[1]) == expected["n_datasets"] == 3
        assert _number(row[2]) == round(100 * expected["mean_diff"], 2)
        assert float(row[3]) == round(expected["wilcoxon_stat"], 1)
        assert float(row[4]) == pytest.approx(expected["wilcoxon_p"], abs=5e-4)
        assert _number(row[5]) == round(expected["ttest_stat"], 2)
        assert float(row[6]) == pytest.approx(expected["ttest_p"], rel=5e-2, abs=5e-4)
        assert row[7] == ("yes" if expected["significant"] else "no")


def test_plasticity_table_pools_pairs_and_ranks() -> None:
    summaries = pl.concat(
        [
            plasticity_summary(dataset=d, n_pairs=n, rng_seed=i)
            for i, (d, n) in enumerate((("a", 64), ("b", 32)))
        ]
    )
    rows = _rows(plasticity_table(summaries))
    components = [LABELS[c] for c in rows[0][1:]]
    cells = rows[1][1:]
    means = {}
    for component, cell in zip(components, cells, strict=True):
        rows_c = summaries.filter(pl.col("component") == component)
        w = rows_c["n_pairs"].to_numpy().astype(np.float64)
        expected = float(np.sum(rows_c["mean"].to_numpy() * w) / np.sum(w))
        value, rank = re.fullmatch(r"([\d.]+) \((\d)\)", cell).groups()
        assert float(value) == round(expected, 3)
        means[component] = (expected, int(rank))
    order = sorted(means, key=lambda c: -means[c][0])
    assert [means[c][1] for c in order] == [1, 2, 3, 4, 5]


def test_demo_tables_say_so(selected: pl.DataFrame) -> None:
    for tex in (
        accuracy_table(selected, demo=True),
        wilcoxon_table(compare_selected(selected), demo=True),
    ):
        assert tex.startswith(f"% {DEMO_NOTE}")
        caption = next(line for line in tex.splitlines() if line.startswith(r"\caption"))
        assert "DEMO" in caption
    assert "DEMO" not in accuracy_table(selected)


def test_escape() -> None:
    assert escape("c10c-gaussian_noise & 50%") == r"c10c-gaussian\_noise \& 50\%"


@needs_latex
def test_every_table_compiles(selected: pl.DataFrame, tmp_path: Path) -> None:
    two_models = pl.concat([selected, selected.with_columns(model=pl.lit("vit_huge"))])
    tables = {
        "accuracy": accuracy_table(selected, demo=True),
        "accuracy_models": accuracy_table(two_models),
        "wilcoxon": wilcoxon_table(compare_selected(two_models), experiment="model_size"),
        "plasticity": plasticity_table(
            pl.concat([plasticity_summary(), plasticity_summary(protocols=("in_situ",))]),
            demo=True,
        ),
    }
    compile_tables(tmp_path, tables)


def test_run_writer_is_usable_for_single_runs(tmp_path: Path) -> None:
    # Guards the hand-made inputs themselves: a written run reads back as written.
    path = write_run(tmp_path, dataset="x_y", val=0.25, test=0.5)
    row = collect_runs([path]).row(0, named=True)
    assert (row["dataset"], row["best_val_accuracy"], row["test_accuracy"]) == ("x_y", 0.25, 0.5)
