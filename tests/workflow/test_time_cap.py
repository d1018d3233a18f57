"""vitplasticity.workflow.time_cap: no job, packed either way (finetune.pack_runs or Snakemake
groups), asks for more than scheduler.max_runtime_minutes; a cap below a run's start-up is
refused naming the key."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import immutables
import pytest
from snakemake.iocontainers import Wildcards
from snakemake.resources import Resources
from snakemake.settings.types import GroupSettings

from tests.helpers.configs import Configure
from vitplasticity.workflow import runtime
from vitplasticity.workflow.config import ConfigError, experiment_runs
from vitplasticity.workflow.config_check import check_config
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import finetune_packs
from vitplasticity.workflow.time_cap import (
    GroupFit,
    cap_fixed_runtimes,
    cut_packs,
    experiment_run_minutes,
    runs_per_job,
)


def capped(demo_with: Configure, cap: int | None) -> dict[str, Any]:
    return demo_with({"scheduler": {"max_runtime_minutes": cap}})


@pytest.mark.parametrize(
    ("minutes", "cap", "expected"),
    [([15, 15], 20, 1), ([15, 15], 45, 3), ([15, 10], 31, 2), ([50], 20, 1), ([None, 5], 20, 1)],
)
def test_runs_per_job_is_the_cap_over_the_longest_run(
    minutes: list[int | None], cap: int, expected: int
) -> None:
    assert runs_per_job(minutes, cap) == expected
    longest = max(cap if m is None else m for m in minutes)
    # The largest count whose sum of the longest run fits, at least one run.
    assert expected == max([1] + [n for n in range(1, 100) if n * longest <= cap])


def test_no_cap_puts_no_limit_on_a_pack() -> None:
    assert runs_per_job([15, 900], None) is None


@pytest.mark.parametrize("cap", [1, runtime.FINETUNE_FIXED_MINUTES - 1])
def test_a_cap_below_a_runs_start_up_is_refused_naming_the_key(
    demo_with: Configure, cap: int
) -> None:
    with pytest.raises(ConfigError, match=r"^scheduler\.max_runtime_minutes: ") as error:
        check_config(capped(demo_with, cap))
    assert f"at least {runtime.FINETUNE_FIXED_MINUTES}" in str(error.value)


@pytest.mark.parametrize("cap", [None, runtime.FINETUNE_FIXED_MINUTES, 20])
def test_a_cap_covering_a_runs_start_up_is_accepted(demo_with: Configure, cap: int | None) -> None:
    check_config(capped(demo_with, cap))


@pytest.mark.parametrize("cap", [20, 31, 45, 1000])
def test_cut_packs_fit_the_cap_and_keep_every_run_in_order(demo_with: Configure, cap: int) -> None:
    config = capped(demo_with, cap)
    costs = JobRuntimes(config)
    packs = finetune_packs(config)
    cut = cut_packs(packs, config, costs)
    for pack in cut:
        for model in pack.models:
            for dataset in pack.datasets:
                cell = Wildcards(fromdict={"model": model, "dataset": dataset})
                one_run = costs.finetune(cell, 1)
                assert len(pack.runs) * one_run <= cap
    # The same runs, in the same order, each pack's pieces one after another.
    for pack in packs:
        pieces = [
            p
            for p in cut
            if (p.experiment, p.models, p.datasets) == (pack.experiment, pack.models, pack.datasets)
        ]
        assert [run for piece in pieces for run in piece.runs] == list(pack.runs)
    assert len({p.name for p in cut}) == len(cut)


def test_the_demo_packs_are_longer_than_20_minutes_uncut(demo_with: Configure) -> None:
    """The case the cut is for: a demo pack of 3 runs of 15 minutes asks for 45."""
    config = capped(demo_with, None)
    one_run = experiment_run_minutes(config, JobRuntimes(config))
    assert max(one_run) == runtime.FINETUNE_FIXED_MINUTES
    assert max(len(pack.runs) for pack in finetune_packs(config)) * max(one_run) > 20


def test_without_a_cap_packs_stay_as_they_are(demo_with: Configure) -> None:
    config = capped(demo_with, None)
    packs = finetune_packs(config)
    assert cut_packs(packs, config, JobRuntimes(config)) == packs


def grouped_workflow(components: int) -> SimpleNamespace:
    return SimpleNamespace(
        group_settings=GroupSettings(
            overwrite_groups=immutables.Map({"finetune": "finetune_pack"}),
            group_components=immutables.Map({"finetune_pack": components}),
        )
    )


@pytest.mark.parametrize(("cap", "requested", "fitted"), [(20, 3, 1), (31, 3, 2), (45, 3, 3)])
def test_groups_are_lowered_to_fit_the_cap(
    demo_with: Configure, cap: int, requested: int, fitted: int
) -> None:
    config = capped(demo_with, cap)
    workflow = grouped_workflow(requested)
    messages: list[str] = []
    fit = GroupFit(workflow, config, JobRuntimes(config), report=messages.append)
    assert fit.runs_per_group == fitted
    assert workflow.group_settings.group_components["finetune_pack"] == fitted
    assert len(messages) == (fitted < requested)
    if messages:
        assert f"finetune_pack={requested} lowered to finetune_pack={fitted}" in messages[0]
    # Every attempt of a full group, its runs one after another, fits the cap.
    run = next(iter(experiment_runs(config, "sgd")))
    cell = Wildcards(fromdict={"model": run.model, "dataset": run.dataset})
    for attempt in (1, 2, 3):
        assert fitted * fit.finetune(cell, attempt) <= cap
    # The first attempt asks for its own estimate: the cut, not the share, made it fit.
    assert fit.finetune(cell, 1) == JobRuntimes(config).finetune(cell, 1)


def test_an_ungrouped_run_asks_for_its_own_capped_minutes(demo_with: Configure) -> None:
    config = capped(demo_with, 20)
    fit = GroupFit(SimpleNamespace(group_settings=None), config, JobRuntimes(config))
    cell = Wildcards(fromdict={"model": "demo_vit", "dataset": "demo-stripes"})
    assert fit.runs_per_group == 1
    assert fit.finetune(cell, 3) == 20


def test_fitted_input_fits_the_groups_before_calling_the_input(demo_with: Configure) -> None:
    config = capped(demo_with, 20)
    workflow = grouped_workflow(3)
    fit = GroupFit(workflow, config, JobRuntimes(config), report=lambda _: None)
    assert fit.fitted_input(lambda wildcards: f"in-{wildcards}")("w") == "in-w"
    assert workflow.group_settings.group_components["finetune_pack"] == 1


def rule_with_runtime(name: str, runtime_resource: Any) -> SimpleNamespace:
    return SimpleNamespace(
        name=name, resources=Resources.from_mapping({"runtime": runtime_resource})
    )


def test_the_profiles_fixed_runtimes_are_lowered_to_the_cap() -> None:
    """prepare's 240 minutes (the workflow profile) would wait forever on a 20-minute
    partition; a job's own function (finetune's) caps itself and is left alone."""
    rules = [
        rule_with_runtime("prepare", 240),
        rule_with_runtime("wilcoxon", 15),
        rule_with_runtime("finetune", lambda wildcards, attempt: 999),
    ]
    assert cap_fixed_runtimes(rules, 20) == ["prepare"]
    assert [r.resources["runtime"].value for r in rules[:2]] == [20, 15]
    assert rules[2].resources["runtime"].is_evaluable()
    assert cap_fixed_runtimes(rules, None) == []
