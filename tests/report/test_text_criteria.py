"""The text criteria check (vitplasticity.report.text_criteria, `vitplasticity criteria --runs`):
the text grid's selection rule by hand, the scores against scipy, the command's outputs and
its refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from tests.helpers.cli_errors import refusal
from vitplasticity import cli
from vitplasticity.components import COMPONENTS
from vitplasticity.report.criteria import recommend_criteria
from vitplasticity.report.text_criteria import score_text_criteria, select_text_runs

LRS = (1e-4, 1e-3)


def run(configuration: str, lr: float, seed: int, loss: float | None, **extra) -> dict:
    return {
        "experiment": "text_finetune",
        "model": "lm",
        "dataset": "prose",
        "configuration": configuration,
        "lr": lr,
        "seed": seed,
        "best_val_loss": loss,
        "trainable_parameters": 10 * (COMPONENTS.index(configuration) + 1),
        "demo": True,
        **extra,
    }


def grid(rng: np.random.Generator, dataset: str = "prose") -> list[dict]:
    """Two learning rates x two seeds of every component, random losses."""
    return [
        run(c, lr, seed, float(rng.uniform(1.0, 3.0)), dataset=dataset)
        for c in COMPONENTS
        for lr in LRS
        for seed in (0, 1)
    ]


def test_each_configuration_takes_its_learning_rate_of_lowest_mean_loss() -> None:
    runs = grid(np.random.default_rng(0))
    selected = select_text_runs(runs, "text_finetune")
    assert selected.height == len(COMPONENTS)
    for row in selected.iter_rows(named=True):
        means = {
            lr: np.mean(
                [
                    r["best_val_loss"]
                    for r in runs
                    if (r["configuration"], r["lr"]) == (row["configuration"], lr)
                ]
            )
            for lr in LRS
        }
        best = min(means, key=means.get)
        assert row["lr"] == best and row["seeds"] == 2
        assert row["val_loss_mean"] == pytest.approx(means[best], rel=1e-12)
        assert row["val_perplexity"] == pytest.approx(math.exp(means[best]), rel=1e-12)
    # Sorted by loss within the (model, dataset).
    assert selected["val_loss_mean"].to_list() == sorted(selected["val_loss_mean"].to_list())


def test_a_learning_rate_with_a_diverged_seed_is_not_selected() -> None:
    runs = [
        run("mha", 1e-3, 0, 0.5),
        run("mha", 1e-3, 1, None),  # diverged: the lower mean of lr 1e-3 does not count
        run("mha", 1e-4, 0, 2.0),
        run("mha", 1e-4, 1, 2.2),
        run("ln1", 1e-3, 0, None),
        run("ln1", 1e-4, 0, float("nan")),
    ]
    rows = {
        r["configuration"]: r for r in select_text_runs(runs, "text_finetune").iter_rows(named=True)
    }
    assert rows["mha"]["lr"] == 1e-4 and rows["mha"]["val_loss_mean"] == pytest.approx(2.1)
    assert (
        rows["ln1"]["val_loss_mean"] is None
        and "every learning rate diverged" in rows["ln1"]["note"]
    )


def test_a_run_given_twice_or_a_summary_without_its_keys_is_refused() -> None:
    with pytest.raises(ValueError, match=r"given twice: lm/prose/mha/0\.001/0"):
        select_text_runs([run("mha", 1e-3, 0, 1.0), run("mha", 1e-3, 0, 1.0)], "text_finetune")
    broken = run("mha", 1e-3, 0, 1.0)
    del broken["best_val_loss"]
    with pytest.raises(ValueError, match="lacks best_val_loss"):
        select_text_runs([broken], "text_finetune")
    with pytest.raises(ValueError, match="experiment 'sgd'"):
        select_text_runs([run("mha", 1e-3, 0, 1.0, experiment="sgd")], "text_finetune")


def recommend_table(rng: np.random.Generator, datasets: list[str]) -> pl.DataFrame:
    """A recommend --text table: one criterion, rank 1 = its highest value."""
    rows = []
    for dataset in datasets:
        values = rng.uniform(0, 1, size=len(COMPONENTS))
        order = np.argsort(-values)
        for rank, index in enumerate(order, start=1):
            rows.append(
                {
                    "model": "lm",
                    "dataset": dataset,
                    "configuration": COMPONENTS[index],
                    "criterion": "relative_gradient_norm",
                    "value": float(values[index]),
                    "rank": rank,
                }
            )
    return pl.DataFrame(rows)


def test_the_scores_are_scipys_against_the_negated_loss() -> None:
    rng = np.random.default_rng(3)
    datasets = [f"text{i}" for i in range(5)]
    runs = [r for d in datasets for r in grid(rng, d)]
    table = recommend_table(rng, datasets)
    selected = select_text_runs(runs, "text_finetune")
    result = score_text_criteria(
        recommend_criteria(table),
        selected,
        experiment="text_finetune",
        configurations=None,
        min_configurations=3,
    )
    rhos = []
    for dataset in datasets:
        loss = dict(
            selected.filter(pl.col("dataset") == dataset)
            .select("configuration", "val_loss_mean")
            .iter_rows()
        )
        value = dict(
            table.filter(pl.col("dataset") == dataset).select("configuration", "value").iter_rows()
        )
        x = [value[c] for c in COMPONENTS]
        y = [-loss[c] for c in COMPONENTS]
        row = result.filter((pl.col("level") == "dataset") & (pl.col("dataset") == dataset)).row(
            0, named=True
        )
        assert row["experiment"] == "text_finetune"
        assert row["spearman_rho"] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        assert row["kendall_tau"] == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)
        assert row["top1_hit"] == float(max(value, key=value.get) == min(loss, key=loss.get))
        rhos.append(row["spearman_rho"])
    summary = result.filter(pl.col("level") == "summary").row(0, named=True)
    assert summary["wilcoxon_p"] == pytest.approx(
        stats.wilcoxon(rhos, alternative="greater").pvalue, abs=1e-12
    )
    assert summary["min_p"] == pytest.approx(2**-5)


def test_the_command_writes_the_selected_runs_the_scores_and_the_report(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rng = np.random.default_rng(5)
    paths = []
    for i, summary in enumerate(grid(rng)):
        path = tmp_path / f"run{i}/summary.json"
        path.parent.mkdir()
        path.write_text(json.dumps(summary))
        paths.append(str(path))
    table = tmp_path / "recommend.parquet"
    recommend_table(rng, ["prose"]).write_parquet(table)
    out = tmp_path / "stats"
    status = cli.main([
        "criteria", "--experiment", "text_finetune", "--runs", *paths, "--recommend", str(table),
        "--selected-out", str(out / "selected.parquet"), "--out", str(out / "criteria.parquet"),
        "--markdown", str(out / "criteria.md"),
    ])  # fmt: skip
    assert status == 0
    selected = pl.read_parquet(out / "selected.parquet")
    assert sorted(selected["configuration"]) == sorted(COMPONENTS)
    scores = pl.read_parquet(out / "criteria.parquet")
    scored = set(scores.filter(pl.col("level") == "dataset")["criterion"])
    assert scored == {"relative_gradient_norm", "trainable_parameters"}
    report = (out / "criteria.md").read_text()
    assert "**DEMO**" in report and "## lm on prose" in report
    assert "| relative_gradient_norm | " in report

    # A summary that is not JSON is named; nothing is written.
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    elsewhere = tmp_path / "elsewhere"
    argv = [
        "criteria", "--experiment", "text_finetune", "--runs", str(bad), "--selected-out", str(elsewhere / "s.parquet"),
        "--out", str(elsewhere / "c.parquet"), "--markdown", str(elsewhere / "c.md"),
    ]  # fmt: skip
    assert str(bad) in refusal(argv, caplog, elsewhere)
