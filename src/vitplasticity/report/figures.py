"""The figures (seaborn on matplotlib's Agg backend), each a function of tables: here their
common frame (:func:`panels`, :func:`finish`, :func:`save`), the plasticity figures and the
bounds figure; the finetuning figures are :mod:`.finetune_figures`, the criteria figure
:mod:`.criteria_figure`.

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

from vitplasticity.report.plasticity_summary import pool_plasticity
from vitplasticity.report.style import (
    apply_theme,
    colour,
    component_order,
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


DEFAULT_SETTINGS = FigureSettings()
"""The defaults, for figure functions' signatures (frozen, so one instance serves them all)."""


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


def label_left(axes: list[Any], ncols: int, text: str) -> None:
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


def coloured_boxplot(
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


# --- plasticity ----------------------------------------------------------------------------


def _pooled_by_protocol(summaries: pl.DataFrame) -> tuple[pl.DataFrame, list[str], list[str]]:
    """The summaries pooled over datasets (:func:`pool_plasticity`), their protocols (one
    panel each) and their components in order."""
    pooled = pool_plasticity(summaries)
    protocols = pooled["protocol"].unique(maintain_order=True).to_list()
    return pooled, protocols, component_order(pooled["component"].to_list())


def _plasticity_panel(ax: Any, xlabel: str, title: str) -> None:
    """A plasticity panel's frame: the dashed line at 1 (no change), its labels and title."""
    ax.axhline(1.0, color="0.4", linewidth=0.6, linestyle="--", zorder=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("Plasticity")
    ax.set_title(title)


def plasticity_boxplot(
    summaries: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = DEFAULT_SETTINGS,
    demo: bool = False,
    title: str = "",
) -> None:
    """Boxplot over blocks of each component's plasticity; one panel per protocol.

    With several datasets, each block's plasticity pools their pairs (:func:`pool_plasticity`).
    """
    import seaborn as sns

    pooled, protocols, order = _pooled_by_protocol(summaries)
    figure, axes = panels(len(protocols), settings, ncols=1, aspect=0.5)
    for ax, protocol in zip(axes, protocols, strict=True):
        data = pooled.filter(pl.col("protocol") == protocol).to_pandas()
        coloured_boxplot(ax, data, "component", "mean", order, linewidth=0.8, fliersize=2)
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
        ax.set_xticks(range(len(order)), [label(c) for c in order])
        _plasticity_panel(ax, "", f"{title} ({protocol})" if title else protocol)
    finish(figure, demo, outputs, settings)


def plasticity_depth(
    summaries: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = DEFAULT_SETTINGS,
    demo: bool = False,
    title: str = "",
) -> None:
    """Plasticity against relative depth, mean with its 95% CI band, one line per component.

    Datasets are pooled (:func:`pool_plasticity`); one panel per protocol.
    """
    pooled, protocols, order = _pooled_by_protocol(summaries)
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
        _plasticity_panel(ax, "Relative depth", f"{title} ({protocol})" if title else protocol)
    figure.legend(
        *axes[0].get_legend_handles_labels(),
        loc="outside lower center",
        ncols=min(len(order), 5),
        fontsize="x-small",
        handlelength=1.2,
        columnspacing=1.0,
    )
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


def _bounds_panels(
    n: int, settings: FigureSettings, ncols: int, with_note: bool
) -> tuple[Any, list[Any], Any]:
    """The bounds figure's ``n`` panels, and with ``with_note`` a lower, shorter row whose
    first panel (returned last; else None) will say which components have no bound."""
    if not with_note:
        figure, axes = panels(n, settings, ncols=ncols, aspect=0.75)
        return figure, axes, None
    rows = math.ceil(n / ncols)
    figure, axes = panels(rows * ncols + 1, settings, ncols=ncols, aspect=0.75)
    note = axes[-1]
    for ax in axes[n:-1]:
        ax.set_visible(False)
    note.get_subplotspec().get_gridspec().set_height_ratios([1] * rows + [NOTE_ROW_HEIGHT])
    width, height = figure.get_size_inches()
    row_height = height / (rows + 1)
    figure.set_size_inches(width, height - (1 - NOTE_ROW_HEIGHT) * row_height)
    return figure, axes[:n], note


def _bound_panel(ax: Any, rows: pl.DataFrame, component: str) -> None:
    """One component's bound and measured mean against block, on a log axis fitted to them."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

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


def bounds_figure(
    table: pl.DataFrame,
    outputs: Sequence[str | os.PathLike[str]],
    settings: FigureSettings = DEFAULT_SETTINGS,
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
    order = [c for c in component_order(table["component"].to_list()) if c not in undefined]
    data = table.sort("block")
    blocks = sorted(set(data["block"].to_list()))
    ticks = blocks if len(blocks) <= 12 else blocks[:: max(1, len(blocks) // 8)]
    ncols = 2
    figure, axes, note = _bounds_panels(len(order), settings, ncols, bool(undefined))
    for ax, component in zip(axes, order, strict=True):
        _bound_panel(ax, data.filter(pl.col("component") == component), component)
        ax.set_xticks(ticks)
        ax.set_title(label(component), color=colour(component), fontweight="bold")
    label_left(axes, ncols, "Plasticity")
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
