"""The report's browsable outputs: each LaTeX table's CSV twin holds the numbers the .tex
prints; the bounds figure in the house style; commands that never import each other."""

from __future__ import annotations

import ast
import io
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from PIL import Image

from tests.helpers.repo import REPO
from tests.helpers.report_inputs import plasticity_summary, write_grid
from vitplasticity.cli import main
from vitplasticity.components import COMPONENTS
from vitplasticity.report import figures, table_format, tables
from vitplasticity.report.accuracy_table import accuracy_csv, accuracy_table
from vitplasticity.report.aggregate import collect_runs, select_learning_rates
from vitplasticity.report.stats import compare_selected
from vitplasticity.report.style import COMPONENT_COLOURS, DEMO_NOTE, label
from vitplasticity.utils.io import write_parquet

COMMANDS = REPO / "src/vitplasticity/commands"


def _tex_rows(tex: str) -> list[list[str]]:
    """The cells of each tabular row between \\toprule and \\bottomrule."""
    body = tex.split(r"\toprule", 1)[1].split(r"\bottomrule", 1)[0]
    return [
        [cell.strip() for cell in line.rstrip("\\ ").split(" & ")]
        for line in body.splitlines()
        if line.endswith(r"\\") and not line.startswith(r"\multicolumn")
    ]


def _csv(text: str) -> pl.DataFrame:
    return pl.read_csv(io.StringIO(text), comment_prefix="#", infer_schema=False)


@pytest.fixture(scope="module")
def selected(tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    root = tmp_path_factory.mktemp("runs")
    paths = write_grid(root, models=("vit", "vit_l"), datasets=("a_b", "c"), rng_seed=4)
    # One finished seed in one cell: its std is missing ("--" in the .tex, empty in the CSV).
    paths = [p for p in paths if not ("vit/c/fc2" in str(p) and "seed1" in str(p))]
    return select_learning_rates(collect_runs(paths), "val")


def test_accuracy_csv_holds_the_printed_numbers(selected: pl.DataFrame) -> None:
    tex_rows = _tex_rows(accuracy_table(selected))
    csv = _csv(accuracy_csv(selected))
    header = tex_rows[0][1:]
    assert csv.columns == [
        "Model",
        "Dataset",
        *[name for column in header for name in (column, f"{column} std")],
        "Best",
    ]
    assert len(tex_rows) - 1 == csv.height  # every row, each model's block in turn
    for cells, row in zip(tex_rows[1:], csv.iter_rows(named=True), strict=True):
        assert cells[0] == table_format.escape(row["Dataset"])
        bold = set()
        for column, cell in zip(header, cells[1:], strict=True):
            value, std = row[column], row[f"{column} std"]
            if cell == table_format.MISSING:
                assert value is None and std is None
                continue
            match = re.fullmatch(r"(\\textbf\{)?(.+?)\}?(\\textsubscript\{\$\\pm\$(.+)\})?", cell)
            assert match, cell
            printed = match.group(2).replace("$", "").replace("--", "-")
            assert value == printed, (row["Dataset"], column)
            if match.group(1):
                bold.add(column)
            if match.group(4) is not None:
                assert std == (None if match.group(4) == table_format.MISSING else match.group(4))
        assert set((row["Best"] or "").split("; ")) - {""} == bold
    # The missing std, and the models of the two blocks.
    assert csv.filter(pl.col("Model") == "vit", pl.col("Dataset") == "c")["FC2 std"][0] is None
    assert csv["Model"].unique(maintain_order=True).to_list() == ["vit", "vit_l"]


def test_wilcoxon_csv_holds_the_printed_numbers(selected: pl.DataFrame) -> None:
    comparison = compare_selected(selected.filter(pl.col("model") == "vit"))
    tex_rows = _tex_rows(tables.wilcoxon_table(comparison, experiment="sgd"))[1:]
    csv = _csv(tables.wilcoxon_csv(comparison))
    assert csv.columns == ["Model", "vs.", "n", "Delta (pp)", "W", "p_W", "t", "p_t", "Sig."]
    assert len(tex_rows) == csv.height == comparison.height
    for cells, row in zip(tex_rows, csv.iter_rows(named=True), strict=True):
        plain = [None if c == table_format.MISSING else c.replace("$", "") for c in cells]
        assert plain == list(row.values())[1:]
        assert row["Model"] == "vit"


def test_plasticity_csv_holds_the_printed_means_and_ranks() -> None:
    summaries = pl.concat(
        [plasticity_summary(dataset="a"), plasticity_summary(protocols=("in_situ",))]
    )
    tex_rows = _tex_rows(tables.plasticity_table(summaries))
    csv = _csv(tables.plasticity_csv(summaries))
    labels = tex_rows[0][2:]  # Model, Protocol, then the components
    assert labels == [label(c) for c in COMPONENTS]
    for cells, row in zip(tex_rows[1:], csv.iter_rows(named=True), strict=True):
        assert cells[:2] == [row["Model"], row["Protocol"].replace("_", r"\_")]
        for name, cell in zip(labels, cells[2:], strict=True):
            assert cell == f"{row[name]} ({row[f'{name} rank']})"


def test_demo_csv_says_so_and_the_cli_writes_both(selected: pl.DataFrame, tmp_path: Path) -> None:
    assert accuracy_csv(selected, demo=True).startswith(f"# {DEMO_NOTE}\n")
    assert "DEMO" not in accuracy_csv(selected)
    source = tmp_path / "sgd_selected.parquet"
    write_parquet(source, selected, {"demo": True})
    tex, csv = tmp_path / "t.tex", tmp_path / "t.csv"
    argv = ["table", "--kind", "accuracy", "--inputs", str(source), "--out", str(tex)]
    assert main([*argv, "--csv", str(csv)]) == 0
    assert tex.read_text() == accuracy_table(selected, demo=True)
    assert csv.read_text() == accuracy_csv(selected, demo=True)


# -- the bounds figure -----------------------------------------------------------------------


def _bounds_table(blocks: int = 4) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    scale = {"ln1": 40.0, "mha": 1.0, "ln2": 40.0, "fc1": 0.4, "fc2": 0.4}
    rows = [
        {
            "model": "vit",
            "block": b,
            "component": c,
            "bound": scale[c] * (1 + 0.1 * rng.random()),
            "measured_mean": scale[c] * (0.01 if c == "mha" else 0.5) * (1 + 0.1 * rng.random()),
        }
        for b in range(blocks)
        for c in COMPONENTS
    ]
    return pl.DataFrame(rows)


def test_bounds_figure_in_the_house_style(tmp_path: Path) -> None:
    table = tmp_path / "vit.parquet"
    write_parquet(table, _bounds_table(), {"demo": True, "model": "vit"})
    outputs = [tmp_path / f"bounds_vit.{fmt}" for fmt in ("pdf", "png", "svg")]
    argv = ["figure", "--kind", "bounds", "--inputs", str(table), "--title", "vit"]
    assert main([*argv, "--dpi", "60", "--out", *map(str, outputs)]) == 0
    assert outputs[0].read_bytes().startswith(b"%PDF")
    with Image.open(outputs[1]) as image:  # one column wide (report.figures.width_in)
        assert abs(image.width - 3.4 * 60) < 0.15 * image.width
    svg = outputs[2].read_text()
    assert DEMO_NOTE in svg or DEMO_NOTE.replace("'", "&#x27;") in svg  # a demo's table
    for component in COMPONENTS:
        assert COMPONENT_COLOURS[component].lower() in svg.lower(), component
        assert label(component) in svg


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.1075, 1.034, [0.2, 0.5, 1.0]),  # within a decade: 1, 2, 5
        (0.006, 2.37, [0.01, 0.1, 1.0]),  # decades
        (1.31, 129.4, [10.0, 100.0]),
        (1e-6, 1e6, [1e-6, 1e-2, 1e2, 1e6]),  # thinned to at most five
    ],
)
def test_log_ticks(low: float, high: float, expected: list[float]) -> None:
    assert figures._log_ticks(low, high) == pytest.approx(expected)


def test_log_ticks_always_two_in_a_widened_range() -> None:
    rng = np.random.default_rng(1)
    for value in 10 ** rng.uniform(-5, 5, 200):
        ticks = figures._log_ticks(value / 2.5, value * 2.5)  # the figure's widening
        assert 2 <= len(ticks) <= 5
        assert all(value / 2.5 <= t <= value * 2.5 for t in ticks)
        for tick in ticks:  # 1, 2 or 5 times a power of ten
            mantissa = tick / 10 ** math.floor(math.log10(tick) + 1e-9)
            assert any(math.isclose(mantissa, m) for m in (1, 2, 5)), tick


# -- thin commands -----------------------------------------------------------------------------


def test_commands_never_import_each_other() -> None:
    """A command module imports vitplasticity.commands (shared helpers) only, never another
    command module: what two commands share lives there or in the stage modules."""
    found = set()
    for path in sorted(COMMANDS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
                if node.module == "vitplasticity.commands":  # `... import report` is one too
                    names += [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found |= {
                (path.name, name)
                for name in names
                if name.startswith("vitplasticity.commands.")
                and (COMMANDS / f"{name.split('.')[2]}.py").is_file()
            }
    assert not found, found
