"""Subcommands of the ``vitplasticity`` CLI, one module per group of stages, and what several
of them share (argument types, output writers). Command modules never import each other."""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from vitplasticity.plasticity.bounds import BoundsResult
    from vitplasticity.plasticity.summary import Measurement
    from vitplasticity.report.figures import FigureSettings
    from vitplasticity.utils.io import TableKind
    from vitplasticity.utils.tracking import TrackingOptions

log = logging.getLogger(__name__)

# Exit status of a finetuning run (image or text) stopped by SIGTERM after writing its
# checkpoint (128 + SIGTERM): the scheduler sees a failed job and reruns it, which resumes.
PREEMPTED_EXIT = 143


class StoppedBySignal(SystemExit):
    """A command told to stop (SIGTERM) whose cleanup has run on the way out: the console
    script leaves at once with its code (128 + the signal), without the interpreter's
    finalisation (:func:`vitplasticity.cli.main`)."""


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a stage's model (plasticity, bounds)."""
    from vitplasticity.settings.declaration import json_argument

    parser.add_argument("--model", required=True, help="model name (config key)")
    parser.add_argument(
        "--model-spec", required=True, type=json_argument, help="its config entry, as JSON"
    )


def own_defaults(cls: type, other: type) -> dict[str, Any]:
    """The defaults of the settings fields of ``cls`` that ``other`` has not: what one kind of
    input (images or text) takes and the other does not."""
    import dataclasses

    theirs = {field.name for field in dataclasses.fields(other)}
    return {
        field.name: field.default
        for field in dataclasses.fields(cls)
        if field.name not in theirs and field.default is not dataclasses.MISSING
    }


def add_text_settings(
    parser: argparse.ArgumentParser, image: type, text: type
) -> argparse._ArgumentGroup:
    """A group "with --text" holding the flags of the ``text`` settings' fields that the
    ``image`` settings have not (how text is cut), beside the image settings' flags."""
    from vitplasticity.settings.declaration import add_settings_arguments

    group = parser.add_argument_group("with --text (a text model)")
    add_settings_arguments(group, text, only=own_defaults(text, image))
    return group


def refuse_given(args: argparse.Namespace, defaults: dict[str, Any], goes_with: str) -> None:
    """Refuse each flag (by its dest in ``defaults``) given a value other than its default:
    it goes with the other kind of input (``goes_with``) than the command was given.

    Raises:
        ValueError: naming the flags and what they go with.
    """
    given = [
        f"--{name.replace('_', '-')}"
        for name, default in defaults.items()
        if getattr(args, name) != default
    ]
    if given:
        verb = "goes" if len(given) == 1 else "go"
        raise ValueError(f"{args.command}: {', '.join(given)} {verb} with {goes_with}")


def add_measurement_outputs(parser: argparse.ArgumentParser) -> None:
    """The flags of a plasticity measurement's two tables (:func:`write_measurement`) and of
    its tracker."""
    from vitplasticity.settings.tracking import add_tracking_arguments

    parser.add_argument("--out", required=True, help="per-pair Parquet file")
    parser.add_argument("--summary", required=True, help="per-(block, component) Parquet file")
    add_tracking_arguments(parser)


def write_measurement(
    result: Measurement,
    out: str | os.PathLike[str],
    summary: str | os.PathLike[str],
    tracking_options: TrackingOptions | None = None,
    job_type: str = "plasticity",
) -> None:
    """Write a plasticity measurement: the per-pair table to ``out`` and its summary to
    ``summary``, both with the measurement's footer metadata; and send the summary's means
    to the tracker of ``tracking_options``."""
    from vitplasticity.plasticity.summary import summary_scalars
    from vitplasticity.utils.io import write_parquet

    write_parquet(out, result.pairs, result.metadata)
    write_parquet(summary, result.summary, result.metadata)
    log.info("wrote %s (%d rows) and %s", out, result.pairs.height, summary)
    model, dataset = result.metadata["model"], result.metadata["dataset"]
    config = {"model": model, "dataset": dataset, **result.metadata["provenance"]}
    track_summary(
        tracking_options, job_type, f"{model}/{dataset}", config, summary_scalars(result.summary)
    )


def track_summary(
    tracking_options: TrackingOptions | None,
    job_type: str,
    name: str,
    config: dict[str, Any],
    summary: dict[str, Any],
) -> None:
    """Send one job's summary to a tracker run of its own (none without a backend): named
    ``<job_type>/<name>``, grouped by its job type."""
    from vitplasticity.utils.tracking import TrackedJob, tracking

    job = TrackedJob(f"{job_type}/{name}", job_type, job_type, config)
    with tracking(tracking_options, job) as tracker:
        tracker.log_summary(summary)


# -- the report commands' inputs and footers ------------------------------------------------


def check_inputs(paths: Sequence[str]) -> None:
    """Raise FileNotFoundError naming every one of ``paths`` that is not a file."""
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"input file(s) not found: {', '.join(missing)}")


def input_remedy(path: str | os.PathLike[str], expected: str) -> str:
    """What to do about a report input that cannot be read or is the wrong kind of table."""
    return f"give {expected}; if the workflow wrote {path}, delete it and rerun"


def parquet_is_demo(paths: Sequence[str]) -> bool:
    """Whether any of the Parquet files ``paths`` is marked demo in its footer."""
    from vitplasticity.utils.io import read_parquet_metadata

    return any(bool(read_parquet_metadata(p).get("demo", False)) for p in paths)


def read_frames(
    paths: Sequence[str], kind: TableKind | None = None, columns: Sequence[str] = ()
) -> pl.DataFrame:
    """The result tables ``paths`` of ``kind`` stacked (columns matched by name; missing ones
    null).

    Args:
        paths: the files.
        kind: what they should be (its name and column types, from the module writing it);
            None: any table the workflow writes.
        columns: columns each must have (what the command uses).

    Raises:
        FileNotFoundError: naming every missing file.
        UnreadableFileError: naming a damaged file, one without ``columns``, with a column of
            another type or without rows, and what to give instead.
    """
    import polars as pl

    from vitplasticity.utils.io import TableKind, read_result_table

    kind = kind or TableKind("Parquet tables written by the workflow", {}, needs_rows=False)
    check_inputs(paths)
    frames = [
        read_result_table(path, kind, columns, input_remedy(path, kind.name)) for path in paths
    ]
    return pl.concat(frames, how="diagonal_relaxed")


def report_record(settings: dict[str, Any], demo: bool) -> dict[str, Any]:
    """Footer metadata of a report Parquet file (provenance without importing torch)."""
    from vitplasticity.provenance import git_commit, versions

    return {
        "demo": demo,
        "settings": settings,
        "versions": versions(),
        "git_commit": git_commit(),
    }


def add_figure_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every figure command shares: config ``report.figures`` (its defaults are
    :class:`vitplasticity.report.figures.FigureSettings`'), --demo and the output files."""
    parser.add_argument("--width-in", type=float, default=3.4, help="figure width (inches)")
    parser.add_argument("--dpi", type=int, default=200, help="raster resolution")
    parser.add_argument("--context", default="paper", help="seaborn context")
    parser.add_argument("--demo", action="store_true", help="mark the figure as a demo")
    parser.add_argument("--out", nargs="+", required=True, help="output files (.pdf/.png/.svg)")


def figure_settings(args: argparse.Namespace) -> FigureSettings:
    """The FigureSettings of :func:`add_figure_arguments`' options."""
    from vitplasticity.report.figures import FigureSettings

    return FigureSettings(args.width_in, args.dpi, args.context)


def write_bounds(args: argparse.Namespace, result: BoundsResult) -> None:
    """Write a bounds result to ``--out`` (and its figure at ``--figure-prefix``), and log what
    its bounds assumed: the tokens' extreme values and every undefined component's reason.
    The bounds command ends here, on images and on text."""
    from vitplasticity.utils.io import write_parquet

    write_parquet(args.out, result.table, result.metadata)
    if args.figure_prefix:
        from vitplasticity.report.figures import bounds_figure

        outputs = [f"{args.figure_prefix}.{suffix}" for suffix in ("pdf", "png")]
        bounds_figure(
            result.table, outputs, demo=args.demo, title=args.model, undefined=result.undefined
        )
    stats = result.stats
    log.info(
        "wrote %s (min token std %.3g, r=%.3g, E=%.3g over %d sequences)%s",
        args.out,
        math.sqrt(stats.min_variance),
        stats.radius,
        stats.energy,
        stats.n_sequences,
        "".join(f"; no bound for {c}: {reason}" for c, reason in result.undefined.items()),
    )


def check_out_prefix(prefix: str, suffixes: Iterable[str]) -> None:
    """Raise unless every output ``prefix``<suffix> can be written (checked when the command
    starts, not after the measurement).

    Raises:
        ValueError: for a prefix that names a folder (the outputs are files beside it).
        WriteError: for an output that cannot be written, naming it and the reason.
    """
    from vitplasticity.utils.io import check_writable

    path = Path(prefix)
    if str(prefix).endswith("/") or path.name in ("", ".", "..") or path.is_dir():
        raise ValueError(
            f"--out-prefix {prefix}: a folder, but the outputs are files PREFIX.md, "
            f"PREFIX.json, ...: give the folder and a name, e.g. {path / 'NAME'}"
        )
    for suffix in suffixes:
        check_writable(f"{prefix}{suffix}", "--out-prefix")


def run_source(args: argparse.Namespace) -> Any:
    """What the runs train on: the prepared folder, or the text file or labelled text cut as
    the text flags say (:class:`~vitplasticity.finetune.text_run.TextSource`); a command
    without ``--text`` (recommend-verify) takes the other two.

    Raises:
        ValueError: for a text flag given with --dataset-dir (an image dataset has no text).
    """
    from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
    from vitplasticity.settings.declaration import settings_from_args

    text_only = own_defaults(TextFinetuneSettings, TrainingSettings)
    text_file = getattr(args, "text", None)
    if text_file is None and args.labelled_text is None:
        refuse_given(
            args,
            text_only,
            "--text or --labelled-text (a text dataset's; --dataset-dir is an image's)",
        )
        return args.dataset_dir
    if args.labelled_text is not None:
        masks = {"mask_probability": text_only["mask_probability"]}
        refuse_given(args, masks, "--text (an encoder's masked-LM loss; a classifier masks none)")
    text = settings_from_args(TextFinetuneSettings, args)
    from vitplasticity.finetune.text_run import TextSource

    if args.labelled_text is not None:
        return TextSource(text, Path(args.labelled_text), args.dataset, labelled=True)
    return TextSource(text, Path(text_file), args.dataset)
