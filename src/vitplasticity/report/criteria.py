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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import polars as pl

from vitplasticity.components import COMPONENTS, NORMS
from vitplasticity.criteria import PAPER_PLASTICITY, PARAMETERS, REGISTRY
from vitplasticity.report.criteria_statistics import (
    MIN_CONFIGURATIONS,
    RESULT_SCHEMA,
    best_criteria,
    compare_criteria,
    correlate,
    summarize_criteria,
)
from vitplasticity.report.plasticity_summary import plasticity_ranking
from vitplasticity.report.style import configuration_order

PAPER_PROTOCOL = "embedding"
"""The plasticity protocol of the paper's reference code."""

CRITERION_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "dataset": pl.String(),
    "configuration": pl.String(),
    "criterion": pl.String(),
    "source": pl.String(),
    "score": pl.Float64(),
}
"""Columns of a criteria frame: one score per (model, dataset, configuration, criterion)."""


def no_score_reasons(
    criterion: str, configurations: Sequence[str], name: Callable[[str], str] = str
) -> list[str]:
    """Why ``criterion`` has no score for ``configurations``, one reason per kind, each
    followed by the configurations it explains (printed by ``name``): norms alone
    (:attr:`~vitplasticity.criteria.Criterion.norms_na`) and the others
    (:attr:`~vitplasticity.criteria.Criterion.linear_na`); none where the registry gives no
    reason (or knows no such criterion)."""
    entry = REGISTRY.get(criterion)
    if entry is None:
        return []
    norms = [c for c in configurations if set(c.split("+")) <= NORMS]
    linear = [c for c in configurations if c not in norms]
    reasons = []
    for names, reason in ((norms, entry.norms_na), (linear, entry.linear_na)):
        if names and reason:
            reasons.append(f"{reason} ({', '.join(map(name, names))})")
    return reasons


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
        min_configurations: see :func:`.criteria_statistics.correlate`.

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
    rows = [
        row
        for part in accuracy.partition_by("experiment", "model", "dataset", maintain_order=True)
        for row in _dataset_rows(part, criteria, order, min_configurations)
    ]
    if not rows:
        raise ValueError(
            "no criterion scores any (model, dataset) of the selected-LR table: criteria cover "
            f"{_cells(criteria)}; the table has {_cells(accuracy)}"
        )
    return pl.DataFrame(rows, schema=RESULT_SCHEMA, orient="row")


def _cells(frame: pl.DataFrame) -> str:
    """The (model, dataset) pairs of a frame, as 'model/dataset' (for an error message)."""
    names = sorted({f"{m}/{d}" for m, d in frame.select("model", "dataset").iter_rows()})
    return ", ".join(names) or "nothing"


def _dataset_rows(
    part: pl.DataFrame, criteria: pl.DataFrame, order: list[str], min_configurations: int
) -> list[dict[str, Any]]:
    """The ``dataset`` rows of one (experiment, model, dataset): one per criterion scoring it.

    Args:
        part: its accuracies (``experiment``, ``model``, ``dataset``, ``configuration``,
            ``accuracy``).
        criteria: the finite scores of every criterion.
        order: the criteria, in the order their rows are written.
        min_configurations: see :func:`.criteria_statistics.correlate`.
    """
    experiment, model, dataset = part.row(0)[:3]
    present = configuration_order(part["configuration"].to_list())
    measured = {
        c: a
        for c, a in part.select("configuration", "accuracy").iter_rows()
        if a is not None and not math.isnan(a)
    }
    scored = criteria.filter((pl.col("model") == model) & (pl.col("dataset") == dataset))
    rows = []
    for criterion in order:
        rows_c = scored.filter(pl.col("criterion") == criterion)
        if rows_c.is_empty():
            continue
        scores = dict(rows_c.select("configuration", "score").iter_rows())
        names = [c for c in present if c in measured and c in scores]
        result = correlate(
            names, [scores[c] for c in names], [measured[c] for c in names], min_configurations
        )
        result["note"] = _coverage_note(criterion, present, measured, scores, result["note"])
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
    return rows


def _coverage_note(
    criterion: str,
    present: list[str],
    measured: dict[str, float],
    scores: dict[str, float],
    note: str | None,
) -> str | None:
    """``note`` after what the correlation left out: configurations with no score (and why,
    when by design) or no accuracy."""
    unscored = [c for c in present if c in measured and c not in scores]
    notes = [
        *(f"no score for {c}" for c in unscored),
        *no_score_reasons(criterion, unscored),
        *(f"no accuracy for {c}" for c in present if c in scores and c not in measured),
        *([note] if note else []),
    ]
    return "; ".join(notes) or None


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
        min_configurations: see :func:`.criteria_statistics.correlate`.

    Returns:
        ``dataset``, then ``summary``, then ``pairwise`` rows (:data:`RESULT_SCHEMA`).
    """
    per_dataset = correlate_datasets(criteria, selected, configurations, min_configurations)
    return pl.concat(
        [per_dataset, summarize_criteria(per_dataset), compare_criteria(per_dataset)]
    ).cast(RESULT_SCHEMA)  # type: ignore[arg-type]


ACCURACY_COLUMNS: tuple[str, ...] = ("configuration", "dataset", "accuracy")
"""The plain accuracy table :func:`score_selectors` reads (``model`` optional)."""


def score_selectors(
    criteria: pl.DataFrame,
    accuracy: pl.DataFrame,
    *,
    experiment: str,
    configurations: Sequence[str] | None = None,
    min_configurations: int = MIN_CONFIGURATIONS,
) -> pl.DataFrame:
    """The selector benchmark on any measured accuracies (the paper's grid, verification
    runs): :func:`analyse` of ``criteria`` against a plain table.

    Args:
        criteria: a criteria frame (:data:`CRITERION_SCHEMA`; :func:`recommend_criteria` of
            recommend tables, :func:`plasticity_criteria`, :func:`parameter_criterion`).
        accuracy: columns ``configuration``, ``dataset``, ``accuracy`` (a fraction or a
            percentage: only ranks matter), and ``model`` when the criteria hold several
            models (else the criteria's one model). Several rows of one (model, dataset,
            configuration), its seeds, count as their mean.
        experiment: the ``experiment`` of the result's rows (``verify``, ``sgd``).
        configurations: the configurations compared; None (default) for every one present
            in both tables.
        min_configurations: see :func:`.criteria_statistics.correlate`.

    Returns:
        :func:`analyse`'s rows: per dataset rho, tau, top-1 hit; per criterion across datasets
        the one-sided Wilcoxon of rho > 0 with ``min_p`` = 2^-n; criterion against criterion.

    Raises:
        ValueError: naming a missing column, a model the criteria do not identify, or no
            (model, dataset) that both tables cover.
    """
    _require(accuracy, ACCURACY_COLUMNS, "accuracy table")
    if "model" not in accuracy.columns:
        models = criteria["model"].unique().to_list()
        if len(models) != 1:
            raise ValueError(
                f"accuracy table: no model column, and the criteria hold {len(models)} models "
                f"({', '.join(sorted(models))}): add a model column"
            )
        accuracy = accuracy.with_columns(model=pl.lit(models[0]))
    selected = (
        accuracy.group_by("model", "dataset", "configuration", maintain_order=True)
        .agg(test_accuracy_mean=pl.col("accuracy").cast(pl.Float64).mean())
        .with_columns(experiment=pl.lit(experiment))
    )
    return analyse(criteria, selected, configurations, min_configurations)


def best_criterion_lines(result: pl.DataFrame) -> list[str]:
    """One line per (experiment, model) naming the best criterion, its mean rho, hit rate,
    Wilcoxon p (with n and the smallest attainable p), and how ties were decided."""
    summary = result.filter(pl.col("level") == "summary")
    lines = []
    for (experiment, model), (names, reason) in best_criteria(summary).items():
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
