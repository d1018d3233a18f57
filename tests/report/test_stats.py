"""compare_components against scipy and against direct float64 computations."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from vitplasticity.report.stats import compare_components, compare_selected


def _table(acc: dict[str, np.ndarray]) -> pl.DataFrame:
    rows = [
        {"dataset": f"d{i:02d}", "component": c, "accuracy": float(v)}
        for c, values in acc.items()
        for i, v in enumerate(values)
    ]
    return pl.DataFrame(rows)


def _exact_wilcoxon_p(d: np.ndarray, alternative: str) -> float:
    """Exact signed-rank p-value by enumerating all 2^n sign patterns (no ties, no zeros)."""
    ranks = np.argsort(np.argsort(np.abs(d))) + 1.0
    observed = ranks[d > 0].sum()
    sums = np.array(
        [
            sum(r for r, s in zip(ranks, signs, strict=True) if s)
            for signs in itertools.product([0, 1], repeat=d.size)
        ]
    )
    greater, less = np.mean(sums >= observed), np.mean(sums <= observed)
    return {"greater": greater, "less": less, "two-sided": min(1.0, 2 * min(greater, less))}[
        alternative
    ]


@pytest.mark.parametrize("alternative", ["greater", "two-sided", "less"])
def test_matches_scipy_and_direct_computation(alternative: str) -> None:
    rng = np.random.default_rng(7)
    acc = {c: 0.85 + 0.05 * rng.random(11) for c in ("ln1", "mha", "ln2", "fc1", "fc2")}
    acc["mha"] = acc["mha"] + 0.01
    result = compare_components(_table(acc), "mha", alternative)
    assert result["component"].to_list() == ["ln1", "ln2", "fc1", "fc2"]
    for row in result.iter_rows(named=True):
        x, y = acc["mha"], acc[row["component"]]
        w = sps.wilcoxon(x, y, alternative=alternative)
        t = sps.ttest_rel(x, y, alternative=alternative)
        assert row["wilcoxon_stat"] == pytest.approx(w.statistic, abs=1e-12)
        assert row["wilcoxon_p"] == pytest.approx(w.pvalue, abs=1e-12)
        assert row["ttest_stat"] == pytest.approx(t.statistic, abs=1e-12)
        assert row["ttest_p"] == pytest.approx(t.pvalue, abs=1e-12)
        # Independent of scipy: exact enumeration and the t formula in float64.
        d = x - y
        assert row["wilcoxon_p"] == pytest.approx(_exact_wilcoxon_p(d, alternative), abs=1e-12)
        t_direct = d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
        assert row["ttest_stat"] == pytest.approx(t_direct, rel=1e-12)
        assert row["mean_diff"] == pytest.approx(d.mean(), abs=1e-15)
        assert row["n_datasets"] == 11
        assert row["significant"] == (row["wilcoxon_p"] < 0.05)


def test_ties_and_zero_differences_follow_scipy_defaults() -> None:
    mha = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    fc1 = mha - np.array([0.0, 0.0, 0.1, 0.1, -0.1, 0.2, 0.3, 0.05])  # zeros and ties
    same = mha.copy()  # every difference zero
    result = compare_components(_table({"mha": mha, "fc1": fc1, "ln1": same}))
    rows = {r["component"]: r for r in result.iter_rows(named=True)}
    w = sps.wilcoxon(mha, fc1, alternative="greater")
    assert rows["fc1"]["wilcoxon_stat"] == pytest.approx(w.statistic, abs=1e-12)
    assert rows["fc1"]["wilcoxon_p"] == pytest.approx(w.pvalue, abs=1e-12)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w0 = sps.wilcoxon(mha, same, alternative="greater")
    assert rows["ln1"]["wilcoxon_p"] == pytest.approx(w0.pvalue, abs=1e-12)
    assert rows["ln1"]["significant"] is False


def test_missing_component_is_an_error_naming_it() -> None:
    table = _table({"mha": np.array([0.9, 0.8, 0.7]), "fc1": np.array([0.8, 0.7, 0.6])})
    table = table.filter(~((pl.col("dataset") == "d01") & (pl.col("component") == "fc1")))
    with pytest.raises(ValueError, match="d01 has no accuracy for fc1"):
        compare_components(table)
    with pytest.raises(ValueError, match="reference component 'ln2'"):
        compare_components(_table({"mha": np.ones(3), "fc1": np.ones(3)}), reference="ln2")
    twice = pl.concat([table, table.head(1)])
    with pytest.raises(ValueError, match="several accuracies"):
        compare_components(twice)


def test_alpha_sets_significance() -> None:
    acc = {"mha": np.linspace(0.9, 0.95, 8), "fc2": np.linspace(0.8, 0.85, 8)}
    p = compare_components(_table(acc))["wilcoxon_p"][0]
    assert p == pytest.approx(1 / 2**8, abs=1e-12)  # every difference positive: exact 1/2^n
    assert compare_components(_table(acc), alpha=0.01)["significant"][0] is True
    assert compare_components(_table(acc), alpha=0.001)["significant"][0] is False


def test_compare_selected_is_per_model() -> None:
    rows = []
    for model, shift in (("a", 0.02), ("b", -0.02)):
        for i in range(6):
            for c in ("head", "mha", "fc1"):
                value = (
                    0.7
                    + 0.01 * i
                    + (shift if c == "mha" else 0.0)
                    + (0.005 * i if c == "fc1" else 0)
                )
                rows.append(
                    {
                        "model": model,
                        "dataset": f"d{i}",
                        "configuration": c,
                        "test_accuracy_mean": value,
                    }
                )
    result = compare_selected(pl.DataFrame(rows))
    assert result.select("model", "component").rows() == [
        ("a", "fc1"),
        ("a", "head"),
        ("b", "fc1"),
        ("b", "head"),
    ]
    a_head = result.filter((pl.col("model") == "a") & (pl.col("component") == "head")).row(
        0, named=True
    )
    assert a_head["mean_diff"] == pytest.approx(0.02)
    assert a_head["wilcoxon_p"] == pytest.approx(1 / 2**6)
