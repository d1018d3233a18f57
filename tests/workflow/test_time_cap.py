"""vitplasticity.workflow.time_cap: no job, packed either way (finetune.pack_runs or Snakemake
groups), asks for more than scheduler.max_runtime_minutes, a job of several runs counting one
start-up allowance and their compute; a cap that leaves a run no time past its start-up is
refused naming the key."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import immutables
import pytest
from snakemake.iocontainers import Wildcards
from snakemake.resources import Resources
from snakemake.settings.types import GroupSettings

from tests.helpers.configs import DEMO, PAPER, Configure, dry_run
from vitplasticity.workflow import runtime
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import finetune_packs
from vitplasticity.workflow.time_cap import (
    UngroupedFinetune,
    cap_fixed_runtimes,
    cut_packs,
    runs_that_fit,
)


def capped(demo_with: Configure, cap: int | None, stripes_steps: int = 48) -> dict[str, Any]:
    """The demo under ``cap``, demo-stripes' runs ``stripes_steps`` long (13,530: 5 minutes)."""
    return demo_with(
        {
            "scheduler": {"max_runtime_minutes": cap},
            "datasets": {"demo-stripes": {"steps": stripes_steps}},
        }
    )


@pytest.mark.parametrize(
    ("compute_seconds", "cap", "most", "expected"),
    [
        # 15 + 5n <= 20: one run of five minutes; 15 + 5n <= 45: six.
        ([300, 300], 20, 10, 1),
        ([300, 300], 45, 10, 6),
        # The longest run decides: 15 + 5n <= 45 with a one-minute run beside it.
        ([60, 300], 45, 10, 6),
        # floor(15 + n/2) <= 16: three half-minute runs (16.5 rounds down to 16), not four.
        ([30], 16, 10, 3),
        # The demo's 1.06 s runs: all 16 of a pack fit 20 minutes (15.28 -> 15).
        ([Fraction(10645, 10000)] * 2, 20, 16, 16),
        # A run longer than the cap still gets a job of its own; no estimate: the cap.
        ([3600], 20, 10, 1),
        ([None, 1], 1000, 10, 1),
        ([60], 1000, 3, 3),
    ],
)
def test_runs_that_fit_are_one_start_up_and_the_longest_runs_compute(
    compute_seconds: list[Fraction | None], cap: int, most: int, expected: int
) -> None:
    assert runs_that_fit(compute_seconds, cap, most) == expected
    if None not in compute_seconds:
        # The largest count whose one allowance and compute, rounded down, fit; at least 1.
        longest = max(Fraction(s) for s in compute_seconds)
        fits = [n for n in range(1, most + 1) if math.floor(15 + n * longest / 60) <= cap]
        assert expected == max([1, *fits])


@pytest.mark.parametrize("cap", [1, runtime.FINETUNE_FIXED_MINUTES])
def test_a_cap_leaving_no_time_past_a_runs_start_up_is_refused_naming_the_key(
    demo_with: Configure, cap: int
) -> None:
    with pytest.raises(ConfigError, match=r"^scheduler\.max_runtime_minutes: ") as error:
        check_config(capped(demo_with, cap))
    assert f"at least {runtime.FINETUNE_FIXED_MINUTES + 1}" in str(error.value)


@pytest.mark.parametrize("cap", [None, runtime.FINETUNE_FIXED_MINUTES + 1, 20])
def test_a_cap_past_a_runs_start_up_is_accepted(demo_with: Configure, cap: int | None) -> None:
    check_config(capped(demo_with, cap))


# The demo's packs cut to the cap, worked out by hand. A demo run computes 1.06 s (48 steps
# of 32 images at ViT-Ti/16's 7.46 GFLOP, +30%, at 14 TFLOP/s); with demo-stripes at 13,530
# steps its runs compute 300.04 s (5.0007 min). The packs: sgd's demo-stripes (16 runs, its
# own LR grid), sgd's demo-blobs and demo-palette (8 runs), adam's three datasets (8 runs,
# demo-stripes' the longest). A pack of n runs asks for floor(15 + n x compute).
#
# | stripes steps | cap | runs per pack | pack jobs (a pack's (model, dataset) each) |
# |---|---|---|---|
# | 48 | 20 | all: 15 + 16 x 1.06 s = 15.28 -> 15 | 1 + 2 + 3 = 6 (before: 56, one run each) |
# | 13,530 | 20 | 1: 15 + 5.0007 = 20.0007 -> 20 | 16 + 2 + 8 x 3 = 42 |
# | 13,530 | 31 | 3: 15 + 15.002 -> 30 | 6 + 2 + 3 x 3 = 17 |
# | 13,530 | 45 | 6: 15 + 30.004 -> 45 | 3 + 2 + 2 x 3 = 11 |
# | 13,530 | None | all | 6 |
@pytest.mark.parametrize(
    ("stripes_steps", "cap", "pack_jobs"),
    [(48, 20, 6), (13_530, 20, 42), (13_530, 31, 17), (13_530, 45, 11), (13_530, None, 6)],
)
def test_cut_packs_fit_the_cap_and_keep_every_run_in_order(
    demo_with: Configure, stripes_steps: int, cap: int | None, pack_jobs: int
) -> None:
    config = capped(demo_with, cap, stripes_steps)
    costs = JobRuntimes(config)
    packs = finetune_packs(config)
    cut = cut_packs(packs, config, costs)
    assert sum(len(p.models) * len(p.datasets) for p in cut) == pack_jobs
    for pack in cut:
        for model in pack.models:
            for dataset in pack.datasets:
                cell = Wildcards(fromdict={"model": model, "dataset": dataset})
                assert cap is None or costs.pack(pack)(cell, 1) <= cap
    # The same runs, in the same order, each pack's pieces one after another.
    for pack in packs:
        pieces = [
            p
            for p in cut
            if (p.experiment, p.models, p.datasets) == (pack.experiment, pack.models, pack.datasets)
        ]
        assert [run for piece in pieces for run in piece.runs] == list(pack.runs)
    assert len({p.name for p in cut}) == len(cut)


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


def test_a_group_of_the_finetune_rule_is_refused_before_its_input_is_read() -> None:
    """The old packing block (Snakemake groups of runs) ends the run with what to write
    instead, before the rule's input function runs; finetune.pack_runs packs the runs."""
    called: list[object] = []
    checked = UngroupedFinetune(grouped_workflow(3)).checked_input(called.append)
    with pytest.raises(SystemExit) as stopped:
        checked("w")
    message = str(stopped.value)
    assert "--groups finetune=finetune_pack" in message and "finetune.pack_runs: true" in message
    assert called == []


def test_a_dry_run_grouping_the_finetune_rule_stops_with_what_to_write(tmp_path: Path) -> None:
    """Snakemake's own group settings reach the refusal: the run ends with its message alone,
    no traceback, before any job."""
    proc = dry_run(
        tmp_path,
        PAPER,
        DEMO,
        edit={"finetune": {"pack_runs": False}},  # the one-run rule: what the groups grouped
        options=["--groups", "finetune=pack", "--group-components", "pack=3"],
    )
    assert proc.returncode == 1
    assert "--groups finetune=pack) are no longer supported" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "workflow",
    [
        SimpleNamespace(group_settings=None),
        SimpleNamespace(group_settings=GroupSettings()),
        SimpleNamespace(
            group_settings=GroupSettings(overwrite_groups=immutables.Map({"prepare": "data"}))
        ),
    ],
    ids=["no settings", "no groups", "another rule grouped"],
)
def test_an_ungrouped_finetune_rule_reads_its_input(workflow: SimpleNamespace) -> None:
    assert UngroupedFinetune(workflow).checked_input(lambda w: f"in-{w}")("w") == "in-w"


def test_an_ungrouped_run_asks_for_its_own_capped_minutes(demo_with: Configure) -> None:
    config = capped(demo_with, 20)
    cell = Wildcards(fromdict={"model": "demo_vit", "dataset": "demo-stripes"})
    assert JobRuntimes(config).finetune(cell, 3) == 20


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
