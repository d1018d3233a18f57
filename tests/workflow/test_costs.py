"""vitplasticity.workflow.costs: the runtime each job asks SLURM for, from the config: the
estimate of vitplasticity.workflow.runtime on the job's own settings, the retry attempt, the
scheduler's cap, and a transformers model's fallback to the cap."""

from __future__ import annotations

from typing import Any

import pytest
from snakemake.iocontainers import Wildcards

from vitplasticity.workflow import runtime
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import FinetunePack, finetune_packs

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


# A pack's minutes, worked out by hand: one start-up allowance (15 min) and its runs' compute,
# times the attempt, rounded down. The paper's ViT-B/16 CIFAR-10 fp32 run computes 10,000 steps
# x 512 images x 105.147 GFLOP x 1.3 / 14 TFLOP/s = 49,989.96 s = 833.166 min; the demo's run
# 48 x 32 x 7.463 GFLOP x 1.3 / 14 TFLOP/s = 1.0645 s = 0.0177 min.
#
# | cell | runs | attempt | minutes | before (each run its own allowance) |
# |---|---:|---:|---|---|
# | vit_base / cifar10 | 1 | 1 | 15 + 833.166 = 848.17 -> 848 | 848 |
# | vit_base / cifar10 | 3 | 1 | 15 + 2,499.50 = 2,514.50 -> 2,514 | 3 x 848 = 2,544 |
# | vit_base / cifar10 | 7 | 1 | 15 + 5,832.16 = 5,847.16 -> 5,847 | 7 x 848 = 5,936 |
# | vit_base / cifar10 | 3 | 2 | 2 x 2,514.50 = 5,029.0 -> 5,028 | 3 x 1,696 = 5,088 |
# | demo_vit / demo-stripes | 16 | 1 | 15 + 0.284 = 15.28 -> 15 | 16 x 15 = 240 |
PACK_MINUTES = [
    ("paper", "vit_base", "cifar10", 1, 1, 848),
    ("paper", "vit_base", "cifar10", 3, 1, 2514),
    ("paper", "vit_base", "cifar10", 7, 1, 5847),
    ("paper", "vit_base", "cifar10", 3, 2, 5028),
    ("demo", "demo_vit", "demo-stripes", 16, 1, 15),
]


@pytest.mark.parametrize(("preset", "model", "dataset", "runs", "attempt", "minutes"), PACK_MINUTES)
def test_a_pack_asks_for_one_start_up_and_its_runs_compute(
    request: pytest.FixtureRequest,
    preset: str,
    model: str,
    dataset: str,
    runs: int,
    attempt: int,
    minutes: int,
) -> None:
    config = request.getfixturevalue(preset)
    costs = JobRuntimes(config)
    cell = of(model=model, dataset=dataset)
    assert costs.runs_minutes(cell, attempt, runs) == minutes
    pack = FinetunePack("sgd", (model,), (dataset,), (("head", 0.01, 0),) * runs)
    assert costs.pack(pack)(cell, attempt) == minutes


def test_a_pack_asks_for_at_most_the_cap(demo: dict[str, Any]) -> None:
    pack = finetune_packs(demo)[0]
    cell = of(model="demo_vit", dataset=pack.datasets[0])
    demo["scheduler"]["max_runtime_minutes"] = 16
    assert JobRuntimes(demo).pack(pack)(cell, 1) == 15
    assert JobRuntimes(demo).pack(pack)(cell, 2) == 16
