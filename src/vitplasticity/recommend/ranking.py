"""The recommendation table: ranks per criterion, the choice under a parameter budget, and
its Markdown report.

The table is long: one row per (configuration, criterion), columns :data:`TABLE_SCHEMA`.
Within a criterion, rank 1 is the configuration to finetune first: the highest value, except
for the criteria of :data:`~vitplasticity.criteria.LOWER_FIRST` (NFN, kappa), where it is the
lowest; a NaN value ranks last; ties go to the configuration with fewer trainable parameters,
then to the order given. Each criterion's label, direction and n/a rule is its entry of
:data:`vitplasticity.criteria.REGISTRY`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from vitplasticity.components import COMPONENTS, NORMS
from vitplasticity.criteria import NA_FOR_NORMS, REGISTRY
from vitplasticity.recommend.criteria import CRITERIA, Measurements, configuration_components
from vitplasticity.recommend.matrix_criteria import NOT_A_MATRIX

if TYPE_CHECKING:
    from vitplasticity.recommend.settings import RecommendImageSettings, RecommendTextSettings

TABLE_SCHEMA: dict[str, pl.DataType] = {
    "model": pl.String(),
    "dataset": pl.String(),
    "configuration": pl.String(),
    "criterion": pl.String(),
    "value": pl.Float64(),
    "ci_low": pl.Float64(),
    "ci_high": pl.Float64(),
    "rank": pl.Int64(),
    "trainable_parameters": pl.Int64(),
}
"""Columns of the recommendation Parquet file (a fixed interface: other stages read it)."""

COMPONENT_NAMES: dict[str, str] = {
    "ln1": "LN1",
    "mha": "MHA",
    "ln2": "LN2",
    "fc1": "FC1",
    "fc2": "FC2",
}


def configuration_label(configuration: str) -> str:
    """The printed name of a configuration: "MHA+FC1"."""
    return "+".join(COMPONENT_NAMES.get(part, part) for part in configuration.split("+"))


def build_table(
    measurements: Measurements, configurations: Sequence[str], *, model: str, dataset: str
) -> pl.DataFrame:
    """The ranked table of ``configurations``: one row per (configuration, criterion).

    Raises:
        ValueError: for a configuration named twice or one that is not made of components.
    """
    duplicates = sorted({c for c in configurations if list(configurations).count(c) > 1})
    if duplicates:
        raise ValueError(f"configurations named twice: {', '.join(duplicates)}")
    rows = []
    for configuration in configurations:
        parameters = measurements.trainable_parameters(configuration)
        for criterion, estimate in measurements.estimates(configuration).items():
            rows.append(
                {
                    "model": model,
                    "dataset": dataset,
                    "configuration": configuration,
                    "criterion": criterion,
                    "value": estimate.value,
                    "ci_low": estimate.ci_low,
                    "ci_high": estimate.ci_high,
                    "rank": 0,
                    "trainable_parameters": parameters,
                }
            )
    _rank(rows, configurations)
    return pl.DataFrame(rows, schema=TABLE_SCHEMA)


def _rank(rows: list[dict], order: Sequence[str]) -> None:
    """Set each row's ``rank`` within its criterion (1 = finetune first: the highest value, the
    lowest for a criterion whose lowest is finetuned first), in place."""
    position = {name: index for index, name in enumerate(order)}

    def key(row: dict) -> tuple:
        finite = math.isfinite(row["value"])
        return (
            not finite,
            -REGISTRY[row["criterion"]].preference * row["value"] if finite else 0.0,
            row["trainable_parameters"],
            position[row["configuration"]],
        )

    for criterion in CRITERIA:
        ranked = sorted((row for row in rows if row["criterion"] == criterion), key=key)
        for index, row in enumerate(ranked, start=1):
            row["rank"] = index


@dataclass(frozen=True)
class Recommendation:
    """What to finetune under a budget, by one criterion."""

    configuration: str | None
    """The recommended configuration; None when no configuration fits the budget."""
    criterion: str
    budget: int | None
    trainable_parameters: int | None
    combined: bool = False
    """Whether ``configuration`` is the greedy union of components (``combine``)."""


def select(table: pl.DataFrame, criterion: str, budget: int | None) -> Recommendation:
    """The configuration ranked best by ``criterion`` among those that fit ``budget``.

    Raises:
        ValueError: for an unknown criterion.
    """
    _check_criterion(criterion)
    rows = table.filter(pl.col("criterion") == criterion).sort("rank").to_dicts()
    for row in rows:
        fits = budget is None or row["trainable_parameters"] <= budget
        if fits and math.isfinite(row["value"]):
            return Recommendation(
                row["configuration"], criterion, budget, row["trainable_parameters"]
            )
    return Recommendation(None, criterion, budget, None)


def greedy_union(
    values: Mapping[str, float], parameters: Mapping[str, int], budget: int, criterion: str
) -> Recommendation:
    """Join components best first while their total parameters fit ``budget``.

    Components are taken in decreasing ``values`` (increasing for a criterion whose lowest is
    finetuned first; NaN ones never); one that would exceed the budget is skipped and the
    next tried (greedy knapsack by value, not value per parameter: the criterion says what to
    train first, not what it is worth per parameter). The union is named in forward order
    ("mha+fc1").
    """
    chosen: list[str] = []
    total = 0
    sign = REGISTRY[criterion].preference
    ordered = sorted(
        (c for c in values if math.isfinite(values[c])),
        key=lambda c: (-sign * values[c], parameters[c], COMPONENTS.index(c)),
    )
    for component in ordered:
        if total + parameters[component] <= budget:
            chosen.append(component)
            total += parameters[component]
    if not chosen:
        return Recommendation(None, criterion, budget, None, combined=True)
    name = "+".join(c for c in COMPONENTS if c in chosen)
    return Recommendation(name, criterion, budget, total, combined=True)


def check_ranking(settings: RecommendImageSettings | RecommendTextSettings) -> None:
    """Check what either recommend's declared checks cannot see alone: that every
    configuration is made of the five components and named once, that ``combine`` has a
    budget to fit, and that the criterion can rank one of the configurations (NFN cannot
    rank norms: :data:`~vitplasticity.criteria.NA_FOR_NORMS`).

    Raises:
        ValueError: naming the flag.
    """
    configurations = settings.configurations
    parts = []
    for configuration in configurations:
        try:
            parts.append(configuration_components(configuration))
        except ValueError as error:
            raise ValueError(f"--configurations: {error}") from None
    if len(set(configurations)) != len(configurations):
        raise ValueError(
            f"--configurations: a configuration is named twice: {list(configurations)}"
        )
    if settings.combine and settings.budget is None:
        raise ValueError("--combine needs --budget (without one the union is every component)")
    # The greedy union joins every component that has a value, whatever --configurations holds.
    norms_only = all(set(components) <= NORMS for components in parts)
    if settings.criterion in NA_FOR_NORMS and not settings.combine and norms_only:
        label = REGISTRY[settings.criterion].label
        raise ValueError(
            f"--criterion {settings.criterion}: {label} is n/a for norms (they hold no linear map), "
            "and --configurations "
            f"{' '.join(configurations)} holds norms only: add a configuration with mha, fc1 or "
            "fc2, or rank by another --criterion"
        )


def rank_and_choose(
    measurements: Measurements,
    configurations: Sequence[str],
    criterion: str,
    budget: int | None,
    combine: bool,
    *,
    model: str,
    dataset: str,
) -> tuple[pl.DataFrame, Recommendation, list[str]]:
    """The ranking table, the recommendation and the configurations ranked: the best
    configuration by ``criterion`` that fits ``budget`` (:func:`select`), or with ``combine``
    the greedy union of components (:func:`greedy_union`), which joins ``configurations``
    (its row must be in the table)."""
    configurations = list(configurations)
    if combine:
        if budget is None:
            raise ValueError("--combine needs --budget (without one the union is every component)")
        values = {c: measurements.estimates(c)[criterion].value for c in COMPONENTS}
        recommendation = greedy_union(values, measurements.component_parameters, budget, criterion)
        if recommendation.configuration and recommendation.configuration not in configurations:
            configurations.append(recommendation.configuration)  # its row must be in the table
    table = build_table(measurements, configurations, model=model, dataset=dataset)
    if not combine:
        recommendation = select(table, criterion, budget)
    return table, recommendation, configurations


def _check_criterion(criterion: str) -> None:
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}; known: {', '.join(CRITERIA)}")


NFN_NOTE = (
    "NFN (PLoP's normalised feature norm, Hayou et al., ICLR 2026: a linear map's mean output "
    "norm on the task's inputs over that on random inputs of the same norms) ranks its *lowest* "
    "value first, as PLoP adapts the modules least aligned with the task: the opposite end from "
    "plasticity and the other criteria. LN1 and LN2 hold no linear map, so they have no NFN, "
    "Spectrum SNR or kappa (n/a: each is of a linear map's output or weight matrix); a "
    "configuration joining one to linear components has those of its linear maps."
)
"""The report's note on NFN, below the table."""


def _number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.4g}"


def _cell(row: dict) -> str:
    text = _number(row["value"])
    if row["ci_low"] is not None and row["ci_high"] is not None:
        text += f" [{_number(row['ci_low'])}, {_number(row['ci_high'])}]"
    return f"{text} ({row['rank']})"


def markdown(
    table: pl.DataFrame,
    recommendation: Recommendation,
    *,
    model: str,
    dataset: str,
    reference: str,
    always_trained: int,
    demo: bool = False,
    demo_note: str = "",
) -> str:
    """The report: a heading, the ranked table, and a short recommendation.

    Args:
        table: :func:`build_table`'s result.
        recommendation: :func:`select`'s or :func:`greedy_union`'s result.
        model, dataset: names in the heading.
        reference: what the plasticity pairs started from, in words.
        always_trained: parameters of the head and final norm.
        demo: put ``demo_note`` on top.
    """
    criterion = recommendation.criterion
    by_config = {
        (row["configuration"], row["criterion"]): row for row in table.iter_rows(named=True)
    }
    order = table.filter(pl.col("criterion") == criterion).sort("rank")["configuration"].to_list()
    lines = [f"# Which components should I finetune? {model} on {dataset}", ""]
    if demo:
        lines += [f"> **{demo_note}**", ""]
    budget = "none" if recommendation.budget is None else f"{recommendation.budget:,}"
    lines += [
        f"Reference set: {reference}. Ranked by **{REGISTRY[criterion].label}**; "
        f"trainable-parameter budget: {budget}. Parameter counts exclude the classifier head "
        f"and final norm ({always_trained:,} parameters), which every configuration trains.",
        "",
        *_table_lines(by_config, order, criterion),
    ]
    lines += [
        "",
        "Each cell: value [95% CI where there is one] (rank by that criterion; 1 = finetune "
        "first). " + NFN_NOTE,
        "",
        _recommendation_text(recommendation, by_config, order, always_trained),
        "",
    ]
    return "\n".join(lines)


def _table_lines(
    by_config: dict[tuple[str, str], dict], order: list[str], criterion: str
) -> list[str]:
    """The report's Markdown table: a row per configuration in ``order``, its rank and
    parameters by ``criterion``, then every criterion's cell."""
    lines = [
        "| rank | configuration | trainable parameters | "
        + " | ".join(REGISTRY[c].label for c in CRITERIA)
        + " |",
        "|---:|---|---:|" + "---|" * len(CRITERIA),
    ]
    for configuration in order:
        head = by_config[(configuration, criterion)]
        cells = [_cell(by_config[(configuration, c)]) for c in CRITERIA]
        lines.append(
            f"| {head['rank']} | {configuration_label(configuration)} | "
            f"{head['trainable_parameters']:,} | " + " | ".join(cells) + " |"
        )
    return lines


def _heuristic(criterion: str) -> str:
    """What a recommendation by ``criterion`` rests on (its registry entry's basis), and that
    it is no finetuning result."""
    return (
        f"This is {REGISTRY[criterion].basis}, not a finetuning result: confirm it with a "
        "short run, above all when the criteria disagree."
    )


def _nothing_recommended(
    budget: int | None, criterion: str, always_trained: int, heuristic: str
) -> str:
    """The recommendation's text when no configuration is recommended: none fits ``budget``,
    or (no budget) every one is n/a by ``criterion`` (a weight statistic the family lacks)."""
    if budget is None:
        return (
            f"**No configuration has a {criterion} value** (n/a for each): rank by another "
            f"criterion. {heuristic}"
        )
    return (
        f"**No configuration fits the budget of {budget:,} trainable parameters**: linear "
        f"probing (the head and final norm, {always_trained:,} parameters) is what fits. "
        f"{heuristic}"
    )


def _recommendation_text(
    recommendation: Recommendation,
    by_config: dict[tuple[str, str], dict],
    order: list[str],
    always_trained: int,
) -> str:
    criterion = REGISTRY[recommendation.criterion].label
    lower = REGISTRY[recommendation.criterion].lower_first
    heuristic = _heuristic(recommendation.criterion)
    if recommendation.configuration is None:
        return _nothing_recommended(recommendation.budget, criterion, always_trained, heuristic)
    name = configuration_label(recommendation.configuration)
    budget = (
        "with no budget"
        if recommendation.budget is None
        else f"within the budget of {recommendation.budget:,}"
    )
    sentences = [
        f"**Recommendation: finetune {name}** ({recommendation.trainable_parameters:,} "
        f"trainable parameters plus {always_trained:,} for the head and final norm, {budget})."
    ]
    if recommendation.combined:
        sentences.append(
            f"It joins the components in {'increasing' if lower else 'decreasing'} {criterion} "
            "for as long as their parameters fit the budget (a greedy union)."
        )
    else:
        among = "" if recommendation.budget is None else " among those that fit the budget"
        sentences.append(
            f"It is the configuration of {'lowest' if lower else 'highest'} {criterion}{among}."
        )
    others = [
        f"{REGISTRY[c].label} {_rank_or_na(by_config[(recommendation.configuration, c)])}"
        for c in CRITERIA
        if c != recommendation.criterion and (recommendation.configuration, c) in by_config
    ]
    if others:
        sentences.append(f"The other criteria rank it: {', '.join(others)} of {len(order)}.")
    overlap = _plasticity_overlap(by_config, order, recommendation)
    if overlap:
        sentences.append(overlap)
    sentences.append(heuristic)
    return " ".join(sentences)


def _rank_or_na(row: dict) -> str:
    """A table row's rank, or n/a where its value is (an n/a is ranked last, but its rank
    says nothing of the configuration)."""
    value = row["value"]
    return "n/a" if value is None or not math.isfinite(value) else str(row["rank"])


def _plasticity_overlap(
    by_config: dict[tuple[str, str], dict], order: list[str], recommendation: Recommendation
) -> str:
    """A warning when the plasticity CI of the first two configurations overlap."""
    if recommendation.criterion != "plasticity" or len(order) < 2:
        return ""
    first, second = (by_config.get((name, "plasticity")) for name in order[:2])
    if not first or not second or None in (first["ci_low"], second["ci_high"]):
        return ""
    if first["ci_low"] <= second["ci_high"]:
        return (
            f"The plasticity intervals of {configuration_label(order[0])} and "
            f"{configuration_label(order[1])} overlap: the measurement does not separate "
            "them (more pairs, --n-pairs, may)."
        )
    return ""


MATRIX_LABELS = {"spectrum_snr": "Spectrum SNR", "kappa": "kappa"}
"""How the report names the two matrix criteria."""


def undefined_notes(matrices: pl.DataFrame, features: pl.DataFrame) -> list[str]:
    """One sentence per matrix criterion, and for NFN, that is n/a for a component holding
    linear maps (so for every configuration of that component alone), saying why from the
    rows' reasons: the report never shows an n/a without one (the norms' is the NFN note's)."""
    notes = []
    matrices_only = matrices.filter(pl.col("spectrum_snr_reason") != NOT_A_MATRIX)
    for criterion, label in MATRIX_LABELS.items():
        for component in COMPONENTS:
            rows = matrices_only.filter(pl.col("component") == component)
            if rows.is_empty() or not rows[criterion].is_nan().all():
                continue
            reasons = sorted(set(rows[f"{criterion}_reason"].drop_nulls()))
            notes.append(
                f"{label} is n/a for {configuration_label(component)} (every one of its "
                f"{rows.height} weight tensors: {'; '.join(reasons)}), and so for a "
                "configuration of it alone."
            )
    for component in COMPONENTS:
        rows = features.filter(pl.col("component") == component)
        if rows.is_empty() or not rows["nfn"].is_nan().all():
            continue
        reasons = sorted(set(rows["reason"].drop_nulls())) or ["no output norm on random inputs"]
        notes.append(
            f"NFN is n/a for {configuration_label(component)} ({'; '.join(reasons)}): a "
            "configuration joining it to other linear components has the NFN of theirs, one "
            "of it alone has none."
        )
    return notes
