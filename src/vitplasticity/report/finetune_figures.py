"""The finetuning figures: accuracy bars, the LR x seed robustness boxplot, training curves
and one optimizer against another; the figures' common frame and style are :mod:`.figures`'s.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from vitplasticity.report.figures import (
    DEFAULT_SETTINGS,
    FigureSettings,
    coloured_boxplot,
    finish,
    label_left,
    panels,
)
from vitplasticity.report.style import apply_theme, colour, configuration_order, label


def _cells(table: pl.DataFrame) -> list[tuple[str, str]]:
    return table.select("model", "dataset").unique(maintain_order=True).rows()


def _cell_title(model: str, dataset: str, several_models: bool) -> str:
    return f"{model}: {dataset}" if several_models else dataset


def _data_limits(low: np.ndarray, high: np.ndarray) -> tuple[float, float]:
    """Y limits from the data alone: its span plus a margin (accuracies differ by little).

    Values in accuracy points; a span under one point (all configurations equal) is widened to
    one point so that the axis still reads as accuracy, not as rounding noise.
    """
    lo, hi = float(np.nanmin(low)), float(np.nanmax(high))
    margin = max(hi - lo, 1.0) * 0.15
    return lo - margin, hi + margin


def accuracy_bars(
    selected: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = DEFAULT_SETTINGS,
    demo: bool = False,
) -> None:
    """Selected-LR test accuracy per configuration: bars (seed mean) with seed-std error bars.

    One panel per (model, dataset). The y axis spans the data (bars do not start at 0: the
    configurations differ by a few points).
    """
    cells = _cells(selected)
    several = selected["model"].n_unique() > 1
    order = configuration_order(selected["configuration"].to_list())
    figure, axes = panels(len(cells), settings, ncols=2, aspect=0.8)
    for ax, (model, dataset) in zip(axes, cells, strict=True):
        rows = {
            r["configuration"]: r
            for r in selected.filter(
                (pl.col("model") == model) & (pl.col("dataset") == dataset)
            ).iter_rows(named=True)
        }
        names = [c for c in order if c in rows]
        mean = np.array(
            [
                np.nan
                if rows[c]["test_accuracy_mean"] is None
                else 100 * rows[c]["test_accuracy_mean"]
                for c in names
            ]
        )
        std = np.array(
            [
                0.0 if rows[c]["test_accuracy_std"] is None else 100 * rows[c]["test_accuracy_std"]
                for c in names
            ]
        )
        x = np.arange(len(names))
        ax.bar(x, np.nan_to_num(mean, nan=0.0), color=[colour(c) for c in names], width=0.75)
        ax.errorbar(x, mean, yerr=std, fmt="none", ecolor="black", elinewidth=0.8, capsize=1.5)
        if np.isfinite(mean).any():
            ax.set_ylim(*_data_limits(mean - std, mean + std))
        ax.set_xticks(x, [label(c) for c in names], rotation=90)
        ax.set_title(_cell_title(model, dataset, several))
    label_left(axes, 2, "Test accuracy (%)")
    finish(figure, demo, outputs, settings)


def robustness_boxplot(
    runs: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = DEFAULT_SETTINGS,
    demo: bool = False,
) -> None:
    """Test accuracy of every LR x seed run, boxplot per configuration; panel per dataset.

    Diverged runs have no accuracy: they are left out and counted under the tick label.
    """

    cells = _cells(runs)
    several = runs["model"].n_unique() > 1
    order = configuration_order(runs["configuration"].to_list())
    figure, axes = panels(len(cells), settings, ncols=2, aspect=0.9)
    for ax, (model, dataset) in zip(axes, cells, strict=True):
        rows = runs.filter((pl.col("model") == model) & (pl.col("dataset") == dataset))
        names = [c for c in order if c in set(rows["configuration"])]
        diverged = dict(rows.group_by("configuration").agg(pl.col("diverged").sum()).rows())
        data = rows.filter(pl.col("test_accuracy").is_not_null()).with_columns(
            accuracy=100 * pl.col("test_accuracy")
        )
        coloured_boxplot(
            ax, data.to_pandas(), "configuration", "accuracy", names, linewidth=0.7, fliersize=1.5
        )
        ticks = [label(c) + (f"\n({diverged[c]} div.)" if diverged.get(c) else "") for c in names]
        ax.set_xticks(range(len(names)), ticks, rotation=90)
        ax.set_xlabel("")
        ax.set_title(_cell_title(model, dataset, several))
    label_left(axes, 2, "Test accuracy (%)")
    finish(figure, demo, outputs, settings)


def training_curves(
    metrics: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = DEFAULT_SETTINGS,
    demo: bool = False,
    title: str = "",
) -> None:
    """Gradient norm (train rows) and validation loss (val rows) against step, one line per LR.

    ``metrics`` stacks the runs' metrics with their ``configuration``, ``run_lr`` (the run's
    peak LR; ``lr`` is the scheduled LR at each step) and ``seed``; seeds are averaged. One
    row of panels per configuration. Non-finite values (diverged runs) are dropped.
    """
    import seaborn as sns

    order = configuration_order(metrics["configuration"].to_list())
    lrs = sorted(metrics["run_lr"].unique().to_list())
    lr_palette = dict(zip(lrs, sns.color_palette("viridis", len(lrs)), strict=True))
    lr_names = {v: f"{v:g}" for v in lrs}  # as in run paths (finetune.run.lr_label)
    figure, axes = panels(2 * len(order), settings, ncols=2, aspect=0.85)
    quantities = (("train", "grad_norm", "Gradient norm"), ("val", "val_loss", "Val. loss"))
    for index, configuration in enumerate(order):
        for column, (kind, field, name) in enumerate(quantities):
            ax = axes[2 * index + column]
            data = metrics.filter(
                (pl.col("configuration") == configuration)
                & (pl.col("kind") == kind)
                & pl.col(field).is_finite()
            ).with_columns(LR=pl.col("run_lr").replace_strict(lr_names, return_dtype=pl.String))
            _curve_panel(ax, data, field, lr_palette, legend=index == 0 and column == 0)
            ax.set_ylabel(name)
            ax.set_xlabel("Step" if index == len(order) - 1 else "")
            ax.set_title(label(configuration), color=colour(configuration), fontweight="bold")
    _lr_legend_below(figure, axes[0], title, len(lrs))
    finish(figure, demo, outputs, settings)


def _curve_panel(
    ax: Any, data: pl.DataFrame, field: str, lr_palette: dict[float, Any], legend: bool
) -> None:
    """One quantity of one configuration against step, a line per peak LR (``data``'s
    ``LR``); a note instead when nothing is finite."""
    import seaborn as sns

    if data.is_empty():
        ax.text(
            0.5,
            0.5,
            "no finite values",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize="small",
        )
        return
    sns.lineplot(
        data=data.to_pandas(),
        x="step",
        y=field,
        hue="LR",
        hue_order=[f"{v:g}" for v in lr_palette],
        palette={f"{k:g}": v for k, v in lr_palette.items()},
        errorbar=None,
        ax=ax,
        linewidth=0.9,
        legend=legend,
    )


def _lr_legend_below(figure: Any, first: Any, title: str, n_lrs: int) -> None:
    """Move the first panel's LR legend below the figure: one legend for the whole figure,
    clear of the panel titles."""
    legend = first.get_legend()
    if legend is None:
        return
    handles, names = first.get_legend_handles_labels()
    legend.remove()
    figure.legend(
        handles,
        names,
        title=f"{title}: peak LR" if title else "Peak LR",
        loc="outside lower center",
        ncols=n_lrs,
        fontsize="x-small",
        title_fontsize="x-small",
    )


MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h"]
"""The optimizer scatter's marker of each dataset, in turn."""


def optimizer_scatter(
    first: pl.DataFrame,
    second: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = DEFAULT_SETTINGS,
    demo: bool = False,
) -> None:
    """Selected-LR test accuracy of one optimizer against another, per dataset and
    configuration (colour: configuration; marker: dataset), with the diagonal y = x.

    Raises:
        ValueError: if the two experiments share no (model, dataset, configuration).
    """
    import matplotlib.pyplot as plt

    pair = _paired_accuracies(first, second)
    x_name, y_name = pair["optimizer"][0], pair["optimizer_y"][0]
    apply_theme(settings.context)
    figure, ax = plt.subplots(
        figsize=(settings.width_in, settings.width_in * 0.9), layout="constrained"
    )
    datasets = pair["dataset"].unique(maintain_order=True).to_list()
    order = configuration_order(pair["configuration"].to_list())
    for d_index, dataset in enumerate(datasets):
        for configuration in order:
            rows = pair.filter(
                (pl.col("dataset") == dataset) & (pl.col("configuration") == configuration)
            )
            ax.scatter(
                100 * rows["x"].to_numpy(),
                100 * rows["y"].to_numpy(),
                color=colour(configuration),
                marker=MARKERS[d_index % len(MARKERS)],
                s=18,
                edgecolors="black",
                linewidths=0.3,
            )
    values = 100 * np.concatenate([pair["x"].to_numpy(), pair["y"].to_numpy()])
    lo, hi = _data_limits(values, values)
    ax.plot([lo, hi], [lo, hi], color="0.4", linewidth=0.7, linestyle="--", zorder=0)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel(f"{x_name} test accuracy (%)")
    ax.set_ylabel(f"{y_name} test accuracy (%)")
    _scatter_legend(ax, order, datasets)
    finish(figure, demo, outputs, settings)


def _paired_accuracies(first: pl.DataFrame, second: pl.DataFrame) -> pl.DataFrame:
    """The (model, dataset, configuration) cells both experiments have results for: their
    accuracies ``x`` and ``y`` and optimizers ``optimizer`` and ``optimizer_y``."""
    keys = ["model", "dataset", "configuration"]
    pair = (
        first.select(*keys, "optimizer", x="test_accuracy_mean")
        .join(second.select(*keys, y="test_accuracy_mean", optimizer_y="optimizer"), on=keys)
        .drop_nulls(["x", "y"])
    )
    if pair.is_empty():
        raise ValueError(
            f"experiments {first['experiment'][0]!r} and {second['experiment'][0]!r} share no "
            "(model, dataset, configuration) with results"
        )
    return pair


def _scatter_legend(ax: Any, order: list[str], datasets: list[str]) -> None:
    """A legend right of the axes: each configuration's colour, then each dataset's marker."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="o", linestyle="", color=colour(c), label=label(c)) for c in order
    ]
    handles += [
        Line2D([], [], marker=MARKERS[i % len(MARKERS)], linestyle="", color="0.3", label=d)
        for i, d in enumerate(datasets)
    ]
    ax.legend(handles=handles, fontsize="xx-small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
