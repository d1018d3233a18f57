"""The statistics of the criteria analysis (:mod:`.criteria`, whose docstring says what each
number means): one criterion against the accuracy on one dataset (:func:`correlate`), and the
Wilcoxon signed-rank tests across datasets, of each criterion (:func:`summarize_criteria`)
and between criteria (:func:`compare_criteria`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from vitplasticity.criteria import PARAMETERS

MIN_CONFIGURATIONS = 3
"""Fewest configurations a correlation is computed on (two points always correlate +-1)."""

TIE_TOLERANCE = 1e-12
"""Mean rhos closer than this are a tie for the best criterion."""


RESULT_SCHEMA: dict[str, pl.DataType] = {
    "level": pl.String(),
    "experiment": pl.String(),
    "model": pl.String(),
    "dataset": pl.String(),
    "criterion": pl.String(),
    "versus": pl.String(),
    "source": pl.String(),
    "n": pl.Int64(),
    "configurations": pl.String(),
    "spearman_rho": pl.Float64(),
    "spearman_p": pl.Float64(),
    "kendall_tau": pl.Float64(),
    "kendall_p": pl.Float64(),
    "top1_hit": pl.Float64(),
    "criterion_best": pl.String(),
    "accuracy_best": pl.String(),
    "rho_difference": pl.Float64(),
    "wilcoxon_stat": pl.Float64(),
    "wilcoxon_p": pl.Float64(),
    "min_p": pl.Float64(),
    "best": pl.Boolean(),
    "note": pl.String(),
}
"""Columns of :func:`.criteria.analyse`'s result. ``level`` says what a row is:

- ``dataset``: one (experiment, model, dataset, criterion); ``n`` configurations (listed in
  ``configurations``), ``spearman_rho/_p``, ``kendall_tau/_p``, ``top1_hit``, and the best
  configurations by criterion and by accuracy (comma-separated when tied).
- ``summary``: one (experiment, model, criterion) across datasets; ``n`` datasets with a
  defined rho; ``spearman_rho``, ``kendall_tau``, ``top1_hit`` hold the means over datasets
  (the hit rate); ``wilcoxon_stat/_p`` test rho > 0; ``min_p`` = 2^-n; ``best``.
- ``pairwise``: ``criterion`` against ``versus``, paired over ``n`` datasets;
  ``rho_difference`` = mean of rho(criterion) - rho(versus); ``wilcoxon_stat/_p`` test
  criterion > versus; ``min_p`` = 2^-n.

``note`` says why a value is missing, and what ties or left-out configurations there were.
"""


# --- one dataset -----------------------------------------------------------------------------


def _ties(names: list[str], values: np.ndarray) -> list[str]:
    """Groups of configurations sharing a value, as 'ln1=ln2'."""
    groups: dict[float, list[str]] = {}
    for name, value in zip(names, values, strict=True):
        groups.setdefault(float(value), []).append(name)
    return ["=".join(g) for g in groups.values() if len(g) > 1]


def _best(names: list[str], values: np.ndarray) -> list[str]:
    top = np.max(values)
    return [n for n, v in zip(names, values, strict=True) if v == top]


def correlate(
    names: Sequence[str],
    score: Sequence[float],
    accuracy: Sequence[float],
    min_configurations: int = MIN_CONFIGURATIONS,
) -> dict[str, Any]:
    """Spearman, Kendall and top-1 hit of one criterion on one dataset.

    Args:
        names: the configurations.
        score: the criterion's score of each (larger = predicted better).
        accuracy: the measured accuracy of each.
        min_configurations: fewer configurations give NaN coefficients.

    Returns:
        ``n``, ``spearman_rho``, ``spearman_p``, ``kendall_tau``, ``kendall_p``, ``top1_hit``,
        ``criterion_best``, ``accuracy_best`` and ``note`` (``;``-joined reasons, or None).
    """
    names = list(names)
    x = np.asarray(score, dtype=np.float64)
    y = np.asarray(accuracy, dtype=np.float64)
    if not (len(names) == x.size == y.size):
        raise ValueError("names, score and accuracy differ in length")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("scores and accuracies must be finite")
    nan = float("nan")
    out: dict[str, Any] = {
        "n": len(names),
        "spearman_rho": nan,
        "spearman_p": nan,
        "kendall_tau": nan,
        "kendall_p": nan,
        "top1_hit": nan,
        "criterion_best": None,
        "accuracy_best": None,
    }
    if len(names) == 0:
        out["note"] = "no configuration has both a score and an accuracy"
        return out
    out.update(_top1(names, x, y))
    reason = _no_correlation(len(names), x, y, min_configurations)
    if reason is None:
        out.update(_rank_correlations(x, y))
    notes = [*([reason] if reason else []), *_tie_notes(names, x, y)]
    out["note"] = "; ".join(notes) or None
    return out


def _top1(names: list[str], x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """The best configurations by score and by accuracy, and the chance the first hits."""
    criterion_best, accuracy_best = _best(names, x), _best(names, y)
    out: dict[str, Any] = {
        "criterion_best": ",".join(criterion_best),
        "accuracy_best": ",".join(accuracy_best),
    }
    if len(accuracy_best) < len(names):  # with every accuracy equal, any pick would "hit"
        out["top1_hit"] = len(set(criterion_best) & set(accuracy_best)) / len(criterion_best)
    return out


def _no_correlation(n: int, x: np.ndarray, y: np.ndarray, min_configurations: int) -> str | None:
    """Why the coefficients are undefined (too few configurations, a constant side), or None."""
    if n < min_configurations:
        return f"{n} configurations, fewer than {min_configurations}: no correlation"
    if np.all(x == x[0]):
        return "constant criterion (every configuration scores the same): no correlation"
    if np.all(y == y[0]):
        return "constant accuracy (every configuration the same): no correlation"
    return None


def _rank_correlations(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """scipy's Spearman rho and Kendall tau-b with their p-values."""
    from scipy import stats

    spearman = stats.spearmanr(x, y)
    kendall = stats.kendalltau(x, y)
    return {
        "spearman_rho": float(spearman.statistic),
        "spearman_p": float(spearman.pvalue),
        "kendall_tau": float(kendall.statistic),
        "kendall_p": float(kendall.pvalue),
    }


def _tie_notes(names: list[str], x: np.ndarray, y: np.ndarray) -> list[str]:
    """The ties among scores and among accuracies (none said for a constant side)."""
    notes = []
    for kind, values in (("criterion", x), ("accuracy", y)):
        tied = _ties(names, values)
        if tied and not np.all(values == values[0]):
            notes.append(f"{kind} ties {', '.join(tied)}")
    return notes


# --- across datasets -------------------------------------------------------------------------


def wilcoxon_greater(x: Sequence[float], y: Sequence[float] | None = None) -> tuple[float, float]:
    """``scipy.stats.wilcoxon(x[, y], alternative="greater")``: (statistic, p-value).

    scipy's defaults throughout (zero differences dropped, exact null distribution for small
    samples). With no nonzero difference (an empty sample, or every difference zero) there is
    nothing to rank: NaN, NaN (scipy would answer p = 1 for two or more zeros after a 0/0
    warning, and raise for one).
    """
    from scipy import stats

    differences = np.asarray(x, dtype=np.float64)
    if y is not None:
        differences = differences - np.asarray(y, dtype=np.float64)
    if not np.any(differences != 0):
        return float("nan"), float("nan")
    result = stats.wilcoxon(x, y, alternative="greater")
    return float(result.statistic), float(result.pvalue)


def minimum_p(n: int) -> float:
    """The smallest p-value a one-sided Wilcoxon signed-rank test of n pairs can give: 2^-n.

    Under the null every one of the 2^n sign patterns is equally likely, and only one (all
    differences positive) reaches the largest statistic. NaN for n = 0.
    """
    return 0.5**n if n > 0 else float("nan")


def _finite(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return array[np.isfinite(array)]


def _dropped_note(dropped: int, n: int, kind: str) -> str | None:
    """What the Wilcoxon test of ``n`` values left out: the ``dropped`` ones with no difference
    (``kind`` "zero": rho = 0 against 0; "equal": rho(a) = rho(b)), and no test when all were."""
    if not dropped:
        return None
    if dropped == n:
        return "every rho is zero: no test" if kind == "zero" else "every rho equal: no test"
    return f"{dropped} {kind} rho dropped by the Wilcoxon test"


def summarize_criteria(per_dataset: pl.DataFrame) -> pl.DataFrame:
    """The ``summary`` rows: per (experiment, model, criterion), means over datasets, the
    Wilcoxon test of rho > 0, and the best criterion (see the module docstring)."""
    rows = []
    for part in per_dataset.partition_by("experiment", "model", "criterion", maintain_order=True):
        first = part.row(0, named=True)
        rho = _finite(part["spearman_rho"].to_numpy())
        tau = _finite(part["kendall_tau"].to_numpy())
        hits = _finite(part["top1_hit"].to_numpy())
        stat, p = wilcoxon_greater(rho)
        notes = []
        if rho.size < part.height:
            notes.append(f"rho undefined on {part.height - rho.size} of {part.height} datasets")
        if hits.size != rho.size:
            notes.append(f"hit rate over {hits.size} datasets")
        dropped = _dropped_note(int(np.sum(rho == 0)), rho.size, "zero")
        if dropped:
            notes.append(dropped)
        rows.append(
            {
                "level": "summary",
                "experiment": first["experiment"],
                "model": first["model"],
                "criterion": first["criterion"],
                "source": first["source"],
                "n": int(rho.size),
                "spearman_rho": float(np.mean(rho)) if rho.size else float("nan"),
                "kendall_tau": float(np.mean(tau)) if tau.size else float("nan"),
                "top1_hit": float(np.mean(hits)) if hits.size else float("nan"),
                "wilcoxon_stat": stat,
                "wilcoxon_p": p,
                "min_p": minimum_p(int(rho.size)),
                "note": "; ".join(notes) or None,
            }
        )
    summary = pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")
    best = {(e, m, c) for (e, m), (names, _) in best_criteria(summary).items() for c in names}
    return summary.with_columns(
        best=pl.Series(
            [
                (e, m, c) in best
                for e, m, c in summary.select("experiment", "model", "criterion").iter_rows()
            ],
            dtype=pl.Boolean,
        )
    )


def best_criteria(summary: pl.DataFrame) -> dict[tuple[str, str], tuple[list[str], str]]:
    """Per (experiment, model): the best criteria and how they were chosen."""

    def top(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
        values = [r[column] if math.isfinite(r[column]) else -math.inf for r in rows]
        high = max(values)
        return [r for r, v in zip(rows, values, strict=True) if v >= high - TIE_TOLERANCE]

    out = {}
    for part in summary.partition_by("experiment", "model", maintain_order=True):
        key = (part["experiment"][0], part["model"][0])
        rows = [r for r in part.iter_rows(named=True) if math.isfinite(r["spearman_rho"])]
        if not rows:
            out[key] = ([], "no criterion has a defined rho on any dataset")
            continue
        if all(r["criterion"] == PARAMETERS for r in rows):
            # The baseline alone (an encoder, which recommend --text does not rank): no
            # criterion was compared with it, so none is best.
            out[key] = ([], "only the trainable-parameter baseline was scored")
            continue
        best = top(rows, "spearman_rho")
        reason = "highest mean rho"
        if len(best) > 1:
            reason += f", tied between {', '.join(r['criterion'] for r in best)}"
            for column, name in (("top1_hit", "hit rate"), ("kendall_tau", "mean tau")):
                kept = top(best, column)
                if len(kept) < len(best):
                    reason += f"; then highest {name}"
                best = kept
                if len(best) == 1:
                    break
            else:
                reason += "; still tied on hit rate and mean tau: all marked best"
        out[key] = ([r["criterion"] for r in best], reason)
    return out


def compare_criteria(per_dataset: pl.DataFrame) -> pl.DataFrame:
    """The ``pairwise`` rows: every ordered pair of criteria of an (experiment, model),
    Wilcoxon signed-rank of rho(criterion) > rho(versus) over the datasets where both are
    defined."""
    rows = []
    for part in per_dataset.partition_by("experiment", "model", maintain_order=True):
        experiment, model = part["experiment"][0], part["model"][0]
        rho = {
            c: dict(g.select("dataset", "spearman_rho").iter_rows())
            for (c,), g in part.partition_by("criterion", as_dict=True, maintain_order=True).items()
        }
        for a, rho_a in rho.items():
            for b, rho_b in rho.items():
                if a == b:
                    continue
                datasets = [
                    d
                    for d in rho_a
                    if d in rho_b and math.isfinite(rho_a[d]) and math.isfinite(rho_b[d])
                ]
                x = np.array([rho_a[d] for d in datasets], dtype=np.float64)
                y = np.array([rho_b[d] for d in datasets], dtype=np.float64)
                stat, p = wilcoxon_greater(x, y) if datasets else (float("nan"), float("nan"))
                equal = int(np.sum(x == y))
                rows.append(
                    {
                        "level": "pairwise",
                        "experiment": experiment,
                        "model": model,
                        "criterion": a,
                        "versus": b,
                        "n": len(datasets),
                        "rho_difference": float(np.mean(x - y)) if datasets else float("nan"),
                        "wilcoxon_stat": stat,
                        "wilcoxon_p": p,
                        "min_p": minimum_p(len(datasets)),
                        "note": _dropped_note(equal, len(datasets), "equal"),
                    }
                )
    return pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")
