"""The criteria figure: per criterion, each dataset's Spearman rho and their mean.

On :mod:`.figures`' shared helpers (:func:`.figures.panels`, :func:`.figures.finish`) and
house style.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import polars as pl

from vitplasticity.criteria import short_label
from vitplasticity.report.criteria import (
    single_experiment,
    unscored_configurations,
)
from vitplasticity.report.figures import FigureSettings, finish, fixed_jitter, panels
from vitplasticity.report.style import label

BEST_COLOUR = "#D55E00"
"""The best criterion's mean (the palette's vermillion)."""


def criteria_figure(
    result: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings | None = None,
    demo: bool = False,
) -> None:
    """Per criterion, each dataset's Spearman rho (points) and their mean (a bar); one panel
    per model. Undefined rhos are left out and counted beside the criterion's name; so are the
    configurations a criterion has no value for ("NFN (no LN1, LN2)": its rho is over the
    others).

    Args:
        result: one experiment's :func:`.criteria.analyse` result.
        outputs: one file per format (.pdf/.png/.svg).
        settings: width, resolution and seaborn context.
        demo: label the figure as a demo.
    """
    settings = settings or FigureSettings()
    experiment = single_experiment(result)
    per_dataset = result.filter(pl.col("level") == "dataset")
    summary = result.filter(pl.col("level") == "summary")
    criteria = per_dataset["criterion"].unique(maintain_order=True).to_list()
    models = per_dataset["model"].unique(maintain_order=True).to_list()
    unscored = unscored_configurations(result)
    figure, axes = panels(len(models), settings, ncols=1, aspect=0.12 * len(criteria) + 0.25)
    for ax, model in zip(axes, models, strict=True):
        rows = per_dataset.filter(pl.col("model") == model)
        ticks = _criterion_ticks(rows, model, criteria, unscored)
        _dataset_points(ax, rows, criteria, ticks)
        _mean_marks(ax, summary.filter(pl.col("model") == model), criteria)
        ax.axvline(0.0, color="0.4", linewidth=0.8, linestyle="--", zorder=1)
        ax.set_xlim(-1.08, 1.08)
        ax.set_yticks(range(len(ticks)), ticks)
        ax.set_ylim(len(ticks) - 0.5, -0.5)
        ax.set_xlabel(r"Spearman $\rho$ with test accuracy")
        ax.set_ylabel("")
        ax.set_title(f"{experiment}: {model}" if len(models) > 1 else experiment)
    _legend(figure)
    finish(figure, demo, outputs, settings)


def _legend(figure: Any) -> None:
    """What the marks are: a dataset's rho, the mean, the best criterion's mean."""
    from matplotlib.lines import Line2D

    figure.legend(
        handles=[
            Line2D([], [], marker="o", linestyle="", color="0.35", markersize=3.5, label="dataset"),
            Line2D([], [], marker="|", linestyle="", color="black", markersize=8, label="mean"),
            Line2D([], [], marker="|", linestyle="", color=BEST_COLOUR, markersize=8, label="best"),
        ],
        loc="outside lower center",
        ncols=3,
        fontsize="x-small",
        handlelength=1.0,
    )


def _criterion_ticks(
    rows: pl.DataFrame,
    model: str,
    criteria: list[str],
    unscored: dict[tuple[str, str], list[str]],
) -> list[str]:
    """Each criterion's tick label: its name, the configurations it has no value for, and how
    many datasets left its rho undefined."""
    undefined = dict(
        rows.group_by("criterion").agg(pl.col("spearman_rho").is_nan().sum()).iter_rows()
    )
    return [
        short_label(c)
        + (
            f" (no {', '.join(label(n) for n in unscored[(model, c)])})"
            if (model, c) in unscored
            else ""
        )
        + (f" ({undefined[c]} n/a)" if undefined.get(c) else "")
        for c in criteria
    ]


def _dataset_points(ax: Any, rows: pl.DataFrame, criteria: list[str], ticks: list[str]) -> None:
    """One point per dataset with a defined rho, on its criterion's row."""
    import seaborn as sns

    data = rows.filter(pl.col("spearman_rho").is_finite()).with_columns(
        name=pl.col("criterion").replace_strict(dict(zip(criteria, ticks, strict=True)))
    )
    if data.height:
        with fixed_jitter():
            sns.stripplot(
                data=data.to_pandas(),
                x="spearman_rho",
                y="name",
                order=ticks,
                color="0.35",
                size=3.5,
                jitter=0.12,
                ax=ax,
            )


def _mean_marks(ax: Any, summary: pl.DataFrame, criteria: list[str]) -> None:
    """Each criterion's mean rho as a bar across its row, the best criterion's coloured."""
    means = {r["criterion"]: r for r in summary.iter_rows(named=True)}
    for index, criterion in enumerate(criteria):
        row = means.get(criterion)
        if row is None or not math.isfinite(row["spearman_rho"]):
            continue
        ax.plot(
            [row["spearman_rho"]] * 2,
            [index - 0.32, index + 0.32],
            color=BEST_COLOUR if row["best"] else "black",
            linewidth=2.0,
            solid_capstyle="butt",
        )
