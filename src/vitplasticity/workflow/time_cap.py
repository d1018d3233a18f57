"""``scheduler.max_runtime_minutes`` against packing: no job, packed or not, asks for more.

A finetuning run longer than the cap asks for the cap and resumes from its checkpoint on its
retry (vitplasticity.workflow.costs). Packing puts several runs into one job, which asks for
one start-up allowance and their compute (vitplasticity.workflow.runtime.pack_minutes), so a
pack of runs that each fit could still ask for more than the partition allows, and SLURM holds
such a job PENDING (``PartitionTimeLimit``) forever or rejects it. So a
``finetune.pack_runs`` pack is cut here, by that same count, into packs of at most
:func:`runs_that_fit` runs (each its own rule, named by its runs as every pack is).

Snakemake groups of the finetune rule, another way of packing that the measurement put behind
``finetune.pack_runs`` (docs/benchmarks.md), are refused (:class:`UngroupedFinetune`).

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
from vitplasticity.workflow.config import (
    ConfigError,
    config_errors_end_the_run,
    enabled_experiments,
)
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
        most: the most runs wanted (the pack's runs).
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


GROUPS_REMOVED = (
    "Snakemake groups of finetuning runs ({option}) are no longer supported: pack the runs "
    "with finetune.pack_runs: true in the config instead (one process per pack: 0.53x the "
    "GPU-job time of one job per run on the test cluster, the groups 0.93x; "
    "docs/benchmarks.md), and remove the group of rule finetune from the profile or command "
    "line"
)
"""Why the finetune rule is never grouped: one way of packing runs, the one that wins."""


class UngroupedFinetune:
    """Refuses Snakemake job groups of the finetune rule (``--groups finetune=<group>``, the
    old packing block of slurm/profile.yaml): ``finetune.pack_runs`` packs runs instead.

    Snakemake sets its group settings on the workflow after the Snakefile is parsed and forms
    the groups once every job's inputs are known, so the check runs when the rule's first input
    function is called (:meth:`checked_input`), in between, before any job starts.

    Args:
        workflow: Snakemake's ``workflow`` object (its ``group_settings``; None: no groups).
        rule: the rule that must not be grouped.
    """

    def __init__(self, workflow: Any, rule: str = "finetune") -> None:
        self.workflow = workflow
        self.rule = rule

    def check(self) -> None:
        """Raise ConfigError when the rule is in a Snakemake group."""
        settings = getattr(self.workflow, "group_settings", None)
        group = (getattr(settings, "overwrite_groups", None) or {}).get(self.rule)
        if group is not None:
            option = f"--groups {self.rule}={group}"
            raise ConfigError(GROUPS_REMOVED.format(option=option))

    def checked_input(self, function: Callable[[Wildcards], Any]) -> Callable[[Wildcards], Any]:
        """``function``, an input function of the rule, checking the groups first (a refusal
        ends the run with its message alone, before any job)."""

        def inputs(wildcards: Wildcards) -> Any:
            with config_errors_end_the_run():
                self.check()
            return function(wildcards)

        return inputs


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
