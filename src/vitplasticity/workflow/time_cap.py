"""``scheduler.max_runtime_minutes`` against packing: no job, packed either way, asks for more.

A finetuning run longer than the cap asks for the cap and resumes from its checkpoint on its
retry (vitplasticity.workflow.costs). Packing puts several runs into one job, which asks for
one start-up allowance and their compute (vitplasticity.workflow.runtime.pack_minutes), so a
pack of runs that each fit could still ask for more than the partition allows, and SLURM holds
such a job PENDING (``PartitionTimeLimit``) forever or rejects it. Both ways of packing are cut
here so that they fit, by that same count:

- ``finetune.pack_runs`` (one process per pack): a pack is cut into packs of at most
  :func:`runs_that_fit` runs (each its own rule, named by its runs as every pack is).
- Snakemake groups (``--groups finetune=<group> --group-components <group>=N``, the packing
  block of slurm/profile.yaml): N is lowered to :func:`runs_that_fit`, and each grouped run
  asks for its share of the allowance and its compute, at most its share of the cap, so a
  retried group (each run's minutes times the attempt) fits too.

The smallest unit is one finetuning run: a cap that leaves a run no compute time past its
start-up allowance is refused at parse, naming the key.

Plain Python, no torch import: the Snakefile calls it on every node.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import replace
from fractions import Fraction
from typing import Any

from vitplasticity.workflow import runtime
from vitplasticity.workflow.config import enabled_experiments, experiment_runs
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import FinetunePack, check_distinct_names
from vitplasticity.workflow.params import Wildcards

CAP_KEY = "scheduler.max_runtime_minutes"


def cap_problems(config: dict[str, Any]) -> list[str]:
    """Why ``scheduler.max_runtime_minutes`` leaves no finetuning run time to train: empty
    when there is no cap, no enabled experiment, or the cap is longer than a run's start-up."""
    cap = config["scheduler"]["max_runtime_minutes"]
    if cap is None or not enabled_experiments(config):
        return []
    allowance = runtime.FINETUNE_FIXED_MINUTES
    if cap <= allowance:
        return [
            f"{CAP_KEY}: {cap} minutes leaves a finetuning run no time to train past its "
            f"start-up allowance ({allowance} minutes: imports, the prepared dataset and the "
            f"weights loaded); set it to at least {allowance + 1} (your partition's MaxTime, "
            "sinfo -o '%P %l')"
        ]
    return []


def runs_that_fit(compute_seconds: Iterable[Fraction | None], cap: int, most: int) -> int:
    """How many runs, at most ``most``, one job may hold so that it fits ``cap``: the longest
    run's (runtime.pack_minutes: one start-up allowance and their compute, first attempt),
    at least 1 (a run longer than the cap asks for the cap and resumes).

    Args:
        compute_seconds: each run's compute (JobRuntimes.run_seconds); None, a model without
            an estimate, asks for the cap: one run per job.
        cap: scheduler.max_runtime_minutes.
        most: the most runs wanted (the pack's runs, the group's components).
    """
    seconds = list(compute_seconds)
    if any(s is None for s in seconds):
        return 1
    longest = max(seconds, default=Fraction(0))
    # pack_minutes grows with the runs: the count of those that fit, bisected.
    fitting = bisect.bisect_right(
        range(1, most + 1), cap, key=lambda n: runtime.pack_minutes([longest] * n)
    )
    return max(1, fitting)


def _experiment_cells(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The (model, dataset) of every run of every enabled experiment, once each."""
    cells = {
        (run.model, run.dataset)
        for name in enabled_experiments(config)
        for run in experiment_runs(config, name)
    }
    return sorted(cells)


def cut_packs(
    packs: list[FinetunePack], config: dict[str, Any], runtimes: JobRuntimes
) -> list[FinetunePack]:
    """``packs`` cut so that each one's job, one start-up and its runs one after another,
    fits the cap: a pack longer than the cap becomes several of at most :func:`runs_that_fit`
    runs (its longest (model, dataset)'s run decides), in run order. Unchanged without a cap
    or when it fits.

    Raises:
        ConfigError: when two cut packs share a rule name (finetune_packs' digest clash).
    """
    cap = config["scheduler"]["max_runtime_minutes"]
    if cap is None:
        return packs
    cut: list[FinetunePack] = []
    for pack in packs:
        seconds = [runtimes.run_seconds(m, d) for m in pack.models for d in pack.datasets]
        size = runs_that_fit(seconds, cap, len(pack.runs))
        cut += [
            replace(pack, runs=pack.runs[start : start + size])
            for start in range(0, len(pack.runs), size)
        ]
    check_distinct_names(cut, f"the packs cut to {CAP_KEY}")
    return cut


class GroupFit:
    """Snakemake's job groups of the finetune rule kept within the cap.

    Snakemake sets its group settings (``--groups``, ``--group-components``) on the workflow
    after the Snakefile is parsed and forms the groups once every job's inputs are known, so
    the groups are fitted when the rule's first input function is called
    (:meth:`fitted_input`), in between.

    Args:
        workflow: Snakemake's ``workflow`` object (its ``group_settings``; None: no groups).
            The ``group_components`` of the grouped rule's group is lowered in place when its
            runs would sum to more than the cap.
        config: the validated config.
        runtimes: the jobs' runtimes bound to ``config``.
        rule: the grouped rule's name.
        report: called with the message saying that the group was cut.
    """

    def __init__(
        self,
        workflow: Any,
        config: dict[str, Any],
        runtimes: JobRuntimes,
        rule: str = "finetune",
        report: Callable[[str], None] = print,
    ) -> None:
        self.workflow = workflow
        self.config = config
        self.cap: int | None = config["scheduler"]["max_runtime_minutes"]
        self.runtimes = runtimes
        self.rule = rule
        self.report = report
        self._runs_per_group: int | None = None

    @property
    def runs_per_group(self) -> int:
        """Runs in one group job of the rule once fitted (1 when the rule is not grouped)."""
        if self._runs_per_group is None:
            self._runs_per_group = self._fit()
        return self._runs_per_group

    def _fit(self) -> int:
        settings = getattr(self.workflow, "group_settings", None)
        group = (getattr(settings, "overwrite_groups", None) or {}).get(self.rule)
        if group is None:
            return 1
        components = dict(settings.group_components or {})
        requested = components.get(group, 1)
        if self.cap is None:
            return requested
        seconds = [self.runtimes.run_seconds(m, d) for m, d in _experiment_cells(self.config)]
        fits = runs_that_fit(seconds, self.cap, requested)
        if fits >= requested:
            return requested
        components[group] = fits
        settings.group_components = type(settings.group_components)(components)
        self.report(
            f"--group-components {group}={requested} lowered to {group}={fits}: "
            f"{requested} runs one after another would ask for more than {CAP_KEY} "
            f"({self.cap} minutes)"
        )
        return fits

    def fitted_input(self, function: Callable[[Wildcards], Any]) -> Callable[[Wildcards], Any]:
        """``function``, an input function of the grouped rule, fitting the groups first."""

        def inputs(wildcards: Wildcards) -> Any:
            self.runs_per_group  # noqa: B018 (fits the groups on first use)
            return function(wildcards)

        return inputs

    def finetune(self, wildcards: Wildcards, attempt: int) -> int | None:
        """One grouped run's minutes: its share of the group's one start-up allowance and its
        compute (JobRuntimes.runs_minutes: Snakemake asks for the sum of a group's runs), at
        most its share of the cap, so that a group of ``runs_per_group`` retried runs still
        fits. A run of no group asks for its own minutes."""
        share = Fraction(1, self.runs_per_group)
        minutes = self.runtimes.runs_minutes(wildcards, attempt, start_up_share=share)
        if self.cap is None or minutes is None:
            return minutes
        return min(minutes, self.cap // self.runs_per_group)


def cap_fixed_runtimes(rules: Iterable[Any], max_minutes: int | None) -> list[str]:
    """Lower every rule's fixed ``runtime`` resource (a number: the workflow profile's
    set-resources, slurm/profile.yaml's default-resources) to the cap; the rules that compute
    theirs from the config (finetune, plasticity, recommend) cap it themselves.

    Args:
        rules: Snakemake's rules (``workflow.rules``: ``name``, ``resources``).
        max_minutes: scheduler.max_runtime_minutes (None: nothing changes).

    Returns:
        The names of the rules lowered, sorted.
    """
    if max_minutes is None:
        return []
    lowered = []
    for rule in rules:
        resource = rule.resources.get("runtime")
        # A function of the job (evaluable) has no value before its job exists.
        value = None if resource is None or resource.is_evaluable() else resource.value
        if isinstance(value, int) and value > max_minutes:
            rule.resources["runtime"] = max_minutes
            lowered.append(rule.name)
    return sorted(lowered)
