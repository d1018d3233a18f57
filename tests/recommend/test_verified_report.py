"""The verified report's numbers: measured means and spreads, each criterion's Spearman rho
and top-1 hit, the recommendation within the budget, against numpy."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from vitplasticity.recommend.verified_report import (
    criterion_scores,
    measured_table,
    recommendation,
)

# Measured best val accuracies per configuration over three seeds, and trainable parameters.
MEASURED = {
    "mha": ([0.80, 0.84, 0.82], 3000),
    "fc1": ([0.70, 0.71, 0.75], 6000),
    "ln1": ([0.60, 0.61, 0.59], 100),
    "fc2": ([0.78, 0.74, 0.73], 6000),
    "head": ([0.50, 0.50, 0.52], 40),
}
# Predicted ranks: "good" orders mha, fc2, fc1, ln1; "bad" puts ln1 first; "one" ranks one.
RANKS = {
    "good": {"mha": 1, "fc2": 2, "fc1": 3, "ln1": 4},
    "bad": {"ln1": 1, "fc1": 2, "mha": 3, "fc2": 4},
    "one": {"fc1": 1},
}


def table() -> pl.DataFrame:
    summaries = [
        {
            "configuration": name,
            "lr": 0.01,
            "seed": seed,
            "best_val_accuracy": acc,
            "test_accuracy": acc - 0.01,
            "trainable_parameters": params,
        }
        for name, (accs, params) in MEASURED.items()
        for seed, acc in enumerate(accs)
    ]
    ranks = pl.DataFrame(
        [(c, crit, r) for crit, order in RANKS.items() for c, r in order.items()],
        schema=["configuration", "criterion", "rank"],
        orient="row",
    )
    return measured_table(summaries, {"head": ["baseline"]}, ranks)


def numpy_spearman(x: list[float], y: list[float]) -> float:
    """Pearson's r of the ranks (no ties here), in float64."""
    rx = np.argsort(np.argsort(np.asarray(x, dtype=np.float64)))
    ry = np.argsort(np.argsort(np.asarray(y, dtype=np.float64)))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_the_measured_table_holds_each_configuration_s_mean_and_spread() -> None:
    measured = table()
    assert measured["configuration"].to_list() == ["mha", "fc2", "fc1", "ln1", "head"]
    for row in measured.iter_rows(named=True):
        accs = np.array(MEASURED[row["configuration"]][0])
        assert row["val_accuracy_mean"] == pytest.approx(accs.mean(), abs=1e-15)
        assert row["val_accuracy_std"] == pytest.approx(accs.std(ddof=1), abs=1e-15)
        assert row["seeds"] == 3
        for criterion, order in RANKS.items():
            assert row[f"rank_{criterion}"] == order.get(row["configuration"])
    assert measured.filter(pl.col("configuration") == "head")["reasons"].item() == "baseline"


def test_each_criterion_s_rho_and_top1_hit_match_numpy() -> None:
    measured = table()
    means = {n: float(np.mean(a)) for n, (a, _) in MEASURED.items()}
    scores = {s.criterion: s for s in criterion_scores(measured)}
    for criterion in ("good", "bad"):
        order = RANKS[criterion]
        names = list(order)
        expected = numpy_spearman([-order[n] for n in names], [means[n] for n in names])
        assert scores[criterion].spearman == pytest.approx(expected, abs=1e-12)
        assert scores[criterion].ranked == 4
    assert scores["good"].spearman == pytest.approx(1.0) and scores["good"].top1_hit is True
    assert scores["bad"].top1_hit is False and scores["bad"].spearman < 0
    assert scores["one"].spearman is None and scores["one"].top1_hit is None


def test_the_recommendation_is_the_most_accurate_within_the_budget() -> None:
    measured = table()
    assert recommendation(measured, None)["configuration"] == "mha"
    assert recommendation(measured, 2999)["configuration"] == "ln1"
    assert recommendation(measured, 39) is None
