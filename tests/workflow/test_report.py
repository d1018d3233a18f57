"""vitplasticity.workflow.report: each table and figure declared once, read by its rule (the
outputs, flagged for the HTML report) and by the targets (the files `all` asks for)."""

from __future__ import annotations

import re
import string
from typing import Any

import pytest

from tests.helpers.repo import REPO
from vitplasticity.workflow.report import (
    CAPTIONS,
    FIGURE_FLAGS,
    FIGURES,
    TABLES,
    ReportFiles,
)

RULES = REPO / "workflow/rules"


def report_flag(output: Any) -> Any:
    return output.flags["report"] if hasattr(output, "flags") and "report" in output.flags else None


def wildcard_names(pattern: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(pattern) if name]


@pytest.mark.parametrize("name", sorted(TABLES))
def test_a_tables_rule_makes_what_the_targets_ask_for(demo: dict[str, Any], name: str) -> None:
    files = ReportFiles(demo)
    outputs = files.table_outputs(name)
    assert list(outputs) == ["tex", "csv"]
    values = {w: "sgd" for w in wildcard_names(TABLES[name].stem)}
    made = [str(output).format(**values) for output in outputs.values()]
    assert made == files.table_files(name, **{w: [v] for w, v in values.items()})


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_a_figures_rule_makes_what_the_targets_ask_for(demo: dict[str, Any], name: str) -> None:
    files = ReportFiles(demo)
    values = {w: "x" for w in wildcard_names(FIGURES[name].stem)}
    made = [str(output).format(**values) for output in files.figure_outputs(name)]
    assert made == files.figure_files(name, **{w: [v] for w, v in values.items()})
    assert [m.rsplit(".", 1)[1] for m in made] == demo["report"]["figures"]["formats"]


def test_both_files_of_a_table_go_into_the_report(demo: dict[str, Any]) -> None:
    outputs = ReportFiles(demo).table_outputs("accuracy")
    for fmt, output in outputs.items():
        assert str(output) == f"results/demo/tables/{{experiment}}_accuracy.{fmt}"
        flag = report_flag(output)
        assert flag.caption == f"{CAPTIONS}/table_accuracy.rst"
        assert (flag.category, flag.subcategory) == ("Tables", "{experiment}")


def test_a_figures_png_goes_into_the_report_else_its_first_format(demo: dict[str, Any]) -> None:
    demo["report"]["figures"]["formats"] = ["pdf", "png", "svg"]
    outputs = ReportFiles(demo).figure_outputs("curves")
    assert [report_flag(o) is not None for o in outputs] == [False, True, False]
    flag = report_flag(outputs[1])
    assert (flag.category, flag.subcategory) == ("Figures", "{experiment} curves")
    demo["report"]["figures"]["formats"] = ["svg", "pdf"]
    outputs = ReportFiles(demo).figure_outputs("curves")
    assert [report_flag(o) is not None for o in outputs] == [True, False]


def test_every_caption_exists() -> None:
    for shown in [*TABLES.values(), *FIGURES.values()]:
        assert (RULES / CAPTIONS / f"{shown.caption}.rst").is_file(), shown


def test_targets_expand_every_combination(demo: dict[str, Any]) -> None:
    files = ReportFiles(demo).figure_files("plasticity_boxplot", model=["m"], scope=["a", "pooled"])
    assert files == [
        f"results/demo/figures/plasticity_boxplot/m/{scope}.{fmt}"
        for scope in ("a", "pooled")
        for fmt in demo["report"]["figures"]["formats"]
    ]
    assert ReportFiles(demo).table_files("accuracy", experiment=[]) == []


def test_figure_commands_take_the_figure_params_and_write_the_outputs(demo: dict[str, Any]) -> None:
    params = ReportFiles(demo).figure_params()
    assert params == {"width_in": 3.4, "dpi": 200, "context": "paper", "demo_flag": "--demo"}
    assert set(re.findall(r"\{params\.(\w+)", FIGURE_FLAGS)) == set(params)
    assert FIGURE_FLAGS.endswith(" --out {output:q} > {log:q} 2>&1")
