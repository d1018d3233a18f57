"""The figures (seaborn on matplotlib's Agg backend), each a function of tables.

Every figure is sized for a paper's column (``width_in``; the height follows the number of
panels), takes its axis ranges from the data, colours each configuration with its fixed
colour (:mod:`.style`), and carries the DEMO label when ``demo`` is set. :func:`save` writes
one file per requested format, atomically.
"""

from __future__ import annotations

import contextlib
import math
import os
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from vitplasticity.components import COMPONENTS
from vitplasticity.report.plasticity_summary import pool_plasticity
from vitplasticity.report.style import (
    apply_theme,
    colour,
    configuration_order,
    label,
    mark_demo,
    palette,
)
from vitplasticity.utils.io import atomic_path

FORMATS: tuple[str, ...] = ("pdf", "png", "svg")


@dataclass(frozen=True)
class FigureSettings:
    """The ``report.figures`` config block.

    Attributes:
        width_in: figure width in inches (3.4: one column of a two-column paper).
        dpi: resolution of raster formats.
        context: seaborn context (paper, notebook, talk, poster).
    """

    width_in: float = 3.4
    dpi: int = 200
    context: str = "paper"


def save(figure: Any, outputs: Sequence[str | os.PathLike[str]], settings: FigureSettings) -> None:
    """Write ``figure`` to each output path, the format taken from its extension, and close it.

    Raises:
        ValueError: if an extension is not one of :data:`FORMATS` (before anything is written).
    """
    import matplotlib.pyplot as plt

    formats = [Path(out).suffix.lstrip(".").lower() for out in outputs]
    unknown = [str(out) for out, fmt in zip(outputs, formats, strict=True) if fmt not in FORMATS]
    if unknown:
        raise ValueError(f"unknown figure format of {', '.join(unknown)} (known: {FORMATS})")
    for out, fmt in zip(outputs, formats, strict=True):
        with atomic_path(out) as tmp:
            figure.savefig(tmp, format=fmt, dpi=settings.dpi)
    plt.close(figure)


@contextlib.contextmanager
def fixed_jitter(seed: int = 0) -> Iterator[None]:
    """Seed numpy's global RNG for the drawing inside, then give the caller's state back.

    seaborn's stripplot jitters its points with ``np.random.uniform`` (the global state), so
    without this a figure's pixels change from run to run on the same data.
    """
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def panels(n: int, settings: FigureSettings, ncols: int, aspect: float) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels on a grid ``ncols`` wide; each panel ``aspect`` tall per wide."""
    import matplotlib.pyplot as plt

    apply_theme(settings.context)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    panel_width = settings.width_in / ncols
    figure, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(settings.width_in, nrows * panel_width * aspect),
        squeeze=False,
        layout="constrained",
    )
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return figure, flat[:n]


def _label_left(axes: list[Any], ncols: int, text: str) -> None:
    """The y label on the grid's first column only: the others share its meaning."""
    for index, ax in enumerate(axes):
        ax.set_ylabel(text if index % ncols == 0 else "")


def finish(
    figure: Any, demo: bool, outputs: Sequence[str | os.PathLike[str]], s: FigureSettings
) -> None:
    """Label ``figure`` as a demo when ``demo`` is set, then :func:`save` it."""
    if demo:
        mark_demo(figure)
    save(figure, outputs, s)


def _coloured_boxplot(
    ax: Any, data: Any, x: str, y: str, order: list[str], *, linewidth: float, fliersize: float
) -> None:
    """One box per ``x`` category in ``order``, each in its component's fixed colour."""
    import seaborn as sns

    sns.boxplot(
        data=data,
        x=x,
        y=y,
        hue=x,
        order=order,
        hue_order=order,
        palette=palette(order),
        legend=False,
        saturation=1.0,  # the fixed colours, not a faded version
        ax=ax,
        linewidth=linewidth,
        fliersize=fliersize,
    )


def _components_present(names: Sequence[str]) -> list[str]:
    present = set(names)
    return [c for c in COMPONENTS if c in present] + sorted(present - set(COMPONENTS))


# --- plasticity ----------------------------------------------------------------------------


def plasticity_boxplot(
    summaries: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = FigureSettings(),
    demo: bool = False,
    title: str = "",
) -> None:
    """Boxplot over blocks of each component's plasticity; one panel per protocol.

    With several datasets, each block's plasticity pools their pairs (:func:`pool_plasticity`).
    """
    import seaborn as sns

    pooled = pool_plasticity(summaries)
    protocols = pooled["protocol"].unique(maintain_order=True).to_list()
    order = _components_present(pooled["component"].to_list())
    figure, axes = panels(len(protocols), settings, ncols=1, aspect=0.5)
    for ax, protocol in zip(axes, protocols, strict=True):
        data = pooled.filter(pl.col("protocol") == protocol).to_pandas()
        _coloured_boxplot(ax, data, "component", "mean", order, linewidth=0.8, fliersize=2)
        with fixed_jitter():
            sns.stripplot(
                data=data,
                x="component",
                y="mean",
                order=order,
                color="black",
                size=2,
                ax=ax,
                jitter=0.15,
            )
        ax.axhline(1.0, color="0.4", linewidth=0.6, linestyle="--", zorder=0)
        ax.set_xticks(range(len(order)), [label(c) for c in order])
        ax.set_xlabel("")
        ax.set_ylabel("Plasticity")
        ax.set_title(f"{title} ({protocol})" if title else protocol)
    finish(figure, demo, outputs, settings)


def plasticity_depth(
    summaries: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = FigureSettings(),
    demo: bool = False,
    title: str = "",
) -> None:
    """Plasticity against relative depth, mean with its 95% CI band, one line per component.

    Datasets are pooled (:func:`pool_plasticity`); one panel per protocol.
    """
    pooled = pool_plasticity(summaries)
    protocols = pooled["protocol"].unique(maintain_order=True).to_list()
    order = _components_present(pooled["component"].to_list())
    figure, axes = panels(len(protocols), settings, ncols=1, aspect=0.55)
    for ax, protocol in zip(axes, protocols, strict=True):
        data = pooled.filter(pl.col("protocol") == protocol).sort("relative_depth")
        for component in order:
            rows = data.filter(pl.col("component") == component)
            x, y, ci = (rows[c].to_numpy() for c in ("relative_depth", "mean", "ci95"))
            ax.plot(
                x,
                y,
                marker="o",
                markersize=2.5,
                linewidth=1.0,
                color=colour(component),
                label=label(component),
            )
            ax.fill_between(x, y - ci, y + ci, color=colour(component), alpha=0.25, linewidth=0)
        ax.axhline(1.0, color="0.4", linewidth=0.6, linestyle="--", zorder=0)
        ax.set_xlabel("Relative depth")
        ax.set_ylabel("Plasticity")
        ax.set_title(f"{title} ({protocol})" if title else protocol)
    figure.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=min(len(order), 5),
        fontsize="x-small",
        handlelength=1.2,
        columnspacing=1.0,
    )
    finish(figure, demo, outputs, settings)


# --- finetuning -----------------------------------------------------------------------------


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
    settings: FigureSettings = FigureSettings(),
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
    _label_left(axes, 2, "Test accuracy (%)")
    finish(figure, demo, outputs, settings)


def robustness_boxplot(
    runs: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = FigureSettings(),
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
        _coloured_boxplot(
            ax, data.to_pandas(), "configuration", "accuracy", names, linewidth=0.7, fliersize=1.5
        )
        ticks = [label(c) + (f"\n({diverged[c]} div.)" if diverged.get(c) else "") for c in names]
        ax.set_xticks(range(len(names)), ticks, rotation=90)
        ax.set_xlabel("")
        ax.set_title(_cell_title(model, dataset, several))
    _label_left(axes, 2, "Test accuracy (%)")
    finish(figure, demo, outputs, settings)


def training_curves(
    metrics: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = FigureSettings(),
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
    lr_names = {v: f"{v:g}" for v in lrs}  # as in run paths (config.lr_label)
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
            else:
                sns.lineplot(
                    data=data.to_pandas(),
                    x="step",
                    y=field,
                    hue="LR",
                    hue_order=[f"{v:g}" for v in lrs],
                    palette={f"{k:g}": v for k, v in lr_palette.items()},
                    errorbar=None,
                    ax=ax,
                    linewidth=0.9,
                    legend=index == 0 and column == 0,
                )
            ax.set_ylabel(name)
            ax.set_xlabel("Step" if index == len(order) - 1 else "")
            ax.set_title(label(configuration), color=colour(configuration), fontweight="bold")
    legend = axes[0].get_legend()
    if legend is not None:
        # One legend for the whole figure, below it, clear of the panel titles.
        handles, names = axes[0].get_legend_handles_labels()
        legend.remove()
        figure.legend(
            handles,
            names,
            title=f"{title}: peak LR" if title else "Peak LR",
            loc="outside lower center",
            ncols=len(lrs),
            fontsize="x-small",
            title_fontsize="x-small",
        )
    finish(figure, demo, outputs, settings)


def optimizer_scatter(
    first: pl.DataFrame,
    second: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = FigureSettings(),
    demo: bool = False,
) -> None:
    """Selected-LR test accuracy of one optimizer against another, per dataset and
    configuration (colour: configuration; marker: dataset), with the diagonal y = x.

    Raises:
        ValueError: if the two experiments share no (model, dataset, configuration).
    """
    import matplotlib.pyplot as plt

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
    x_name, y_name = pair["optimizer"][0], pair["optimizer_y"][0]
    apply_theme(settings.context)
    figure, ax = plt.subplots(
        figsize=(settings.width_in, settings.width_in * 0.9), layout="constrained"
    )
    markers = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h"]
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
                marker=markers[d_index % len(markers)],
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
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="o", linestyle="", color=colour(c), label=label(c)) for c in order
    ]
    handles += [
        Line2D([], [], marker=markers[i % len(markers)], linestyle="", color="0.3", label=d)
        for i, d in enumerate(datasets)
    ]
    ax.legend(handles=handles, fontsize="xx-small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    finish(figure, demo, outputs, settings)


# --- bounds ---------------------------------------------------------------------------------


def _log_ticks(low: float, high: float, most: int = 5) -> list[float]:
    """Tick values in [low, high] (0 < low < high) for a log axis: the powers of ten, or
    1, 2 and 5 times them when the range holds fewer than two powers of ten; at most ``most``
    (every other one dropped until they fit), always at least two."""
    exponents = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    decades = [10.0**e for e in exponents if low <= 10.0**e <= high]
    ticks = decades
    if len(decades) < 2:
        ticks = [m * 10.0**e for e in exponents for m in (1, 2, 5) if low <= m * 10.0**e <= high]
    while len(ticks) > most:
        ticks = ticks[::2]
    return ticks


NOTE_ROW_HEIGHT = 0.6
"""Height of the undefined-bounds note's row, in panel rows (about ten lines of its text)."""


def _undefined_note(figure: Any, note: Any, undefined: Mapping[str, str]) -> None:
    """Say in panel ``note``, the first of the figure's last row, which components have no
    bound and why: the panel widened over the row (a reason is a sentence, not a label) and
    the text wrapped to its width once the other panels are laid out."""
    grid = note.get_subplotspec().get_gridspec()
    if grid.ncols > 1:
        note.remove()
        note = figure.add_subplot(grid[grid.nrows - 1, :])
    note.set_axis_off()
    note.set_title("Undefined bounds", color="0.3", fontweight="bold")
    figure.draw_without_rendering()  # lays the panels out: the note's width is known
    limit = note.get_window_extent().width
    text = note.text(0.0, 1.0, "", va="top", ha="left", fontsize="xx-small")
    for characters in range(120, 15, -5):  # the longest lines that fit the panel
        lines = [
            line
            for component, reason in undefined.items()
            for line in textwrap.wrap(f"No bound for {label(component)}: {reason}", characters)
        ]
        text.set_text("\n".join(lines))
        if text.get_window_extent().width <= limit:
            break
    # A longer note than the row holds: the row and the figure grow by the difference.
    space, needed = note.get_window_extent().height, text.get_window_extent().height
    if needed > space:
        ratios = list(grid.get_height_ratios())
        ratios[-1] *= needed / space
        grid.set_height_ratios(ratios)
        width, height = figure.get_size_inches()
        figure.set_size_inches(width, height + (needed - space) / figure.dpi)


def bounds_figure(
    table: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = FigureSettings(),
    demo: bool = False,
    title: str = "",
    undefined: Mapping[str, str] | None = None,
) -> None:
    """Each component's plasticity bound (solid) and measured mean plasticity (dashed, open
    markers; the embedding protocol's, which the bounds are stated for) against block, one
    panel per component, log y axes.

    One panel each, because bounds of different components can coincide (ln1 and ln2 of a
    random-init model). ``table`` is a ``bounds`` stage table (``block``, ``component``,
    ``bound``, and ``measured_mean`` when plasticity was measured). ``undefined`` maps each
    component without a bound to the reason (the ``bounds`` stage's metadata): it has no
    panel, and a last panel says which and why.
    """
    undefined = dict(undefined or {})
    order = [c for c in _components_present(table["component"].to_list()) if c not in undefined]
    data = table.sort("block")
    blocks = sorted(set(data["block"].to_list()))
    ticks = blocks if len(blocks) <= 12 else blocks[:: max(1, len(blocks) // 8)]
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ncols = 2
    if not undefined:
        figure, axes = panels(len(order), settings, ncols=ncols, aspect=0.75)
        note = None
    else:  # the panels, then a lower row for the note
        rows = math.ceil(len(order) / ncols)
        figure, axes = panels(rows * ncols + 1, settings, ncols=ncols, aspect=0.75)
        note = axes[-1]
        for ax in axes[len(order) : -1]:
            ax.set_visible(False)
        axes = axes[: len(order)]
        note.get_subplotspec().get_gridspec().set_height_ratios([1] * rows + [NOTE_ROW_HEIGHT])
        width, height = figure.get_size_inches()
        row_height = height / (rows + 1)
        figure.set_size_inches(width, height - (1 - NOTE_ROW_HEIGHT) * row_height)
    for ax, component in zip(axes, order, strict=True):
        rows = data.filter(pl.col("component") == component)
        line = {"color": colour(component), "linewidth": 1.0, "markersize": 2.5}
        ax.plot(rows["block"], rows["bound"], marker="o", label="Bound", **line)
        if "measured_mean" in rows.columns and rows["measured_mean"].is_not_null().any():
            ax.plot(
                rows["block"],
                rows["measured_mean"],
                marker="s",
                linestyle="--",
                markerfacecolor="white",
                label="Measured (mean)",
                **line,
            )
        ax.set_yscale("log")
        values = [v for c in ("bound", "measured_mean") if c in rows.columns for v in rows[c]]
        finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
        if finite:
            # Widened 2.5x each way: a bound and its measurement often lie within one decade.
            low, high = min(finite) / 2.5, max(finite) * 2.5
            ax.set_ylim(low, high)
            ax.yaxis.set_major_locator(FixedLocator(_log_ticks(low, high)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(ticks)
        ax.set_title(label(component), color=colour(component), fontweight="bold")
    _label_left(axes, ncols, "Plasticity")
    for index, ax in enumerate(axes):
        # The x label under the last panel of each column only.
        ax.set_xlabel("Block" if index + ncols >= len(axes) else "")
    name = f"{title}: " if title else ""
    figure.legend(
        *(axes[0].get_legend_handles_labels() if axes else ([], [])),
        title=f"{name}upper bound vs. measured plasticity",
        loc="outside lower center",
        ncols=2,
        fontsize="x-small",
        title_fontsize="x-small",
    )
    if note is not None:
        _undefined_note(figure, note, undefined)
    finish(figure, demo, outputs, settings)
