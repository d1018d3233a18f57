"""``criteria``, ``criteria-table`` and ``criteria-figure``: which per-component criterion
predicts the measured finetuning result (:mod:`vitplasticity.report.criteria`): an image
experiment's selected-LR test accuracy, or a text experiment's validation loss, selected from
its runs (:mod:`vitplasticity.report.text_criteria`).

Every output is a demo when ``--demo`` is given or any input is marked demo.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitplasticity.commands import (
    add_figure_arguments,
    check_inputs,
    figure_settings,
    parquet_is_demo,
    read_frames,
    refuse_given,
    report_record,
)
from vitplasticity.report.settings import CriteriaSettings
from vitplasticity.settings.declaration import (
    add_settings_arguments,
    check_settings,
    settings_from_args,
)

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the criteria subcommands."""
    analyse = subparsers.add_parser(
        "criteria",
        help="rank correlation of each criterion with the finetuning result, per dataset, "
        "and tests across datasets",
        description="Score every criterion (recommend tables, measured plasticity, trainable "
        "parameters) against one experiment's result: an image experiment's selected-LR test "
        "accuracy (--selected, from `vitplasticity aggregate`), or a text experiment's "
        "validation loss (--runs: each configuration's learning rate of lowest mean "
        "validation loss over seeds, a rate with a diverged seed not selected). Spearman and "
        "Kendall per dataset, top-1 hit, and one-sided Wilcoxon tests across datasets.",
    )
    measured = analyse.add_mutually_exclusive_group(required=True)
    measured.add_argument("--selected", help="an image experiment's selected-LR table (Parquet)")
    measured.add_argument("--runs", nargs="+", help="a text experiment's runs' summary.json files")
    analyse.add_argument(
        "--recommend",
        nargs="*",
        default=[],
        help="recommend (or, with --runs, recommend --text) tables (Parquet), any number",
    )
    analyse.add_argument(
        "--plasticity",
        nargs="*",
        default=[],
        help="plasticity summaries (<dataset>_summary.parquet), any number",
    )
    # --configurations, --min-configurations, --no-parameters and --demo from CriteriaSettings
    # (the config key each mirrors in its help).
    add_settings_arguments(analyse, CriteriaSettings)
    analyse.add_argument("--out", required=True, help="result table (Parquet)")
    text = analyse.add_argument_group("with --runs (a text experiment)")
    text.add_argument("--experiment", help="the text experiment whose runs --runs are")
    text.add_argument("--selected-out", help="the selected runs (Parquet)")
    text.add_argument("--markdown", help="the report (Markdown)")
    analyse.set_defaults(handler=run_criteria)

    table = subparsers.add_parser(
        "criteria-table",
        help="the criteria correlation table (LaTeX booktabs)",
        description="Datasets x criteria (Spearman rho), with the tests across datasets.",
    )
    table.add_argument("--input", required=True, help="result of `vitplasticity criteria`")
    table.add_argument("--demo", action="store_true", help="mark the table as a demo")
    table.add_argument("--out", required=True, help="output .tex file")
    table.add_argument("--csv", help="also write the table's rows as CSV to this file")
    table.set_defaults(handler=run_criteria_table)

    figure = subparsers.add_parser(
        "criteria-figure",
        help="per criterion, each dataset's rho and their mean",
        description="One panel per model; one file per output path (.pdf/.png/.svg).",
    )
    figure.add_argument("--input", required=True, help="result of `vitplasticity criteria`")
    add_figure_arguments(figure)
    figure.set_defaults(handler=run_criteria_figure)


def _configurations(names: Sequence[str]) -> list[str] | None:
    if list(names) == ["all"]:
        return None
    if "all" in names:
        raise ValueError("--configurations all stands alone")
    return list(names)


def _criteria(args: argparse.Namespace, selected: Any, parameters: bool) -> Any:
    """The criteria frame of every given source (with ``parameters``, the trainable-parameter
    baseline too)."""
    from vitplasticity.report import criteria

    frames = []
    if args.recommend:
        frames.append(criteria.recommend_criteria(read_frames(args.recommend)))
    if args.plasticity:
        frames.append(criteria.plasticity_criteria(read_frames(args.plasticity)))
    if parameters:
        frames.append(criteria.parameter_criterion(selected))
    combined = criteria.combine_criteria(frames)
    if combined.is_empty():
        raise ValueError(
            "no criterion to score: give --recommend or --plasticity files, or drop --no-parameters"
        )
    return combined


def run_criteria(args: argparse.Namespace) -> int:
    """Score every criterion against the accuracy and write the result table (Parquet); with
    --runs, against a text experiment's validation loss (:func:`_run_text_criteria`).

    Raises:
        ValueError: for a text flag given without --runs, or one --runs lacks.
    """
    import polars as pl

    text_flags = dict.fromkeys(("experiment", "selected_out", "markdown"))
    if args.runs is not None:
        missing = [
            f"--{name.replace('_', '-')}" for name in text_flags if getattr(args, name) is None
        ]
        if missing:
            raise ValueError(f"criteria --runs: {', '.join(missing)} required")
        return _run_text_criteria(args)
    refuse_given(args, text_flags, "--runs (a text experiment's)")

    from vitplasticity.report.criteria import analyse, best_criterion_lines
    from vitplasticity.utils.io import write_parquet

    settings = check_settings(settings_from_args(CriteriaSettings, args))
    configurations = _configurations(settings.configurations)
    check_inputs([args.selected, *args.recommend, *args.plasticity])
    selected = read_frames([args.selected])
    criteria = _criteria(args, selected, settings.parameters)
    result = analyse(criteria, selected, configurations, settings.min_configurations)
    lines = best_criterion_lines(result)
    inputs = [args.selected, *args.recommend, *args.plasticity]
    demo = settings.demo or parquet_is_demo(inputs)
    recorded = {
        "selected": args.selected,
        "recommend": args.recommend,
        "plasticity": args.plasticity,
        "parameters": settings.parameters,
        "configurations": configurations,
        "min_configurations": settings.min_configurations,
    }
    write_parquet(args.out, result, {**report_record(recorded, demo), "best": lines})
    per_dataset = result.filter(pl.col("level") == "dataset")
    log.info(
        "%d criteria on %d (model, dataset) cells: %s",
        per_dataset["criterion"].n_unique(),
        per_dataset.select("model", "dataset").n_unique(),
        args.out,
    )
    for line in lines:
        log.info("%s", line)
    return 0


def run_criteria_table(args: argparse.Namespace) -> int:
    """Write the criteria table (and, with --csv, its rows as CSV)."""
    from vitplasticity.report.tables import criteria_csv, criteria_table
    from vitplasticity.utils.io import atomic_path

    frame = read_frames([args.input])
    demo = args.demo or parquet_is_demo([args.input])
    text = criteria_table(frame, demo=demo)
    csv = criteria_csv(frame, demo=demo) if args.csv else None
    with atomic_path(args.out) as tmp:
        tmp.write_text(text)
    if csv is not None:
        with atomic_path(args.csv) as tmp:
            tmp.write_text(csv)
    written = f"{args.out} and {args.csv}" if args.csv else args.out
    log.info("criteria table (%s) written to %s", "demo" if demo else "paper", written)
    return 0


def run_criteria_figure(args: argparse.Namespace) -> int:
    """Write the criteria figure, one file per output path."""
    from vitplasticity.report.criteria_figure import criteria_figure

    # matplotlib's PDF backend has fontTools log every subset font at INFO.
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    frame = read_frames([args.input])
    demo = args.demo or parquet_is_demo([args.input])
    criteria_figure(frame, args.out, figure_settings(args), demo)
    log.info("criteria figure written to %s", ", ".join(args.out))
    return 0


def _run_text_criteria(args: argparse.Namespace) -> int:
    """Select the text runs, score every criterion against them, and write the selected
    table, the result table (Parquet) and the report (Markdown)."""
    import json

    from vitplasticity.report.criteria import best_criterion_lines
    from vitplasticity.report.text_criteria import (
        absent_criteria,
        score_text_criteria,
        select_text_runs,
        text_criteria_markdown,
    )
    from vitplasticity.utils.io import atomic_path, write_parquet

    settings = check_settings(settings_from_args(CriteriaSettings, args))
    tables = [*args.recommend, *args.plasticity]
    check_inputs([*args.runs, *tables])
    summaries = []
    for path in args.runs:
        try:
            summaries.append(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not a run summary (JSON): {error}") from None
    selected = select_text_runs(summaries, args.experiment)
    criteria = _criteria(args, selected, settings.parameters)
    result = score_text_criteria(
        criteria,
        selected,
        experiment=args.experiment,
        configurations=_configurations(settings.configurations),
        min_configurations=settings.min_configurations,
    )
    demo = settings.demo or any(s.get("demo", False) for s in summaries) or parquet_is_demo(tables)
    recorded = {
        "experiment": args.experiment,
        "runs": len(args.runs),
        "recommend": args.recommend,
        "plasticity": args.plasticity,
        "parameters": settings.parameters,
        "configurations": settings.configurations,
        "min_configurations": settings.min_configurations,
    }
    lines = best_criterion_lines(result)
    write_parquet(args.selected_out, selected, report_record(recorded, demo))
    write_parquet(args.out, result, {**report_record(recorded, demo), "best": lines})
    with atomic_path(args.markdown) as tmp:
        absent = absent_criteria(criteria, selected, parameters=settings.parameters)
        tmp.write_text(text_criteria_markdown(selected, result, absent, demo=demo))
    for line in lines:
        log.info("%s", line)
    return 0
