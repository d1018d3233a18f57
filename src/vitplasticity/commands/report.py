"""``aggregate``, ``concat``, ``stats``, ``table`` and ``figure``: from runs to the paper's
tables and figures.

Every output says whether it is a demo: ``--demo`` or any input marked demo (a summary's
``demo`` key, a Parquet footer's ``demo`` metadata) makes it one.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplasticity.commands import (
    add_figure_arguments,
    check_inputs,
    figure_settings,
    parquet_is_demo,
    read_frames,
    report_record,
)

if TYPE_CHECKING:
    from vitplasticity.utils.io import TableKind

log = logging.getLogger(__name__)

TABLE_KINDS: tuple[str, ...] = ("accuracy", "wilcoxon", "plasticity")
# The result tables the report commands read: per kind, the module that writes it and the
# name of its TableKind there (imported when read: the bounds and finetune writers import
# torch).
RESULT_TABLES: dict[str, tuple[str, str]] = {
    "runs": ("vitplasticity.report.aggregate", "RUNS_TABLE"),
    "selected": ("vitplasticity.report.aggregate", "SELECTED_TABLE"),
    "comparison": ("vitplasticity.report.stats", "COMPARISON_TABLE"),
    "summary": ("vitplasticity.plasticity.summary", "SUMMARY_TABLE"),
    "bounds": ("vitplasticity.plasticity.bounds", "BOUNDS_TABLE"),
    "metrics": ("vitplasticity.finetune.outputs", "METRICS_TABLE"),
}
_SELECTED = ("model", "dataset", "configuration", "test_accuracy_mean", "test_accuracy_std")
_SUMMARY = ("model", "protocol", "component", "mean", "n_pairs")
# What each table and figure kind reads and the columns it needs.
TABLE_INPUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "accuracy": ("selected", _SELECTED),
    "wilcoxon": (
        "comparison",
        ("model", "reference", "component", "alternative", "alpha", "wilcoxon_p"),
    ),
    "plasticity": ("summary", _SUMMARY),
}
FIGURE_INPUTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "plasticity-boxplot": ("summary", _SUMMARY),
    "plasticity-depth": ("summary", (*_SUMMARY, "relative_depth")),
    "accuracy": ("selected", _SELECTED),
    "robustness": ("runs", ("model", "dataset", "configuration", "diverged", "test_accuracy")),
    "optimizers": ("selected", ("optimizer", *_SELECTED)),
    "bounds": ("bounds", ("block", "component", "bound", "measured_mean")),
    "curves": ("metrics", ("step", "kind", "grad_norm", "val_loss")),
}
FIGURE_KINDS: tuple[str, ...] = (
    "plasticity-boxplot",
    "plasticity-depth",
    "accuracy",
    "robustness",
    "curves",
    "optimizers",
    "bounds",
)


def result_table(name: str) -> TableKind:
    """The kind of result table ``name`` (a key of :data:`RESULT_TABLES`), from its writer."""
    module, attribute = RESULT_TABLES[name]
    return getattr(importlib.import_module(module), attribute)


def read_tables(paths: Sequence[str], name: str, columns: Sequence[str] = ()) -> Any:
    """The result tables ``paths`` of kind ``name`` stacked, each with ``columns``
    (:func:`vitplasticity.commands.read_frames`)."""
    return read_frames(paths, result_table(name), columns)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the report stage's subcommands."""
    _add_aggregate(subparsers)
    _add_concat(subparsers)
    _add_stats(subparsers)
    _add_table(subparsers)
    _add_figure(subparsers)


def _add_aggregate(subparsers: argparse._SubParsersAction) -> None:
    """The ``aggregate`` subcommand: run summaries into a runs and a selected-LR table."""
    aggregate = subparsers.add_parser(
        "aggregate",
        help="one experiment's run summaries into a runs table and a selected-LR table",
        description="Collect summary.json files into one row per run, then pick per (model, "
        "dataset, configuration) the LR with the best seed-mean accuracy.",
    )
    aggregate.add_argument("--experiment", required=True, help="experiment name (config key)")
    aggregate.add_argument("--summaries", nargs="+", required=True, help="summary.json files")
    aggregate.add_argument("--lr-selection", choices=["val", "test"], default="val")
    aggregate.add_argument("--demo", action="store_true", help="mark the outputs as a demo")
    aggregate.add_argument("--runs-out", required=True, help="runs table (Parquet)")
    aggregate.add_argument("--selected-out", required=True, help="selected-LR table (Parquet)")
    aggregate.set_defaults(handler=run_aggregate)


def _add_concat(subparsers: argparse._SubParsersAction) -> None:
    """The ``concat`` subcommand: stack runs tables."""
    concat = subparsers.add_parser(
        "concat", help="stack several runs tables into one", description="Stack runs tables."
    )
    concat.add_argument("--inputs", nargs="+", required=True, help="runs tables (Parquet)")
    concat.add_argument("--out", required=True, help="output Parquet file")
    concat.set_defaults(handler=run_concat)


def _add_stats(subparsers: argparse._SubParsersAction) -> None:
    """The ``stats`` subcommand: the paired tests of one configuration against the others."""
    stats = subparsers.add_parser(
        "stats",
        help="Wilcoxon signed-rank and paired t-test of one configuration against the others",
        description="Pair the selected-LR test accuracies over datasets, per model.",
    )
    stats.add_argument("--selected", required=True, help="selected-LR table (Parquet)")
    stats.add_argument("--reference", default="mha", help="configuration tested against others")
    stats.add_argument("--alternative", choices=["greater", "two-sided", "less"], default="greater")
    stats.add_argument("--alpha", type=float, default=0.05, help="significance level")
    stats.add_argument("--demo", action="store_true", help="mark the output as a demo")
    stats.add_argument("--out", required=True, help="output Parquet file")
    stats.set_defaults(handler=run_stats)


def _add_table(subparsers: argparse._SubParsersAction) -> None:
    """The ``table`` subcommand: a LaTeX table (and its CSV)."""
    table = subparsers.add_parser(
        "table",
        help="a LaTeX (booktabs) table",
        description="accuracy: a selected-LR table; wilcoxon: a stats table; plasticity: "
        "plasticity summary files.",
    )
    table.add_argument("--kind", choices=TABLE_KINDS, required=True)
    table.add_argument("--inputs", nargs="+", required=True, help="input Parquet file(s)")
    table.add_argument("--experiment", default="", help="experiment name (captions, labels)")
    table.add_argument("--demo", action="store_true", help="mark the table as a demo")
    table.add_argument("--out", required=True, help="output .tex file")
    table.add_argument("--csv", help="also write the table's rows as CSV to this file")
    table.set_defaults(handler=run_table)


def _add_figure(subparsers: argparse._SubParsersAction) -> None:
    """The ``figure`` subcommand: a figure, one file per format."""
    figure = subparsers.add_parser(
        "figure",
        help="a figure, in one file per format",
        description="plasticity-boxplot/-depth: plasticity summaries; accuracy: a selected-LR "
        "table; robustness: a runs table; curves: metrics.parquet files (summary.json beside "
        "each); optimizers: two selected-LR tables; bounds: a bounds table.",
    )
    figure.add_argument("--kind", choices=FIGURE_KINDS, required=True)
    figure.add_argument("--inputs", nargs="+", required=True, help="input files")
    figure.add_argument("--title", default="", help="panel title prefix")
    add_figure_arguments(figure)
    figure.set_defaults(handler=run_figure)


def run_aggregate(args: argparse.Namespace) -> int:
    from vitplasticity.report.aggregate import collect_runs, select_learning_rates
    from vitplasticity.utils.io import write_parquet

    runs = collect_runs(args.summaries)
    other = sorted(set(runs["experiment"]) - {args.experiment})
    if other:
        raise ValueError(
            f"summaries of experiment(s) {', '.join(other)} given to --experiment {args.experiment}"
        )
    selected = select_learning_rates(runs, args.lr_selection)
    demo = args.demo or bool(runs["demo"].fill_null(False).any())
    settings = {"experiment": args.experiment, "lr_selection": args.lr_selection}
    write_parquet(args.runs_out, runs, report_record(settings, demo))
    write_parquet(args.selected_out, selected, report_record(settings, demo))
    log.info(
        "%s: %d runs (%d diverged), %d cells, LR picked on %s accuracy",
        args.experiment,
        runs.height,
        int(runs["diverged"].sum()),
        selected.height,
        args.lr_selection,
    )
    return 0


def run_concat(args: argparse.Namespace) -> int:
    from vitplasticity.report.aggregate import concat_runs
    from vitplasticity.utils.io import write_parquet

    runs = concat_runs(
        [read_tables([p], "runs", ("experiment", "lr", "seed")) for p in args.inputs]
    )
    write_parquet(
        args.out, runs, report_record({"inputs": args.inputs}, parquet_is_demo(args.inputs))
    )
    log.info("%d runs from %d tables into %s", runs.height, len(args.inputs), args.out)
    return 0


def run_stats(args: argparse.Namespace) -> int:
    from vitplasticity.report.stats import compare_selected
    from vitplasticity.utils.io import write_parquet

    selected = read_tables([args.selected], "selected", _SELECTED)
    result = compare_selected(selected, args.reference, args.alternative, args.alpha)
    demo = args.demo or parquet_is_demo([args.selected])
    settings = {"reference": args.reference, "alternative": args.alternative, "alpha": args.alpha}
    write_parquet(args.out, result, report_record(settings, demo))
    for row in result.iter_rows(named=True):
        log.info(
            "%s %s vs %s: n=%d W=%.1f p=%.4g t=%.3f p=%.4g",
            row["model"],
            args.reference,
            row["component"],
            row["n_datasets"],
            row["wilcoxon_stat"],
            row["wilcoxon_p"],
            row["ttest_stat"],
            row["ttest_p"],
        )
    return 0


def run_table(args: argparse.Namespace) -> int:
    """Write one LaTeX table (and, with --csv, its rows as CSV)."""
    from vitplasticity.report import accuracy_table, tables
    from vitplasticity.utils.io import atomic_path

    frame = read_tables(args.inputs, *TABLE_INPUTS[args.kind])
    demo = args.demo or parquet_is_demo(args.inputs)
    if args.kind == "accuracy":
        text = accuracy_table.accuracy_table(frame, demo=demo)
        rows = accuracy_table.accuracy_csv
    elif args.kind == "wilcoxon":
        text = tables.wilcoxon_table(frame, demo=demo, experiment=args.experiment)
        rows = tables.wilcoxon_csv
    else:
        text = tables.plasticity_table(frame, demo=demo)
        rows = tables.plasticity_csv
    csv = rows(frame, demo=demo) if args.csv else None
    with atomic_path(args.out) as tmp:
        tmp.write_text(text)
    if csv is not None:
        with atomic_path(args.csv) as tmp:
            tmp.write_text(csv)
    written = f"{args.out} and {args.csv}" if args.csv else args.out
    log.info("%s table (%s) written to %s", args.kind, "demo" if demo else "paper", written)
    return 0


def _read_curves(paths: Sequence[str]) -> Any:
    """Stack metrics.parquet files with their run's configuration, LR and seed (from the
    summary.json beside each)."""
    import polars as pl

    from vitplasticity.report.aggregate import read_summary

    check_inputs(paths)
    frames, demo = [], False
    for path in paths:
        summary_path = Path(path).with_name("summary.json")
        if not summary_path.is_file():
            raise FileNotFoundError(f"summary.json missing beside {path}")
        summary = read_summary(summary_path)
        demo = demo or bool(summary.get("demo", False))
        frames.append(
            read_tables([path], *FIGURE_INPUTS["curves"]).with_columns(
                configuration=pl.lit(summary["configuration"]),
                run_lr=pl.lit(float(summary["lr"])),
                seed=pl.lit(int(summary["seed"])),
            )
        )
    return pl.concat(frames, how="diagonal_relaxed"), demo


def _undefined_bounds(paths: Sequence[str]) -> dict[str, str]:
    """The components without a bound, and why, that the bounds tables ``paths`` name in
    their footer (the ``bounds`` stage's ``undefined``)."""
    from vitplasticity.utils.io import read_parquet_metadata

    undefined: dict[str, str] = {}
    for path in paths:
        undefined.update(read_parquet_metadata(path).get("undefined", {}))
    return undefined


def run_figure(args: argparse.Namespace) -> int:
    from vitplasticity.report import figures, finetune_figures

    settings = figure_settings(args)
    if args.kind == "curves":
        metrics, demo = _read_curves(args.inputs)
        finetune_figures.training_curves(metrics, args.out, settings, args.demo or demo, args.title)
    elif args.kind == "optimizers":
        if len(args.inputs) != 2:
            raise ValueError("--kind optimizers takes two selected-LR tables (--inputs A B)")
        name, columns = FIGURE_INPUTS[args.kind]
        first, second = (read_tables([path], name, columns) for path in args.inputs)
        demo = args.demo or parquet_is_demo(args.inputs)
        finetune_figures.optimizer_scatter(first, second, args.out, settings, demo)
    else:
        frame = read_tables(args.inputs, *FIGURE_INPUTS[args.kind])
        demo = args.demo or parquet_is_demo(args.inputs)
        draw = {
            "plasticity-boxplot": figures.plasticity_boxplot,
            "plasticity-depth": figures.plasticity_depth,
        }.get(args.kind)
        if draw is not None:
            draw(frame, args.out, settings, demo, args.title)
        elif args.kind == "bounds":
            undefined = _undefined_bounds(args.inputs)
            figures.bounds_figure(frame, args.out, settings, demo, args.title, undefined)
        elif args.kind == "accuracy":
            finetune_figures.accuracy_bars(frame, args.out, settings, demo)
        else:
            finetune_figures.robustness_boxplot(frame, args.out, settings, demo)
    log.info("%s figure written to %s", args.kind, ", ".join(args.out))
    return 0
