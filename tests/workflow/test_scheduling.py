"""vitplasticity.workflow.scheduling: CPU-only rules on scheduler.cpu_partition, GPU rules on
the default partition, the first results' rules at a higher Snakemake priority."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from snakemake.resources import Resources

from tests.helpers.configs import DEMO, PAPER, dry_run
from tests.helpers.gpu_requests import gpu_request_forms, shipped_gpu_request, with_gpu_request
from tests.helpers.repo import REPO
from vitplasticity.workflow.scheduling import (
    FIRST_RESULT_RULES,
    FIRST_RESULTS_PRIORITY,
    GPU_JOBS,
    GPU_RULES,
    GpuRequestError,
    asks_for_gpu,
    count_gpu_jobs,
    is_gpu_rule,
    route_and_prioritize,
)

WORKFLOW_PROFILE = REPO / "workflow/profiles/default/profile.yaml"


def declared_rules() -> set[str]:
    text = "\n".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk"))
    return set(re.findall(r"^rule (\w+):", text, re.M))


def test_gpu_rules_are_those_the_workflow_profile_gives_a_gpu() -> None:
    profile = yaml.safe_load(WORKFLOW_PROFILE.read_text())
    with_gpu = {rule for rule, res in profile["set-resources"].items() if asks_for_gpu(res)}
    assert with_gpu == GPU_RULES


def test_each_offered_gpu_request_is_one_edit_that_every_gpu_rule_takes() -> None:
    text = WORKFLOW_PROFILE.read_text()
    forms = gpu_request_forms(text)
    assert forms[0] == shipped_gpu_request(text)  # the shipped form is listed first
    assert {next(iter(form)) for form in forms} == {"gpu", "gres"}, forms
    for form in forms:
        profile = yaml.safe_load(with_gpu_request(text, form))["set-resources"]
        with_gpu = {rule for rule, res in profile.items() if asks_for_gpu(res)}
        assert with_gpu == GPU_RULES, form
        for rule in GPU_RULES:  # the whole request, CPU cores included, and nothing else of it
            assert profile[rule].items() >= form.items(), (rule, form)
            others = set(profile[rule]) - set(form) - {"mem_mb", "slurm_extra"}
            assert not others & {"gpu", "gres", "gpu_model", "cpus_per_gpu", "cpus_per_task"}


@pytest.mark.parametrize(
    ("resources", "asks"),
    [
        ({"gpu": 1}, True),
        ({"gpu": "2"}, True),
        ({"gpu_model": "a100"}, True),  # the plugin's gpu defaults to 1 then
        ({"gres": "gpu:1"}, True),
        ({"gres": "gpu:a100:1"}, True),
        ({"gres": "gpu"}, True),
        ({"gres": "shard:2,gpu:1"}, True),
        ({"gpu": 0}, False),
        ({"gres": "shard:2"}, False),
        ({"gres": "gpus_per_node:1"}, False),
        ({"mem_mb": 4000, "cpus_per_task": 8}, False),
    ],
)
def test_asks_for_gpu_in_every_form_of_the_plugin(resources: dict, asks: bool) -> None:
    assert asks_for_gpu(resources) is asks


def test_a_profiles_gres_string_is_read_from_snakemakes_unevaluated_resource() -> None:
    # A profile's `gres: gpu:1` reaches the rule as an expression Snakemake evaluates per job.
    parsed = Resources.parse(["gres=gpu:a100:1", "cpus_per_task=8"], allow_expressions=True)
    assert asks_for_gpu(parsed)
    assert not asks_for_gpu(Resources.parse(["gres=shard:1"], allow_expressions=True))


def test_every_rule_asking_for_a_gpu_counts_one_gpu_job_whatever_its_form() -> None:
    rules = [
        SimpleNamespace(name="finetune", resources={"gpu": 1, "cpus_per_gpu": 8}),
        SimpleNamespace(name="plasticity", resources={"gres": "gpu:1"}),
        SimpleNamespace(
            name="finetune_pack_sgd_1",
            resources=dict(Resources.parse(["gres=gpu:tesla:1"], allow_expressions=True)),
        ),
        SimpleNamespace(name="prepare", resources={"mem_mb": 16000}),
    ]
    assert count_gpu_jobs(rules) == ["finetune", "finetune_pack_sgd_1", "plasticity"]
    assert {r.name: r.resources.get(GPU_JOBS) for r in rules} == {
        "finetune": 1,
        "plasticity": 1,
        "finetune_pack_sgd_1": 1,
        "prepare": None,
    }


def test_a_gpu_asked_for_twice_is_refused_naming_the_rule() -> None:
    rules = [SimpleNamespace(name="plasticity", resources={"gpu": 1, "gres": "gpu:a100:1"})]
    with pytest.raises(GpuRequestError, match=r"plasticity: asks for its GPU twice.*gpu:a100:1"):
        count_gpu_jobs(rules)


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


@pytest.mark.parametrize("form", gpu_request_forms(WORKFLOW_PROFILE.read_text()), ids=str)
def test_a_pack_asks_for_what_the_workflow_profile_gives_the_one_run_rule(
    tmp_path: Path, form: dict
) -> None:
    """The demo packs its runs (finetune.pack_runs): on a cluster each pack is a finetuning job
    with the GPU, CPUs, memory and --nice of set-resources: finetune, and its own wall time,
    in each GPU request form the workflow profile offers. Every GPU job counts one gpu_jobs
    and stays on the default partition; CPU jobs go to scheduler.cpu_partition."""
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "profile.yaml").write_text(with_gpu_request(WORKFLOW_PROFILE.read_text(), form))
    result = dry_run(
        tmp_path,
        PAPER,
        DEMO,
        edit={"scheduler": {"cpu_partition": "cpu"}},
        options=["--workflow-profile", str(profile)],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    jobs = dry_run_resources(result.stdout + result.stderr)
    packs = {rule: asked for rule, asked in jobs.items() if rule.startswith("finetune_pack_")}
    assert packs and "finetune" not in jobs, sorted(jobs)
    wanted = yaml.safe_load((profile / "profile.yaml").read_text())["set-resources"]["finetune"]
    assert wanted.items() >= form.items()
    for rule, asked in packs.items():
        for resources in asked:
            assert {key: resources.get(key) for key in wanted} == {
                key: str(value) for key, value in wanted.items()
            }, rule
            assert int(resources["runtime"]) > 0
    for rule, asked in jobs.items():
        gpu = is_gpu_rule(rule)
        for resources in asked:
            assert asks_for_gpu(resources) is gpu, (rule, resources)
            assert resources.get(GPU_JOBS) == ("1" if gpu else None), (rule, resources)
            if rule not in ("all", "weights", "download") and not rule.endswith("_all"):
                assert resources.get("slurm_partition") == (None if gpu else "cpu"), rule


def test_a_one_run_wall_time_in_the_profile_is_refused_with_packs(tmp_path: Path) -> None:
    result = dry_run(tmp_path, PAPER, DEMO, options=["--set-resources", "finetune:runtime=30"])
    assert result.returncode != 0
    assert "set-resources: finetune: runtime is one run's wall time" in result.stderr
    assert "Traceback" not in result.stderr and "File " not in result.stderr, result.stderr
