"""vitplasticity.workflow.costs: the runtime each job asks SLURM for, from the config: the
estimate of vitplasticity.workflow.runtime on the job's own settings, the retry attempt, the
scheduler's cap, and a transformers model's fallback to the cap."""

from __future__ import annotations

from typing import Any

from snakemake.iocontainers import Wildcards

from vitplasticity.workflow import runtime
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import finetune_packs

BASE = "vit_base_patch16_224.orig_in21k"
GPT2 = {"family": "transformers", "hf_id": "gpt2", "revision": "main", "weights": "hub"}


def of(**wildcards: str) -> Wildcards:
    return Wildcards(fromdict=wildcards)


def test_the_paper_vit_b_run_on_cifar10_asks_for_848_minutes(paper: dict[str, Any]) -> None:
    """tests/workflow/test_runtime.py works 848.166 minutes out by hand (10,000 steps of 512
    images in fp32); a retry asks for twice the unrounded time."""
    costs = JobRuntimes(paper)
    cell = of(model="vit_base", dataset="cifar10")
    assert costs.finetune(cell, 1) == 848
    assert costs.finetune(cell, 2) == 1696


def test_a_run_takes_its_datasets_steps(paper: dict[str, Any]) -> None:
    costs = JobRuntimes(paper)
    steps = paper["datasets"]["pet"]["steps"]
    assert steps == 4000  # the cifar10 run's 10,000 would ask for more
    assert costs.finetune(of(model="vit_base", dataset="pet"), 1) == runtime.finetune_minutes(
        steps, paper["finetune"]["batch_size"], BASE, paper["finetune"]["precision"]
    )


def test_the_cap_limits_every_request(paper: dict[str, Any]) -> None:
    paper["scheduler"]["max_runtime_minutes"] = 100
    costs = JobRuntimes(paper)
    assert costs.finetune(of(model="vit_base", dataset="cifar10"), 1) == 100
    assert costs.plasticity(of(model="vit_huge"), 3) == 100


def test_a_transformers_model_asks_for_the_cap_or_for_nothing(paper: dict[str, Any]) -> None:
    """runtime counts the FLOPs of timm architectures only."""
    paper["models"]["gpt2"] = GPT2
    assert JobRuntimes(paper).recommend(of(model="gpt2"), 1) is None
    paper["scheduler"]["max_runtime_minutes"] = 2880
    assert JobRuntimes(paper).plasticity(of(model="gpt2"), 1) == 2880


def test_plasticity_counts_the_pairs_and_protocols_in_its_dtype(paper: dict[str, Any]) -> None:
    p = paper["plasticity"]
    p["protocols"] = ["embedding", "in_situ"]
    both = runtime.plasticity_minutes(p["n_pairs"], 2, BASE, p["dtype"], 2)
    assert JobRuntimes(paper).plasticity(of(model="vit_base"), 2) == both
    p["protocols"] = ["embedding"]
    one = runtime.plasticity_minutes(p["n_pairs"], 1, BASE, p["dtype"], 2)
    assert JobRuntimes(paper).plasticity(of(model="vit_base"), 2) == one < both


def test_recommend_measures_the_plasticity_pairs_unless_it_has_its_own(
    paper: dict[str, Any],
) -> None:
    block = paper["recommend"]
    assert block["n_pairs"] is None

    def expected(n_pairs: int) -> int:
        args = (block["batch_size"], block["warmup_steps"], block["batches"], BASE)
        return runtime.recommend_minutes(n_pairs, *args)

    assert JobRuntimes(paper).recommend(of(model="vit_base"), 1) == expected(
        paper["plasticity"]["n_pairs"]
    )
    block["n_pairs"] = 100
    assert JobRuntimes(paper).recommend(of(model="vit_base"), 1) == expected(100)


def test_a_pack_asks_for_its_runs_one_after_another_then_the_cap(demo: dict[str, Any]) -> None:
    pack = finetune_packs(demo)[0]
    cell = of(model="demo_vit", dataset=pack.datasets[0])
    one_run = JobRuntimes(demo).finetune(cell, 1)
    assert JobRuntimes(demo).pack(pack)(cell, 1) == len(pack.runs) * one_run
    demo["scheduler"]["max_runtime_minutes"] = one_run + 1
    assert JobRuntimes(demo).pack(pack)(cell, 1) == one_run + 1
