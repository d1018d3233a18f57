"""The text criteria report never shows one criterion as if it were the only one: every
criterion of the registry it has no score of is an n/a row saying why (an encoder's check,
with neither text plasticity nor recommend --text, scores the parameter baseline alone)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from vitplasticity import cli
from vitplasticity.components import COMPONENTS
from vitplasticity.criteria import RECOMMEND_CRITERIA, REGISTRY

NO_RECOMMEND = "no recommend --text table of bert on prose"
NO_PLASTICITY = "no text plasticity summary of bert on prose"
NO_VALUE = "recommend --text's table has no finite value"
NO_PARAMETERS = "left out by report.criteria.parameters: false"
PLASTICITY = ["plasticity_paper_protocol", "plasticity_in_situ"]


def _runs(folder: Path) -> list[str]:
    """Summaries of a text grid of ``bert`` on ``prose``: every component, one lr and seed."""
    rng = np.random.default_rng(0)
    paths = []
    for index, configuration in enumerate(COMPONENTS):
        path = folder / f"runs/{configuration}.json"
        path.parent.mkdir(exist_ok=True)
        summary = {
            "experiment": "text_finetune", "model": "bert", "dataset": "prose",
            "configuration": configuration, "lr": 1e-3, "seed": 0,
            "best_val_loss": float(rng.uniform(1, 3)), "trainable_parameters": 10 * (index + 1),
        }  # fmt: skip
        path.write_text(json.dumps(summary))
        paths.append(str(path))
    return paths


def _recommend(folder: Path) -> list[str]:
    """A recommend --text table of the relative gradient norm alone."""
    values = np.linspace(1, 0, len(COMPONENTS))
    path = folder / "recommend.parquet"
    pl.DataFrame({
        "model": "bert", "dataset": "prose", "configuration": list(COMPONENTS),
        "criterion": "relative_gradient_norm", "value": values,
        "rank": list(range(1, len(COMPONENTS) + 1)),
    }).write_parquet(path)  # fmt: skip
    return ["--recommend", str(path)]


def _expected(absent: dict[str, str]) -> dict[str, str]:
    return dict(sorted(absent.items()))


# (case, with a recommend-text table, with the parameter baseline, criterion -> why it is n/a)
CASES = [
    (
        "runs alone: the parameter baseline, every other criterion n/a",
        False,
        True,
        {
            **{name: NO_RECOMMEND for name in RECOMMEND_CRITERIA},
            **{name: NO_PLASTICITY for name in PLASTICITY},
        },
    ),
    (
        "a recommend-text table of one criterion",
        True,
        True,
        {
            **{name: NO_VALUE for name in RECOMMEND_CRITERIA if name != "relative_gradient_norm"},
            **{name: NO_PLASTICITY for name in PLASTICITY},
        },
    ),
    (
        "the parameter baseline left out",
        True,
        False,
        {
            **{name: NO_VALUE for name in RECOMMEND_CRITERIA if name != "relative_gradient_norm"},
            **{name: NO_PLASTICITY for name in PLASTICITY},
            "trainable_parameters": NO_PARAMETERS,
        },
    ),
]


@pytest.mark.parametrize(
    ("recommend", "parameters", "absent"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_criterion_without_a_score_is_an_na_row_saying_why(
    tmp_path: Path, recommend: bool, parameters: bool, absent: dict[str, str]
) -> None:
    out = tmp_path / "stats"
    argv = [
        "criteria", "--experiment", "text_finetune", "--runs", *_runs(tmp_path), *(_recommend(tmp_path) if recommend else []),
        *([] if parameters else ["--no-parameters"]), "--min-configurations", "3",
        "--selected-out", str(out / "selected.parquet"), "--out", str(out / "criteria.parquet"),
        "--markdown", str(out / "criteria.md"),
    ]  # fmt: skip
    assert cli.main(argv) == 0
    report = (out / "criteria.md").read_text()
    rows = {
        cells[0]: cells
        for line in report.splitlines()
        if line.startswith("| ")
        and (cells := [c.strip() for c in line.strip("|").split("|")])
        and cells[0] in REGISTRY
    }
    assert set(rows) == set(REGISTRY)  # every criterion has its row
    na = {name: cells[-1] for name, cells in rows.items() if cells[2] == "n/a"}
    assert sorted(na) == sorted(absent)
    for name, why in absent.items():
        assert why in na[name], (name, na[name])
    assert "Best among the criteria scored only" in report
