"""The verified report: what the verification measured beside what the criteria predicted.

``PREFIX_verified.parquet`` (one row per verified configuration: measured validation accuracy,
mean and spread over seeds, at the full budget; trainable parameters; why it was verified; its
predicted rank under every criterion), ``PREFIX_verified.md`` (that table, Spearman's rho and
the top-1 hit per criterion, the compute spent beside the full grid's, the recommendation by
measured accuracy within the parameter budget) and ``PREFIX_verified.png``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
from scipy import stats

from vitplasticity.report.figures import FigureSettings, save
from vitplasticity.report.style import apply_theme, colour, mark_demo
from vitplasticity.utils.io import atomic_path, write_parquet

MEASURED_SCHEMA: dict[str, pl.DataType] = {
    "configuration": pl.String(),
    "reasons": pl.String(),
    "lr": pl.Float64(),
    "seeds": pl.Int64(),
    "val_accuracy_mean": pl.Float64(),
    "val_accuracy_std": pl.Float64(),
    "test_accuracy_mean": pl.Float64(),
    "trainable_parameters": pl.Int64(),
}
"""The measured columns of the verified table; one ``rank_<criterion>`` column per criterion
follows (null where the criterion does not rank the configuration)."""


@dataclass(frozen=True)
class CriterionScore:
    """How well one criterion's ranking predicted the measured accuracy."""

    criterion: str
    ranked: int  # verified configurations the criterion ranks
    spearman: float | None  # rho of (-rank) against measured accuracy; None: see note
    top1_hit: bool | None  # its first verified pick is the most accurate it ranks
    note: str


def measured_table(
    summaries: Sequence[Mapping[str, Any]],
    reasons: Mapping[str, Sequence[str]],
    ranks: pl.DataFrame,
) -> pl.DataFrame:
    """One row per verified configuration from the summaries of its full-budget runs (the
    selected learning rate, every seed), with its predicted rank under every criterion.

    Args:
        summaries: summary.json of each full-budget run of the selected learning rates.
        reasons: configuration -> why it was verified.
        ranks: recommend's table (``configuration, criterion, rank``).
    """
    by_configuration: dict[str, list[Mapping[str, Any]]] = {}
    for run in summaries:
        by_configuration.setdefault(run["configuration"], []).append(run)
    rows = []
    for configuration, runs in by_configuration.items():
        val = [r["best_val_accuracy"] for r in runs if r["best_val_accuracy"] is not None]
        test = [r["test_accuracy"] for r in runs if r["test_accuracy"] is not None]
        rows.append(
            {
                "configuration": configuration,
                "reasons": "; ".join(reasons.get(configuration, ())),
                "lr": float(runs[0]["lr"]),
                "seeds": len(runs),
                "val_accuracy_mean": statistics.fmean(val) if val else None,
                "val_accuracy_std": statistics.stdev(val) if len(val) > 1 else None,
                "test_accuracy_mean": statistics.fmean(test) if test else None,
                "trainable_parameters": int(runs[0]["trainable_parameters"]),
            }
        )
    table = pl.DataFrame(rows, schema=MEASURED_SCHEMA)
    for criterion in sorted(set(ranks["criterion"].to_list())):
        of = ranks.filter(pl.col("criterion") == criterion)
        rank = dict(zip(of["configuration"].to_list(), of["rank"].to_list(), strict=True))
        table = table.with_columns(
            pl.Series(
                f"rank_{criterion}",
                [rank.get(c) for c in table["configuration"].to_list()],
                dtype=pl.Int64(),
            )
        )
    return table.sort("val_accuracy_mean", descending=True, nulls_last=True)


def criterion_scores(table: pl.DataFrame) -> list[CriterionScore]:
    """Spearman's rho (scipy) of each criterion's predicted order against the measured mean
    validation accuracy, over the verified configurations it ranks, and whether its best
    ranked one is the most accurate of them (ties in accuracy count as a hit)."""
    scores = []
    for column in [c for c in table.columns if c.startswith("rank_")]:
        criterion = column.removeprefix("rank_")
        ranked = table.filter(
            pl.col(column).is_not_null() & pl.col("val_accuracy_mean").is_not_null()
        )
        n = ranked.height
        if n < 2:
            scores.append(
                CriterionScore(criterion, n, None, None, f"{n} verified configuration ranked")
            )
            continue
        accuracy, order = ranked["val_accuracy_mean"].to_list(), ranked[column].to_list()
        first = ranked.sort(column).row(0, named=True)
        hit = first["val_accuracy_mean"] == max(accuracy)
        if len(set(accuracy)) == 1 or len(set(order)) == 1:  # rho is undefined, not 0
            scores.append(CriterionScore(criterion, n, None, hit, "constant accuracy or rank"))
            continue
        rho = stats.spearmanr([-r for r in order], accuracy).statistic
        scores.append(CriterionScore(criterion, n, float(rho), hit, ""))
    return scores


def recommendation(table: pl.DataFrame, budget: int | None) -> dict[str, Any] | None:
    """The most accurate verified configuration (mean validation accuracy) whose trainable
    parameters fit ``budget`` (None: no budget); None when none fits."""
    fits = table.filter(pl.col("val_accuracy_mean").is_not_null())
    if budget is not None:
        fits = fits.filter(pl.col("trainable_parameters") <= budget)
    if fits.is_empty():
        return None
    return fits.sort(["val_accuracy_mean", "trainable_parameters"], descending=[True, False]).row(
        0, named=True
    )


def _number(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(
    table: pl.DataFrame,
    scores: Sequence[CriterionScore],
    compute: Mapping[str, Any],
    chosen: Mapping[str, Any] | None,
    budget: int | None,
    *,
    title: str,
    demo: bool,
) -> str:
    """The verified report as Markdown (see the module docstring)."""
    ranks = [c for c in table.columns if c.startswith("rank_")]
    lines = [f"# Verified recommendation: {title}", ""]
    if demo:
        lines += ["**DEMO**: a tiny random-init model on synthetic data; says nothing real.", ""]
    header = ["configuration", "val acc (mean)", "sd", "seeds", "lr", "trainable", *ranks, "why"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.iter_rows(named=True):
        cells = [
            row["configuration"],
            _number(row["val_accuracy_mean"]),
            _number(row["val_accuracy_std"]),
            str(row["seeds"]),
            repr(row["lr"]),
            f"{row['trainable_parameters']:,}",
            *["n/a" if row[c] is None else str(row[c]) for c in ranks],
            row["reasons"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## How well each criterion predicted it", ""]
    lines += ["| criterion | ranked | Spearman rho | top-1 hit | note |", "|---|---|---|---|---|"]
    for s in scores:
        hit = "n/a" if s.top1_hit is None else ("yes" if s.top1_hit else "no")
        lines.append(
            f"| {s.criterion} | {s.ranked} | {_number(s.spearman, 3)} | {hit} | {s.note} |"
        )
    lines += ["", "## Compute", ""]
    lines.append(
        f"{compute['verify_steps']:,} optimizer steps spent against {compute['grid_steps']:,} "
        f"for the full grid of the same configurations x learning rates x seeds "
        f"({100 * compute['verify_steps'] / compute['grid_steps']:.1f}%)."
    )
    if compute.get("verify_gpu_hours") is not None:
        lines.append(
            f"Estimated GPU-hours (runtime model, docs/slurm.md): "
            f"{compute['verify_gpu_hours']:.2f} against {compute['grid_gpu_hours']:.2f}."
        )
    lines += ["", "## Recommendation (measured)", ""]
    within = "" if budget is None else f" within {budget:,} trainable parameters"
    if chosen is None:
        lines.append(f"No verified configuration fits{within}.")
    else:
        lines.append(
            f"**{chosen['configuration']}**: the highest measured validation accuracy "
            f"({_number(chosen['val_accuracy_mean'])}, lr {chosen['lr']!r}, "
            f"{chosen['seeds']} seed(s)){within}."
        )
    return "\n".join(lines) + "\n"


def draw(table: pl.DataFrame, *, title: str, demo: bool) -> Any:
    """Bars of the measured mean validation accuracy per configuration, the spread over
    seeds as error bars, most accurate on top."""
    import matplotlib.pyplot as plt

    apply_theme("paper")
    rows = table.filter(pl.col("val_accuracy_mean").is_not_null()).to_dicts()
    figure, ax = plt.subplots(figsize=(4.5, 1.0 + 0.32 * max(len(rows), 1)))
    names = [r["configuration"] for r in rows][::-1]
    means = [r["val_accuracy_mean"] for r in rows][::-1]
    spread = [r["val_accuracy_std"] or 0.0 for r in rows][::-1]
    ax.barh(names, means, xerr=spread, color=[colour(n) for n in names])
    ax.set_xlabel("validation accuracy at the full budget")
    ax.set_title(title, fontsize="small")
    if demo:
        mark_demo(figure)
    figure.tight_layout()
    return figure


def write_report(
    prefix: str | Path,
    table: pl.DataFrame,
    compute: Mapping[str, Any],
    budget: int | None,
    *,
    title: str,
    demo: bool,
) -> dict[str, Any] | None:
    """Write ``PREFIX_verified.{parquet,md,png}``; return the measured recommendation."""
    prefix = Path(prefix)
    scores = criterion_scores(table)
    chosen = recommendation(table, budget)
    base = prefix.parent / f"{prefix.name}_verified"
    write_parquet(
        base.with_suffix(".parquet"),
        table,
        metadata={"compute": dict(compute), "budget": budget, "recommendation": chosen},
    )
    with atomic_path(base.with_suffix(".md")) as tmp:
        tmp.write_text(markdown(table, scores, compute, chosen, budget, title=title, demo=demo))
    save(draw(table, title=title, demo=demo), [base.with_suffix(".png")], FigureSettings())
    return chosen
