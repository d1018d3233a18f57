"""vitplasticity.workflow.scheduling: CPU-only rules on scheduler.cpu_partition, GPU rules on
the default partition, the first results' rules at a higher Snakemake priority."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import yaml

from tests.helpers.configs import DEMO, PAPER, dry_run
from tests.helpers.repo import REPO
from vitplasticity.workflow.scheduling import (
    FIRST_RESULT_RULES,
    FIRST_RESULTS_PRIORITY,
    GPU_RULES,
    is_gpu_rule,
    route_and_prioritize,
)

WORKFLOW_PROFILE = REPO / "workflow/profiles/default/profile.yaml"


def declared_rules() -> set[str]:
    text = "\n".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk"))
    return set(re.findall(r"^rule (\w+):", text, re.M))


def test_gpu_rules_are_those_the_workflow_profile_gives_a_gpu() -> None:
    profile = yaml.safe_load(WORKFLOW_PROFILE.read_text())
    with_gpu = {rule for rule, res in profile["set-resources"].items() if res.get("gpu")}
    assert with_gpu == GPU_RULES


def test_the_first_results_rules_exist() -> None:
    assert declared_rules() >= FIRST_RESULT_RULES
    assert declared_rules() >= GPU_RULES


def test_packed_finetune_rules_are_gpu_rules() -> None:
    assert is_gpu_rule("finetune_pack_sgd_0123abcd")
    assert not is_gpu_rule("prepare") and not is_gpu_rule("figure_bounds")


def fake_rules(*names: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=n, priority=0, resources={}) for n in names]


def test_cpu_rules_go_to_the_cpu_partition_and_gpu_rules_stay() -> None:
    rules = fake_rules("prepare", "finetune", "plasticity", "finetune_pack_sgd_1", "figure_bounds")
    routed = route_and_prioritize(rules, "cpu")
    assert routed == ["figure_bounds", "prepare"]
    partitions = {r.name: r.resources.get("slurm_partition") for r in rules}
    assert partitions == {
        "prepare": "cpu",
        "finetune": None,
        "plasticity": None,
        "finetune_pack_sgd_1": None,
        "figure_bounds": "cpu",
    }


def test_without_a_cpu_partition_no_rule_gets_one() -> None:
    rules = fake_rules("prepare", "finetune")
    assert route_and_prioritize(rules, None) == []
    assert all(not r.resources for r in rules)


def test_first_results_get_the_higher_priority_and_the_grid_none() -> None:
    rules = fake_rules("plasticity", "bounds", "reference", "finetune", "aggregate_all")
    route_and_prioritize(rules, None)
    priorities = {r.name: r.priority for r in rules}
    assert priorities == {
        "plasticity": FIRST_RESULTS_PRIORITY,
        "bounds": FIRST_RESULTS_PRIORITY,
        "reference": FIRST_RESULTS_PRIORITY,
        "finetune": 0,
        "aggregate_all": 0,
    }
    assert FIRST_RESULTS_PRIORITY > 0


def dry_run_resources(printed: str) -> dict[str, list[dict[str, str]]]:
    """Each rule's jobs' resources, as a Snakemake dry run prints them."""
    jobs: dict[str, list[dict[str, str]]] = {}
    for block in re.split(r"\n(?=\[[^\n]*\]\n(?:local)?rule )", printed):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        resources = re.search(r"^\s+resources: (.*)$", block, re.M)
        if rule and resources:
            pairs = (item.split("=", 1) for item in resources.group(1).split(", "))
            jobs.setdefault(rule.group(1), []).append(dict(pairs))
    return jobs


def test_a_pack_asks_for_what_the_workflow_profile_gives_the_one_run_rule(
    tmp_path: Path,
) -> None:
    """The demo packs its runs (finetune.pack_runs): on a cluster each pack is a finetuning job
    with the GPU, CPUs, memory and --nice of set-resources: finetune, and its own wall time."""
    result = dry_run(tmp_path, PAPER, DEMO)
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = dry_run_resources(result.stdout + result.stderr)
    packs = {rule: asked for rule, asked in jobs.items() if rule.startswith("finetune_pack_")}
    assert packs and "finetune" not in jobs, sorted(jobs)
    wanted = yaml.safe_load(WORKFLOW_PROFILE.read_text())["set-resources"]["finetune"]
    for rule, asked in packs.items():
        for resources in asked:
            assert {key: resources.get(key) for key in wanted} == {
                key: str(value) for key, value in wanted.items()
            }, rule
            assert int(resources["runtime"]) > 0


def test_a_one_run_wall_time_in_the_profile_is_refused_with_packs(tmp_path: Path) -> None:
    result = dry_run(tmp_path, PAPER, DEMO, options=["--set-resources", "finetune:runtime=30"])
    assert result.returncode != 0
    assert "set-resources: finetune: runtime is one run's wall time" in result.stderr
    assert "Traceback" not in result.stderr and "File " not in result.stderr, result.stderr
