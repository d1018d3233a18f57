"""Is the reference component (MHA) better than each other one? Paired tests over datasets.

The paper (docs/protocol.md, "Aggregation"): Wilcoxon signed-rank, MHA against each other
component, paired over the 11 datasets, one-sided (MHA greater), and the paired t-test.

With ``x`` the reference's accuracies and ``y`` those of another component (one per dataset,
paired by dataset), the tests are exactly ``scipy.stats.wilcoxon(x, y,
alternative=alternative)`` and ``scipy.stats.ttest_rel(x, y, alternative=alternative)``:
scipy's defaults throughout, so zero differences are dropped before ranking
(``zero_method="wilcox"``), tied absolute differences get average ranks, no continuity
correction, and the p-value is exact for small samples without ties or zeros and from the
normal approximation otherwise (``method="auto"``). When every difference is zero scipy gives
statistic 0 and p-value 1 for the Wilcoxon test and NaN for the t-test; those are passed on
unchanged.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from vitplasticity.utils.io import TableKind

ALTERNATIVES: tuple[str, ...] = ("greater", "two-sided", "less")

STATS_SCHEMA: dict[str, pl.DataType] = {
    "reference": pl.String(),
    "component": pl.String(),
    "alternative": pl.String(),
    "n_datasets": pl.Int64(),
    "mean_diff": pl.Float64(),
    "wilcoxon_stat": pl.Float64(),
    "wilcoxon_p": pl.Float64(),
    "ttest_stat": pl.Float64(),
    "ttest_p": pl.Float64(),
    "alpha": pl.Float64(),
    "significant": pl.Boolean(),
}
"""Columns of :func:`compare_components`'s result."""

COMPARISON_TABLE = TableKind(
    "a comparison table (stats --out)", {"model": pl.String(), **STATS_SCHEMA}
)
"""What :func:`compare_selected` gives, written by ``vitplasticity stats``."""

RESULT_COLUMNS: tuple[str, ...] = (
    "component",
    "n_datasets",
    "mean_diff",
    "wilcoxon_stat",
    "wilcoxon_p",
    "ttest_stat",
    "ttest_p",
    "significant",
    "reference",
    "alternative",
    "alpha",
)
"""The order of those columns in the result: what is compared first, the test's setting last."""


def _accuracy_matrix(table: pl.DataFrame) -> tuple[list[str], dict[str, np.ndarray]]:
    """Datasets (sorted) and, per component, its accuracies in that dataset order."""
    missing = {"dataset", "component", "accuracy"} - set(table.columns)
    if missing:
        raise ValueError(f"comparison table misses column(s) {', '.join(sorted(missing))}")
    twice = table.filter(pl.struct("dataset", "component").is_duplicated())
    if twice.height:
        pairs = sorted({f"{d}/{c}" for d, c in twice.select("dataset", "component").iter_rows()})
        raise ValueError(f"several accuracies for dataset/component {', '.join(pairs)}")
    present = table.filter(pl.col("accuracy").is_not_null() & pl.col("accuracy").is_not_nan())
    datasets = sorted(table["dataset"].unique().to_list())
    components = list(dict.fromkeys(table["component"].to_list()))
    have = set(present.select("dataset", "component").iter_rows())
    holes = [
        f"{d} has no accuracy for {c}" for d in datasets for c in components if (d, c) not in have
    ]
    if holes:
        raise ValueError("cannot pair components over datasets: " + "; ".join(holes))
    lookup = {
        (d, c): a for d, c, a in present.select("dataset", "component", "accuracy").iter_rows()
    }
    return datasets, {
        c: np.array([lookup[(d, c)] for d in datasets], dtype=np.float64) for c in components
    }


def compare_components(
    table: pl.DataFrame,
    reference: str = "mha",
    alternative: str = "greater",
    alpha: float = 0.05,
) -> pl.DataFrame:
    """Paired tests of ``reference`` against every other component, over datasets.

    For each other component ``c``, with ``x`` the reference's accuracies and ``y`` those of
    ``c`` (one per dataset, paired by dataset), the two tests of the module docstring.

    Args:
        table: columns ``dataset``, ``component``, ``accuracy``; one row per dataset and
            component.
        reference: the component tested against the others (the paper: ``mha``).
        alternative: ``greater`` (reference better, the paper), ``two-sided`` or ``less``.
        alpha: significance level of the ``significant`` column (on the Wilcoxon p-value).

    Returns:
        One row per other component, in the input's order: ``component``, ``n_datasets``,
        ``mean_diff`` (mean of reference minus component), ``wilcoxon_stat``, ``wilcoxon_p``,
        ``ttest_stat``, ``ttest_p``, ``significant``, plus ``reference``, ``alternative``,
        ``alpha``.

    Raises:
        ValueError: if a dataset lacks a component's accuracy (naming both), a (dataset,
            component) appears twice, ``reference`` is absent, or ``alternative`` is unknown.
    """
    _check_test_settings(alternative, alpha)
    datasets, accuracy = _accuracy_matrix(table)
    if reference not in accuracy:
        raise ValueError(
            f"reference component {reference!r} is not in the table "
            f"(components: {', '.join(accuracy)})"
        )
    x = accuracy[reference]
    rows = [
        {
            "reference": reference,
            "component": component,
            "alternative": alternative,
            "n_datasets": len(datasets),
            **_paired_tests(x, y, alternative, alpha),
        }
        for component, y in accuracy.items()
        if component != reference
    ]
    return pl.DataFrame(rows, schema=STATS_SCHEMA, orient="row").select(*RESULT_COLUMNS)


def _check_test_settings(alternative: str, alpha: float) -> None:
    """Raise ValueError on an unknown alternative or an alpha outside (0, 1)."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")


def _paired_tests(x: np.ndarray, y: np.ndarray, alternative: str, alpha: float) -> dict:
    """scipy's Wilcoxon signed-rank and paired t-test of ``x`` against ``y`` (see
    :func:`compare_components`), the mean difference, and whether the Wilcoxon p < alpha."""
    from scipy import stats

    with warnings.catch_warnings():
        # All-zero differences make scipy divide 0 by 0 on the way to its answer.
        warnings.simplefilter("ignore", RuntimeWarning)
        wilcoxon = stats.wilcoxon(x, y, alternative=alternative)
        ttest = stats.ttest_rel(x, y, alternative=alternative)
    w_stat, w_p = float(wilcoxon.statistic), float(wilcoxon.pvalue)
    return {
        "mean_diff": float(np.mean(x - y)),
        "wilcoxon_stat": w_stat,
        "wilcoxon_p": w_p,
        "ttest_stat": float(ttest.statistic),
        "ttest_p": float(ttest.pvalue),
        "alpha": float(alpha),
        "significant": bool(w_p < alpha),
    }


def compare_selected(
    selected: pl.DataFrame,
    reference: str = "mha",
    alternative: str = "greater",
    alpha: float = 0.05,
) -> pl.DataFrame:
    """:func:`compare_components` on a selected-LR table, once per model.

    The accuracy of each (dataset, configuration) is its selected-LR seed-mean test accuracy;
    every configuration of the experiment (components, and full/emb/head when present) is
    compared with ``reference``. Each model gets its own rows (``model`` column): accuracies
    of different models are not paired samples of one population.
    """
    from vitplasticity.report.style import configuration_order

    order = {c: i for i, c in enumerate(configuration_order(selected["configuration"].to_list()))}
    selected = selected.sort(pl.col("configuration").replace_strict(order), "dataset")
    frames = []
    for model in selected["model"].unique(maintain_order=True).to_list():
        table = selected.filter(pl.col("model") == model).select(
            "dataset",
            component=pl.col("configuration"),
            accuracy=pl.col("test_accuracy_mean"),
        )
        try:
            result = compare_components(table, reference, alternative, alpha)
        except ValueError as error:
            raise ValueError(f"model {model}: {error}") from error
        frames.append(result.select(pl.lit(model).alias("model"), pl.all()))
    if not frames:
        raise ValueError("the selected-LR table is empty")
    return pl.concat(frames)
