"""The bill of ``rule all`` before anything is submitted: the GPU-hours its GPU jobs ask for, by
rule, model and precision, how many SLURM jobs they are (a pack counted once),
and how long submitting them takes. The minutes are the ``runtime`` resources the jobs ask
SLURM for (vitplasticity.workflow.costs and time_cap, first attempt), so the bill is what is
asked, not a separate guess; it covers the whole config, done or not (a rerun's finished runs
are not submitted again)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from vitplasticity.utils.io import atomic_path
from vitplasticity.workflow.config import enabled_experiments, experiment_runs
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import FinetunePack
from vitplasticity.workflow.recommend_jobs import recommend_cells

# The workflow profile gives text_plasticity no runtime of its own: it asks for
# slurm/profile.yaml's default-resources runtime (lowered to the cap like every fixed one).
DEFAULT_RUNTIME_MINUTES = 60
# slurm/profile.yaml: jobs (queued or running at once) and max-jobs-per-timespan (10/1s).
SHIPPED_JOBS_AT_ONCE = 100
SHIPPED_SUBMISSIONS_PER_SECOND = 10.0

RunMinutes = Callable[[Any, int], "int | None"]
"""A rule's runtime function: (wildcards, attempt) -> minutes, None where nothing is asked."""


@dataclass(frozen=True)
class BillLine:
    """The GPU jobs of one rule and model.

    Attributes:
        rule: the rule (``finetune`` also for packs and groups of runs).
        model: the config's model name.
        precision: what the jobs compute in (finetune.precision, plasticity.dtype).
        runs: the units of work: finetuning runs, or (model, dataset) jobs.
        minutes: the wall time they ask for together (one GPU each), first attempt.
        unestimated: runs that ask for no runtime (a model without an estimate and no
            scheduler.max_runtime_minutes: the partition's default time), not in ``minutes``.
    """

    rule: str
    model: str
    precision: str
    runs: int
    minutes: int
    unestimated: int = 0

    @property
    def gpu_hours(self) -> float:
        """``minutes`` in GPU-hours (one GPU per job)."""
        return self.minutes / 60


@dataclass(frozen=True)
class Bill:
    """The GPU side of a config's workflow, as SLURM is asked for it.

    Attributes:
        lines: one per rule and model, in rule order.
        slurm_jobs: the GPU jobs submitted (a pack or a group of runs is one).
        jobs_at_once: the profile's ``jobs`` (queued or running at once).
        submissions_per_second: the profile's submission throttle.
    """

    lines: tuple[BillLine, ...]
    slurm_jobs: int
    jobs_at_once: int = SHIPPED_JOBS_AT_ONCE
    submissions_per_second: float = SHIPPED_SUBMISSIONS_PER_SECOND

    @property
    def gpu_hours(self) -> float:
        """Every line's GPU-hours."""
        return sum(line.gpu_hours for line in self.lines)

    @property
    def submission_seconds(self) -> float:
        """Seconds the throttle alone needs to submit every job."""
        return self.slurm_jobs / self.submissions_per_second

    @property
    def last_submission_hours(self) -> float:
        """When the last job is submitted, at the earliest: with ``jobs_at_once`` queued or
        running, the jobs before the last ``jobs_at_once`` must end first, each taking the
        mean of the wall time asked (the time asked is an upper bound of a job's)."""
        if self.slurm_jobs <= self.jobs_at_once:
            return self.submission_seconds / 3600
        waiting = self.slurm_jobs - self.jobs_at_once
        return self.gpu_hours / self.slurm_jobs * waiting / self.jobs_at_once

    def text(self) -> str:
        """The bill as a Markdown table and a summary line."""
        rows = [
            "| rule | model | precision | runs | GPU-hours asked |",
            "|---|---|---|---:|---:|",
        ]
        for line in self.lines:
            hours = f"{line.gpu_hours:,.1f}"
            if line.unestimated:
                hours += f" (+{line.unestimated} at the partition's default time)"
            rows.append(
                f"| {line.rule} | {line.model} | {line.precision} | {line.runs:,} | {hours} |"
            )
        summary = (
            f"{self.gpu_hours:,.1f} GPU-hours asked in {self.slurm_jobs:,} GPU jobs; "
            f"submitted at {self.submissions_per_second:g}/s in {self.submission_seconds:,.0f} s, "
            f"the last, with {self.jobs_at_once} queued or running at once, after about "
            f"{self.last_submission_hours:,.1f} h"
        )
        return "\n".join(rows) + "\n\n" + summary + "\n"


def _wildcards(model: str, dataset: str) -> Any:
    # The runtime functions read a job's model and dataset only.
    return SimpleNamespace(model=model, dataset=dataset)


def _line(rule: str, model: str, precision: str, minutes: Iterable[int | None]) -> BillLine:
    values = list(minutes)
    asked = [m for m in values if m is not None]
    return BillLine(rule, model, precision, len(values), sum(asked), len(values) - len(asked))


def _by_model(
    rule: str, precision: str, jobs: Iterable[tuple[str, str]], runtime: RunMinutes
) -> list[BillLine]:
    minutes: dict[str, list[int | None]] = {}
    for model, dataset in jobs:
        minutes.setdefault(model, []).append(runtime(_wildcards(model, dataset), 1))
    return [_line(rule, model, precision, values) for model, values in minutes.items()]


def finetune_lines(config: dict[str, Any], runtimes: JobRuntimes) -> list[BillLine]:
    """One line per model of the enabled experiments' runs, each run's first-attempt minutes
    (JobRuntimes.finetune: what the one-run rule asks for)."""
    cells = [
        (run.model, run.dataset)
        for name in enabled_experiments(config)
        for run in experiment_runs(config, name)
    ]
    return _by_model("finetune", config["finetune"]["precision"], cells, runtimes.finetune)


def pack_lines(
    config: dict[str, Any], packs: list[FinetunePack], runtimes: JobRuntimes
) -> list[BillLine]:
    """One line per model of finetune.pack_runs' jobs (a pack's (model, dataset) each): their
    runs, and each job's first-attempt minutes (JobRuntimes.pack: one start-up allowance and
    its runs' compute); a job that asks for no runtime counts its runs as unestimated."""
    runs: dict[str, int] = {}
    minutes: dict[str, int] = {}
    unestimated: dict[str, int] = {}
    for pack in packs:
        asked = runtimes.pack(pack)
        for model, dataset in ((m, d) for m in pack.models for d in pack.datasets):
            job = asked(_wildcards(model, dataset), 1)
            runs[model] = runs.get(model, 0) + len(pack.runs)
            minutes[model] = minutes.get(model, 0) + (job or 0)
            unestimated[model] = unestimated.get(model, 0) + (0 if job else len(pack.runs))
    precision = config["finetune"]["precision"]
    return [
        BillLine("finetune", model, precision, runs[model], minutes[model], unestimated[model])
        for model in runs
    ]


def compute_bill(
    config: dict[str, Any],
    runtimes: JobRuntimes,
    *,
    packs: list[FinetunePack] | None = None,
    jobs_at_once: int = SHIPPED_JOBS_AT_ONCE,
    submissions_per_second: float = SHIPPED_SUBMISSIONS_PER_SECOND,
) -> Bill:
    """The bill of ``rule all``'s GPU jobs under ``config``.

    Args:
        config: the validated config.
        runtimes: its jobs' runtimes (the rules' own ``runtime`` functions).
        packs: finetune.pack_runs' packs as the workflow cut them (None: runs unpacked).
        jobs_at_once: the profile's ``jobs``.
        submissions_per_second: the profile's submission throttle.
    """
    if packs is not None:
        lines = pack_lines(config, packs, runtimes)
        finetune_jobs = sum(len(pack.models) * len(pack.datasets) for pack in packs)
    else:
        lines = finetune_lines(config, runtimes)
        finetune_jobs = sum(line.runs for line in lines)
    # Every (model, dataset) job, streamed or not (``stream``): a streamed measurement asks for
    # the whole one's time, which bounds it (0.74x on the CPU benchmark, docs/benchmarks.md).
    p = config["plasticity"]
    plasticity = [(m, d) for m in p["models"] for d in p["datasets"]]
    lines += _by_model("plasticity", p["dtype"], plasticity, runtimes.plasticity)
    text = config["text_plasticity"]
    text_jobs = (
        [(m, d) for m in text["run_models"] for d in text["datasets"]] if text["enabled"] else []
    )
    cap = config["scheduler"]["max_runtime_minutes"]
    fixed = min(DEFAULT_RUNTIME_MINUTES, cap) if cap else DEFAULT_RUNTIME_MINUTES
    lines += _by_model("text_plasticity", text["dtype"], text_jobs, lambda _w, _a: fixed)
    recommend = recommend_cells(config) if config["recommend"]["enabled"] else []
    lines += _by_model("recommend", "float32", recommend, runtimes.recommend)
    others = len(plasticity) + len(text_jobs) + len(recommend)
    return Bill(tuple(lines), finetune_jobs + others, jobs_at_once, submissions_per_second)


def throttle(workflow: Any) -> tuple[int, float]:
    """The jobs at once and submissions per second of a cluster run's profile (``jobs``,
    ``max-jobs-per-timespan``); slurm/profile.yaml's where the run is local or a dry run
    names no profile."""
    if workflow.local_exec:
        return SHIPPED_JOBS_AT_ONCE, SHIPPED_SUBMISSIONS_PER_SECOND
    limit = workflow.scheduling_settings.max_jobs_per_timespan
    per_second = limit.max_jobs / limit.timespan if limit else SHIPPED_SUBMISSIONS_PER_SECOND
    return int(workflow.nodes), per_second


class BillNotice:
    """``rule all``'s input function that prints the bill once and writes it to ``path``.

    Snakemake evaluates it while it builds the DAG of ``all`` (a dry run or a start, in the
    main process only).

    Args:
        workflow: Snakemake's workflow object (executor, profile throttle).
        config: the validated config.
        runtimes: its jobs' runtimes.
        packs: called for finetune.pack_runs' cut packs (None: runs unpacked).
        path: the file the bill is written to.
        report: called with the bill's text.
    """

    def __init__(
        self,
        workflow: Any,
        config: dict[str, Any],
        runtimes: JobRuntimes,
        packs: Callable[[], list[FinetunePack] | None],
        path: str | Path,
        report: Callable[[str], None] = print,
    ) -> None:
        self.workflow, self.config, self.runtimes = workflow, config, runtimes
        self.packs = packs
        self.path, self.report = Path(path), report
        self.bill: Bill | None = None

    def __call__(self, _wildcards: Any) -> list[str]:
        """No input files; the bill printed and written the first time."""
        if self.bill is None:
            jobs_at_once, per_second = throttle(self.workflow)
            self.bill = compute_bill(
                self.config,
                self.runtimes,
                packs=self.packs(),
                jobs_at_once=jobs_at_once,
                submissions_per_second=per_second,
            )
            text = self.bill.text()
            with atomic_path(self.path) as tmp:
                tmp.write_text(f"# The bill of rule all\n\n{text}")
            self.report(f"The bill of rule all (also in {self.path}):\n{text}")
        return []
