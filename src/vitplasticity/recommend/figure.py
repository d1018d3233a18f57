"""The recommendation figure: one panel per criterion and one of trainable parameters.

Configurations run down the shared y axis in the order of the chosen criterion (best on
top), each bar in its component's colour (:mod:`vitplasticity.report.style`; combinations
grey), plasticity with its 95% CI, each bar labelled with its rank by that panel's criterion
(rank 1 is the lowest NFN: its panel says so) or "n/a" where the criterion has no value (the
norms' NFN). The recommended configuration's name is bold; the budget is a dashed line on the
parameter panel. Saved as PNG and PDF with :func:`vitplasticity.report.figures.save` (atomic).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import polars as pl

from vitplasticity.criteria import REGISTRY
from vitplasticity.recommend.criteria import CRITERIA
from vitplasticity.recommend.ranking import Recommendation, configuration_label
from vitplasticity.report.figures import FigureSettings, save
from vitplasticity.report.style import apply_theme, colour, mark_demo

PANEL_WIDTH_IN = 2.0
ROW_HEIGHT_IN = 0.32


def draw(
    table: pl.DataFrame, recommendation: Recommendation, *, title: str, demo: bool = False
) -> Any:
    """The figure of a recommendation table (see the module docstring)."""
    import matplotlib.pyplot as plt

    apply_theme("paper")
    order = (
        table.filter(pl.col("criterion") == recommendation.criterion)
        .sort("rank")["configuration"]
        .to_list()
    )
    labels = [configuration_label(name) for name in order]
    panels = [*CRITERIA, "trainable_parameters"]
    figure, axes = plt.subplots(
        1,
        len(panels),
        sharey=True,
        figsize=(PANEL_WIDTH_IN * len(panels), 1.2 + ROW_HEIGHT_IN * len(order)),
    )
    palette = {label: colour(name) for name, label in zip(order, labels, strict=True)}
    for ax, panel in zip(axes, panels, strict=True):
        if panel == "trainable_parameters":
            data = _parameters_axis(ax, table, recommendation)
            values = [float(data[name]["trainable_parameters"]) for name in order]
        else:
            data = _criterion_axis(ax, table, panel)
            values = [data[name]["value"] for name in order]
        _bars(ax, labels, values, palette)
        if panel != "trainable_parameters":
            _error_bars(ax, [data[name] for name in order])  # where a value has a CI
            _rank_labels(ax, values, [data[name]["rank"] for name in order])
        ax.set_ylabel("")
        ax.margins(x=0.18)
    _bold_recommendation(axes[0], recommendation)
    figure.tight_layout(rect=(0, 0, 1, 0.88 if demo else 0.94))
    if demo:
        mark_demo(figure)  # the red DEMO line on top, the title below it
        figure.text(0.5, 0.9, title, ha="center", va="bottom", fontsize="medium")
    else:
        figure.suptitle(title, fontsize="medium")
    return figure


def _bars(ax: Any, labels: list[str], values: list[float], palette: dict[str, Any]) -> None:
    """One horizontal bar per configuration (its label), coloured by ``palette``."""
    import seaborn as sns

    frame = pl.DataFrame({"configuration": labels, "value": values})
    sns.barplot(
        frame.to_pandas(),
        x="value",
        y="configuration",
        hue="configuration",
        palette=palette,
        legend=False,
        ax=ax,
    )


def _rows(table: pl.DataFrame, criterion: str) -> dict[str, dict]:
    """The rows of ``criterion`` in the table, by configuration."""
    rows = table.filter(pl.col("criterion") == criterion)
    return {row["configuration"]: row for row in rows.iter_rows(named=True)}


def _parameters_axis(ax: Any, table: pl.DataFrame, recommendation: Recommendation) -> dict:
    """Set up the trainable-parameters panel (log scale, the budget's line); the rows of the
    recommendation's criterion, by configuration."""
    ax.set_xscale("log")
    ax.set_xlabel("trainable parameters")
    if recommendation.budget:
        ax.axvline(recommendation.budget, color="#C00000", linestyle="--", linewidth=1)
        ax.text(
            recommendation.budget,
            -0.6,
            "budget",
            color="#C00000",
            fontsize="x-small",
            ha="center",
            va="bottom",
        )
    return _rows(table, recommendation.criterion)


def _criterion_axis(ax: Any, table: pl.DataFrame, criterion: str) -> dict:
    """Label the panel of ``criterion`` (which end ranks first); its rows, by configuration."""
    entry = REGISTRY[criterion]
    ax.set_xlabel(entry.label + (" (rank 1: lowest)" if entry.lower_first else ""))
    return _rows(table, criterion)


def _rank_labels(ax: Any, values: Sequence[float], ranks: Sequence[int]) -> None:
    """Each bar's rank beside it ("n/a" at 0 for a value that is not finite)."""
    for y, (value, rank) in enumerate(zip(values, ranks, strict=True)):
        finite = math.isfinite(value)
        ax.annotate(
            f"{rank}" if finite else "n/a",
            (value if finite else 0.0, y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize="x-small",
        )


def _error_bars(ax: Any, rows: Sequence[dict]) -> None:
    for y, row in enumerate(rows):
        if row["ci_low"] is None or row["ci_high"] is None:
            continue
        ax.errorbar(
            row["value"],
            y,
            xerr=[[row["value"] - row["ci_low"]], [row["ci_high"] - row["value"]]],
            color="black",
            capsize=2,
            linewidth=0.8,
        )


def _bold_recommendation(ax: Any, recommendation: Recommendation) -> None:
    """The recommended configuration's name in bold on the shared y axis."""
    if recommendation.configuration is None:
        return
    chosen = configuration_label(recommendation.configuration)
    for tick in ax.get_yticklabels():
        if tick.get_text() == chosen:
            tick.set_fontweight("bold")


def save_figure(
    table: pl.DataFrame,
    recommendation: Recommendation,
    outputs: Sequence[str | os.PathLike[str]],
    *,
    title: str,
    demo: bool = False,
) -> None:
    """Draw and write the figure to each of ``outputs`` (format from the extension)."""
    save(draw(table, recommendation, title=title, demo=demo), outputs, FigureSettings())
