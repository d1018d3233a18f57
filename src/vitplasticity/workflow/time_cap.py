"""``scheduler.max_runtime_minutes`` against packing: no job, packed either way, asks for more.

A finetuning run longer than the cap asks for the cap and resumes from its checkpoint on its
retry (vitplasticity.workflow.costs). Packing puts several runs into one job whose wall time
is the sum of theirs, so a pack of runs that each fit could still ask for more than the
partition allows, and SLURM holds such a job PENDING (``PartitionTimeLimit``) forever or
rejects it. Both ways of packing are cut here so that their sum fits:

- ``finetune.pack_runs`` (one process per pack): a pack is cut into packs of at most
  :func:`runs_per_job` runs (each its own rule, named by its runs as every pack is).
- Snakemake groups (``--groups finetune=<group> --group-components <group>=N``, the packing
  block of slurm/profile.yaml): N is lowered to :func:`runs_per_job`, and each grouped run
  asks for at most its share of the cap, so a retried group (each run's estimate times the
  attempt) fits too.

The smallest unit is one finetuning run: a cap below a run's fixed start-up allowance leaves
no run any time to train, and is refused at parse, naming the key.

Plain Python, no torch import: the Snakefile calls it on every node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from vitplasticity.workflow import runtime
from vitplasticity.workflow.config import enabled_experiments, experiment_runs
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import FinetunePack, check_distinct_names
from vitplasticity.workflow.params import Wildcards

CAP_KEY = "scheduler.max_runtime_minutes"

RunMinutes = Callable[[Wildcards, int], int | None]
"""A finetuning run's ``runtime`` resource (JobRuntimes.finetune): wildcards, attempt."""


def cap_problems(config: dict[str, Any]) -> list[str]:
    """Why ``scheduler.max_runtime_minutes`` leaves no finetuning run time to train: empty
    when there is no cap, no enabled experiment, or the cap covers a run's start-up."""
    cap = config["scheduler"]["max_runtime_minutes"]
    if cap is None or not enabled_experiments(config):
        return []
    if cap < runtime.FINETUNE_FIXED_MINUTES:
        return [
            f"{CAP_KEY}: {cap} minutes is less than a finetuning run's start-up allowance "
            f"({runtime.FINETUNE_FIXED_MINUTES} minutes: imports, the prepared dataset and the "
            f"weights loaded), so no run could train before its limit; set it to at least "
            f"{runtime.FINETUNE_FIXED_MINUTES} (your partition's MaxTime, sinfo -o '%P %l')"
        ]
    return []


def runs_per_job(run_minutes: Iterable[int | None], max_minutes: int | None) -> int | None:
    """How many runs one packed job may hold so that their sum fits ``max_minutes``: the cap
    over the longest run's minutes (at least 1: a run longer than the cap asks for the cap
    and resumes). None: no cap, any number fits.

    Args:
        run_minutes: each run's first-attempt minutes; None (a model without an estimate,
            without a cap) counts as the cap.
        max_minutes: scheduler.max_runtime_minutes (None: no cap).
    """
    if max_minutes is None:
        return None
    longest = max((max_minutes if m is None else m for m in run_minutes), default=1)
    return max(1, max_minutes // max(1, longest))


def _run_wildcards(model: str, dataset: str) -> Wildcards:
    # JobRuntimes reads a run's model and dataset only.
    return SimpleNamespace(model=model, dataset=dataset)


def experiment_run_minutes(config: dict[str, Any], runtimes: JobRuntimes) -> list[int | None]:
    """The first-attempt minutes (capped, as its job asks) of every run of every enabled
    experiment, one entry per (model, dataset)."""
    cells = {
        (run.model, run.dataset)
        for name in enabled_experiments(config)
        for run in experiment_runs(config, name)
    }
    return [runtimes.finetune(_run_wildcards(m, d), 1) for m, d in sorted(cells)]


def cut_packs(
    packs: list[FinetunePack], config: dict[str, Any], runtimes: JobRuntimes
) -> list[FinetunePack]:
    """``packs`` cut so that each one's runs, one after another, fit the cap: a pack longer
    than the cap becomes several of at most :func:`runs_per_job` runs (its longest (model,
    dataset)'s run decides), in run order. Unchanged without a cap or when it fits.

    Raises:
        ConfigError: when two cut packs share a rule name (finetune_packs' digest clash).
    """
    cap = config["scheduler"]["max_runtime_minutes"]
    cut: list[FinetunePack] = []
    for pack in packs:
        minutes = [
            runtimes.finetune(_run_wildcards(m, d), 1) for m in pack.models for d in pack.datasets
        ]
        size = runs_per_job(minutes, cap) or len(pack.runs)
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
        fits = runs_per_job(experiment_run_minutes(self.config, self.runtimes), self.cap)
        if fits is None or fits >= requested:
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
        """One grouped run's minutes: its own (JobRuntimes.finetune), at most its share of
        the cap, so that a group of ``runs_per_group`` retried runs still fits."""
        minutes = self.runtimes.finetune(wildcards, attempt)
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
