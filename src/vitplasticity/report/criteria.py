"""Which criterion predicts finetuning accuracy? Rank correlations per dataset, tested across
datasets.

A *criterion* scores each finetuning configuration of one (model, dataset) before any
finetuning; the finetuning experiments (the ``{experiment}_selected`` tables) measure what
each configuration reaches. Criteria come from three sources, each turned into a ``score``
that is larger for the configuration the criterion predicts to be better:

- ``recommend``: ``vitplasticity recommend`` tables (one row per configuration and criterion,
  ``value`` and ``rank``, 1 = best). The score is the ``value``, oriented by the ranks
  (``value`` when rank 1 holds the highest value, ``-value`` when it holds the lowest, as
  PLoP's NFN does: it finetunes the least aligned modules first): the correlation then sees
  the criterion's own ties, not the table's tie-breaks (it breaks ties by parameter count). A
  non-finite value is no score (the norms' NFN: a norm holds no linear map, so NFN's
  correlation is over the other configurations, and the table and figure say so); ranks
  that follow the values in neither direction are an error.
- ``plasticity``: the measured plasticity summaries (``results/plasticity/<model>/<dataset>_
  summary.parquet``). The score of a component is its mean plasticity over the blocks (every
  pair of every block, as :func:`.plasticity_summary.plasticity_ranking`), higher = better: the paper's
  reading (docs/protocol.md: MHA > FC1 > FC2 > LN2 > LN1, and MHA finetunes best). The paper's
  ``embedding`` protocol gives criterion :data:`PAPER_PLASTICITY` ("plasticity_paper_protocol");
  any other protocol ``p`` gives ``plasticity_<p>`` (``plasticity_in_situ``).
- ``parameters``: the trainable parameter count of each configuration (the selected table's
  ``trainable_parameters``), more = better: the naive baseline that any criterion should beat.

Per (experiment, model, dataset, criterion), over the configurations that have both a score
and a finite selected-LR seed-mean test accuracy (by default the five components only;
full, emb, head and combinations join only when asked for and present on both sides):

- Spearman's rho and Kendall's tau-b with their p-values, exactly
  ``scipy.stats.spearmanr(score, accuracy)`` and ``scipy.stats.kendalltau(score, accuracy)``.
  Tied values get average ranks (Spearman) and tau-b's tie correction (Kendall). A constant
  score or accuracy leaves the coefficients undefined: NaN, with the reason in ``note``
  (scipy would warn and return NaN too); so does having fewer than ``min_configurations``
  (default 3: two points always correlate perfectly) configurations.
- ``top1_hit``: does the criterion's best configuration reach the best accuracy? With ties,
  the chance that it does when the tie is broken uniformly at random:
  |criterion-best & accuracy-best| / |criterion-best| (1: a unique, correct pick); NaN when
  every configuration reaches the same accuracy (any pick would hit).

Across the datasets of one (experiment, model, criterion) (``summary`` rows): the mean rho and
mean tau over datasets where they are defined, the hit rate (mean ``top1_hit``), and the
one-sided Wilcoxon signed-rank test of the per-dataset rho against 0,
``scipy.stats.wilcoxon(rho, alternative="greater")`` (scipy's defaults: zero rho dropped,
exact null distribution for small samples). Between criteria (``pairwise`` rows, every ordered
pair): ``scipy.stats.wilcoxon(rho_a, rho_b, alternative="greater")`` paired over the datasets
where both are defined. With n datasets the smallest p-value the test can give is 2^-n (every
difference positive): 0.125 for the demo's 3 datasets, 0.0625 for the paper's 4 Adam
datasets, 0.00049 for its 11 SGD datasets; below 5 datasets nothing reaches 0.05, and the
``min_p`` column says so. Models are never pooled: each (experiment, model) is its own test.

The best criterion of an (experiment, model) has the highest mean rho; a tie (equal to 1e-12)
goes to the higher hit rate, then to the higher mean tau; criteria still tied are all marked
best, and :func:`best_criterion_lines` says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from vitplasticity.components import COMPONENTS
from vitplasticity.report.plasticity_summary import plasticity_ranking
from vitplasticity.report.style import configuration_order

PAPER_PROTOCOL = "embedding"
"""The plasticity protocol of the paper's reference code."""

PAPER_PLASTICITY = "plasticity_paper_protocol"
"""Criterion name of the measured plasticity under the paper's protocol."""

PARAMETERS = "trainable_parameters"
"""Criterion name of the trainable-parameter baseline (more = predicted better)."""

MIN_CONFIGURATIONS = 3
"""Fewest configurations a correlation is computed on (two points always correlate +-1)."""

TIE_TOLERANCE = 1e-12
"""Mean rhos closer than this are a tie for the best criterion."""

CRITERION_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "dataset": pl.String(),
    "configuration": pl.String(),
    "criterion": pl.String(),
    "source": pl.String(),
    "score": pl.Float64(),
}
"""Columns of a criteria frame: one score per (model, dataset, configuration, criterion)."""

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
"""Columns of :func:`analyse`'s result. ``level`` says what a row is:

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

CRITERION_LABELS: dict[str, str] = {
    PAPER_PLASTICITY: "Plast. (paper)",
    "plasticity_in_situ": "Plast. (in situ)",
    PARAMETERS: "Params",
    "plasticity": "Plast. (rec.)",
    "relative_gradient_norm": "Rel. grad.",
    "gradient_snr": "Grad. SNR",
    "weight_spectral": "Spectral",
    "nfn": "NFN",
}
"""Short names of known criteria in tables and figures (others print as they are named)."""

NO_SCORE_REASONS: dict[str, str] = {
    "nfn": "a norm holds no linear map, so it has no NFN",
}
"""Why a criterion has no score for some configurations by design (said in ``note``)."""


def criterion_label(name: str) -> str:
    """The printed name of a criterion."""
    return CRITERION_LABELS.get(name, name)


# --- criteria from their sources -------------------------------------------------------------


def _require(frame: pl.DataFrame, columns: Sequence[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} misses column(s) {', '.join(missing)}")


def _check_unique(criteria: pl.DataFrame, what: str) -> pl.DataFrame:
    keys = ["model", "dataset", "configuration", "criterion"]
    twice = criteria.filter(pl.struct(keys).is_duplicated())
    if twice.height:
        cells = sorted({"/".join(row) for row in twice.select(keys).iter_rows()})
        raise ValueError(
            f"{what}: several scores for model/dataset/configuration/criterion "
            + ", ".join(cells[:5])
            + (f" (and {len(cells) - 5} more)" if len(cells) > 5 else "")
        )
    return criteria


def recommend_criteria(recommend: pl.DataFrame) -> pl.DataFrame:
    """Criteria of ``vitplasticity recommend`` tables: the ``value``, oriented by ``rank``.

    Args:
        recommend: rows of ``results/recommend/<model>/<dataset>.parquet`` (columns ``model``,
            ``dataset``, ``configuration``, ``criterion``, ``value``, ``rank``; others are
            ignored).

    Returns:
        A criteria frame (:data:`CRITERION_SCHEMA`), source ``recommend``; rows with a
        non-finite value or a null rank are left out.

    Raises:
        ValueError: on a missing column, a (model, dataset, configuration, criterion) twice,
            or ranks that follow the values in neither direction (naming the criterion).
    """
    keys = ["model", "dataset", "configuration", "criterion"]
    _require(recommend, [*keys, "value", "rank"], "recommend table")
    finite = recommend.filter(
        pl.col("rank").is_not_null() & pl.col("value").cast(pl.Float64).is_finite()
    ).with_columns(pl.col("value").cast(pl.Float64))
    _check_unique(finite.select(keys), "recommend table")
    frames = []
    for part in finite.sort("rank", maintain_order=True).partition_by(
        "model", "dataset", "criterion", maintain_order=True
    ):
        steps = np.diff(part["value"].to_numpy())  # value from rank 1 down
        if np.all(steps <= 0):
            sign = 1.0  # rank 1 = the highest value
        elif np.all(steps >= 0):
            sign = -1.0  # rank 1 = the lowest value
        else:
            model, dataset, criterion = part.select("model", "dataset", "criterion").row(0)
            raise ValueError(
                f"recommend table {model}/{dataset}: the ranks of criterion {criterion!r} follow "
                "its values in neither direction"
            )
        frames.append(part.select(*keys, source=pl.lit("recommend"), score=sign * pl.col("value")))
    if not frames:
        return pl.DataFrame(schema=CRITERION_SCHEMA)
    return pl.concat(frames).cast(CRITERION_SCHEMA)  # type: ignore[arg-type]


def plasticity_criteria(summaries: pl.DataFrame) -> pl.DataFrame:
    """Criteria of plasticity summaries: per protocol, each component's mean over blocks.

    The mean is :func:`.plasticity_summary.plasticity_ranking`'s (every pair of every block) taken per
    dataset; the paper's protocol is named :data:`PAPER_PLASTICITY`, another protocol ``p``
    ``plasticity_<p>``.

    Args:
        summaries: stacked ``<dataset>_summary.parquet`` tables (model, dataset, protocol,
            block, component, n_pairs, mean, ...).

    Raises:
        ValueError: on a missing column, an empty table, or a (model, dataset, protocol,
            block, component) given twice (one file passed twice).
    """
    keys = ["model", "dataset", "protocol", "block", "component"]
    _require(summaries, [*keys, "mean", "n_pairs"], "plasticity summary")
    if summaries.is_empty():
        raise ValueError("the plasticity summaries are empty")
    twice = summaries.filter(pl.struct(keys).is_duplicated())
    if twice.height:
        cells = sorted({f"{m}/{d}/{p}" for m, d, p, *_ in twice.select(keys).iter_rows()})
        raise ValueError(f"plasticity summary rows given twice for {', '.join(cells)}")
    frames = [
        plasticity_ranking(part).select(
            "model",
            pl.lit(dataset).alias("dataset"),
            pl.col("component").alias("configuration"),
            pl.when(pl.col("protocol") == PAPER_PROTOCOL)
            .then(pl.lit(PAPER_PLASTICITY))
            .otherwise(pl.lit("plasticity_") + pl.col("protocol"))
            .alias("criterion"),
            pl.lit("plasticity").alias("source"),
            pl.col("mean").alias("score"),
        )
        for (dataset,), part in summaries.partition_by(
            "dataset", as_dict=True, maintain_order=True
        ).items()
    ]
    return pl.concat(frames).cast(CRITERION_SCHEMA)  # type: ignore[arg-type]


def parameter_criterion(selected: pl.DataFrame) -> pl.DataFrame:
    """The trainable-parameter baseline: score = the configuration's trainable parameters.

    Rows without a count are left out; an empty frame when the table has no such column.
    """
    if "trainable_parameters" not in selected.columns:
        return pl.DataFrame(schema=CRITERION_SCHEMA)
    frame = (
        selected.filter(pl.col("trainable_parameters").is_not_null())
        .select(
            "model",
            "dataset",
            "configuration",
            criterion=pl.lit(PARAMETERS),
            source=pl.lit("parameters"),
            score=pl.col("trainable_parameters").cast(pl.Float64),
        )
        .unique(["model", "dataset", "configuration"], keep="first", maintain_order=True)
    )
    return frame.cast(CRITERION_SCHEMA)  # type: ignore[arg-type]


def combine_criteria(frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Stack criteria frames; a criterion may come from one source only.

    Raises:
        ValueError: if a criterion name appears in two sources, or a score is given twice.
    """
    frames = [f.cast(CRITERION_SCHEMA) for f in frames if f.height]  # type: ignore[arg-type]
    if not frames:
        return pl.DataFrame(schema=CRITERION_SCHEMA)
    criteria = pl.concat(frames)
    sources = criteria.group_by("criterion").agg(pl.col("source").unique().sort())
    clash = sources.filter(pl.col("source").list.len() > 1)
    if clash.height:
        raise ValueError(
            "criterion name(s) given by several sources: "
            + "; ".join(f"{c} ({', '.join(s)})" for c, s in clash.iter_rows())
        )
    return _check_unique(criteria, "criteria")


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
    from scipy import stats

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
    notes: list[str] = []
    if len(names) == 0:
        out["note"] = "no configuration has both a score and an accuracy"
        return out
    criterion_best, accuracy_best = _best(names, x), _best(names, y)
    out["criterion_best"] = ",".join(criterion_best)
    out["accuracy_best"] = ",".join(accuracy_best)
    if len(accuracy_best) < len(names):  # with every accuracy equal, any pick would "hit"
        out["top1_hit"] = len(set(criterion_best) & set(accuracy_best)) / len(criterion_best)
    if len(names) < min_configurations:
        notes.append(
            f"{len(names)} configurations, fewer than {min_configurations}: no correlation"
        )
    elif np.all(x == x[0]):
        notes.append("constant criterion (every configuration scores the same): no correlation")
    elif np.all(y == y[0]):
        notes.append("constant accuracy (every configuration the same): no correlation")
    else:
        spearman = stats.spearmanr(x, y)
        kendall = stats.kendalltau(x, y)
        out["spearman_rho"], out["spearman_p"] = float(spearman.statistic), float(spearman.pvalue)
        out["kendall_tau"], out["kendall_p"] = float(kendall.statistic), float(kendall.pvalue)
    for kind, values in (("criterion", x), ("accuracy", y)):
        tied = _ties(names, values)
        if tied and not np.all(values == values[0]):
            notes.append(f"{kind} ties {', '.join(tied)}")
    out["note"] = "; ".join(notes) or None
    return out


def correlate_datasets(
    criteria: pl.DataFrame,
    selected: pl.DataFrame,
    configurations: Sequence[str] | None = COMPONENTS,
    min_configurations: int = MIN_CONFIGURATIONS,
) -> pl.DataFrame:
    """The ``dataset`` rows: every criterion against the accuracy, per dataset.

    Args:
        criteria: a criteria frame (:data:`CRITERION_SCHEMA`).
        selected: selected-LR table(s) (``experiment``, ``model``, ``dataset``,
            ``configuration``, ``test_accuracy_mean``).
        configurations: the configurations compared (default the five components); None for
            every configuration present in both tables.
        min_configurations: see :func:`correlate`.

    Raises:
        ValueError: on a missing column, or when no criterion covers any (model, dataset) of
            ``selected``.
    """
    cell = ["experiment", "model", "dataset", "configuration"]
    _require(selected, [*cell, "test_accuracy_mean"], "selected-LR table")
    _require(criteria, list(CRITERION_SCHEMA), "criteria")
    if selected.filter(pl.struct(cell).is_duplicated()).height:
        raise ValueError("the selected-LR table has several rows for one cell")
    keep = pl.lit(True) if configurations is None else pl.col("configuration").is_in(configurations)
    accuracy = selected.filter(keep).select(*cell, accuracy=pl.col("test_accuracy_mean"))
    # A NaN score (a criterion that could not be computed) is no score.
    criteria = criteria.filter(keep & pl.col("score").is_finite())
    order = criteria["criterion"].unique(maintain_order=True).to_list()
    rows = []
    groups = accuracy.partition_by("experiment", "model", "dataset", maintain_order=True)
    for part in groups:
        experiment, model, dataset = part.row(0)[:3]
        present = configuration_order(part["configuration"].to_list())
        measured = {
            c: a
            for c, a in part.select("configuration", "accuracy").iter_rows()
            if a is not None and not math.isnan(a)
        }
        scored = criteria.filter((pl.col("model") == model) & (pl.col("dataset") == dataset))
        for criterion in order:
            rows_c = scored.filter(pl.col("criterion") == criterion)
            if rows_c.is_empty():
                continue
            scores = dict(rows_c.select("configuration", "score").iter_rows())
            names = [c for c in present if c in measured and c in scores]
            result = correlate(
                names,
                [scores[c] for c in names],
                [measured[c] for c in names],
                min_configurations,
            )
            unscored = [c for c in present if c in measured and c not in scores]
            notes = [
                *(f"no score for {c}" for c in unscored),
                *(
                    [NO_SCORE_REASONS[criterion]]
                    if unscored and criterion in NO_SCORE_REASONS
                    else []
                ),
                *(f"no accuracy for {c}" for c in present if c in scores and c not in measured),
                *([result["note"]] if result["note"] else []),
            ]
            result["note"] = "; ".join(notes) or None
            rows.append(
                {
                    "level": "dataset",
                    "experiment": experiment,
                    "model": model,
                    "dataset": dataset,
                    "criterion": criterion,
                    "source": rows_c["source"][0],
                    "configurations": ",".join(names),
                    **result,
                }
            )
    if not rows:

        def cells(frame: pl.DataFrame) -> str:
            names = sorted({f"{m}/{d}" for m, d in frame.select("model", "dataset").iter_rows()})
            return ", ".join(names) or "nothing"

        raise ValueError(
            "no criterion scores any (model, dataset) of the selected-LR table: criteria cover "
            f"{cells(criteria)}; the table has {cells(accuracy)}"
        )
    return pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")


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
    best = {(e, m, c) for (e, m), (names, _) in _best_criteria(summary).items() for c in names}
    return summary.with_columns(
        best=pl.Series(
            [
                (e, m, c) in best
                for e, m, c in summary.select("experiment", "model", "criterion").iter_rows()
            ],
            dtype=pl.Boolean,
        )
    )


def _best_criteria(summary: pl.DataFrame) -> dict[tuple[str, str], tuple[list[str], str]]:
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


def analyse(
    criteria: pl.DataFrame,
    selected: pl.DataFrame,
    configurations: Sequence[str] | None = COMPONENTS,
    min_configurations: int = MIN_CONFIGURATIONS,
) -> pl.DataFrame:
    """Per-dataset correlations, their summary across datasets, and the pairwise tests.

    Args:
        criteria: a criteria frame (:func:`recommend_criteria`, :func:`plasticity_criteria`,
            :func:`parameter_criterion`, stacked with :func:`combine_criteria`).
        selected: the selected-LR table of one or more experiments.
        configurations: see :func:`correlate_datasets`.
        min_configurations: see :func:`correlate`.

    Returns:
        ``dataset``, then ``summary``, then ``pairwise`` rows (:data:`RESULT_SCHEMA`).
    """
    per_dataset = correlate_datasets(criteria, selected, configurations, min_configurations)
    return pl.concat(
        [per_dataset, summarize_criteria(per_dataset), compare_criteria(per_dataset)]
    ).cast(RESULT_SCHEMA)  # type: ignore[arg-type]


def best_criterion_lines(result: pl.DataFrame) -> list[str]:
    """One line per (experiment, model) naming the best criterion, its mean rho, hit rate,
    Wilcoxon p (with n and the smallest attainable p), and how ties were decided."""
    summary = result.filter(pl.col("level") == "summary")
    lines = []
    for (experiment, model), (names, reason) in _best_criteria(summary).items():
        if not names:
            lines.append(f"{experiment}/{model}: no best criterion ({reason})")
            continue
        parts = []
        for name in names:
            row = summary.filter(
                (pl.col("experiment") == experiment)
                & (pl.col("model") == model)
                & (pl.col("criterion") == name)
            ).row(0, named=True)
            parts.append(
                f"{name} (mean rho {row['spearman_rho']:+.3f}, mean tau {row['kendall_tau']:+.3f},"
                f" hit rate {row['top1_hit']:.2f}, Wilcoxon rho>0 over n={row['n']} datasets:"
                f" p={row['wilcoxon_p']:.3g}, smallest attainable p={row['min_p']:.3g})"
            )
        lines.append(f"{experiment}/{model}: best criterion {' and '.join(parts)} [{reason}]")
    return lines


def unscored_configurations(result: pl.DataFrame) -> dict[tuple[str, str], list[str]]:
    """Per (model, criterion): the configurations that another criterion's correlation on some
    dataset includes but this criterion's does not (it has no score for them: the norms for
    NFN), in the canonical order; criteria that miss none are absent.

    Args:
        result: an :func:`analyse` result (its ``dataset`` rows are read).
    """
    per_dataset = result.filter(pl.col("level") == "dataset")
    missing: dict[tuple[str, str], set[str]] = {}
    for part in per_dataset.partition_by("experiment", "model", "dataset", maintain_order=True):
        compared = {
            criterion: set(filter(None, (names or "").split(",")))
            for criterion, names in part.select("criterion", "configurations").iter_rows()
        }
        everyone = set().union(*compared.values())
        model = part["model"][0]
        for criterion, names in compared.items():
            if everyone - names:
                missing.setdefault((model, criterion), set()).update(everyone - names)
    return {key: configuration_order(sorted(names)) for key, names in missing.items()}


def single_experiment(result: pl.DataFrame) -> str:
    """The one experiment of an :func:`analyse` result (a table or figure shows one).

    Raises:
        ValueError: if ``result`` is empty or holds several experiments.
    """
    if result.is_empty():
        raise ValueError("the criteria table is empty")
    experiments = result["experiment"].unique(maintain_order=True).to_list()
    if len(experiments) > 1:
        raise ValueError(f"one experiment per table or figure, got {', '.join(experiments)}")
    return experiments[0]
