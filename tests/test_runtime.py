"""vitplasticity.runtime: the wall time a finetuning or plasticity job asks SLURM for, against
the estimate computed by hand in exact rational arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from vitplasticity import runtime

REPO = Path(__file__).resolve().parents[1]

# The documented step times (seconds per batch-512 step), as exact fractions.
STEP = {
    "tiny": Fraction(1, 20),
    "small": Fraction(3, 20),
    "base": Fraction(1, 2),
    "large": Fraction(7, 4),
    "huge": Fraction(19, 4),
}


@pytest.fixture(scope="module")
def paper() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def exact_finetune(steps: int, batch_size: int, step: Fraction, attempt: int) -> int:
    """attempt x (15 min + 1.3 x steps x step time x batch_size / 512), rounded down."""
    seconds = Fraction(13, 10) * steps * step * Fraction(batch_size, 512)
    return math.floor(attempt * (15 + seconds / 60))


def exact_plasticity(n_pairs: int, n_protocols: int, step: Fraction, attempt: int) -> int:
    """attempt x (20 min + 10 x two images per pair and protocol x step time / (3 x 512))."""
    seconds = 10 * 2 * n_pairs * n_protocols * step / (3 * 512)
    return math.floor(attempt * (20 + seconds / 60))


def test_paper_vit_b_on_cifar10_asks_for_two_hours(paper: dict) -> None:
    """10,000 steps x 0.5 s x 1.3 = 6,500 s = 108 min 20 s, + 15 min: 123 min."""
    steps = paper["datasets"]["cifar10"]["steps"]
    timm_id = paper["models"]["vit_base"]["timm_id"]
    batch_size = paper["finetune"]["batch_size"]
    assert (steps, batch_size) == (10_000, 512)
    assert runtime.finetune_minutes(steps, batch_size, timm_id) == 123
    # A TIMEOUT retry asks for the attempt's multiple: 246 min 40 s, 370 min.
    assert runtime.finetune_minutes(steps, batch_size, timm_id, attempt=2) == 246
    assert runtime.finetune_minutes(steps, batch_size, timm_id, attempt=3) == 370


def test_paper_plasticity_of_vit_b(paper: dict) -> None:
    """12,800 pairs x 2 images x 1 protocol = 25,600 forwards at a third of 0.5 s / 512
    images, x 10 margin: 83.3 s, + 20 min: 21 min (the in_situ protocol too: 22 min)."""
    p = paper["plasticity"]
    assert (p["n_pairs"], p["protocols"]) == (12_800, ["embedding"])
    timm_id = paper["models"]["vit_base"]["timm_id"]
    assert runtime.plasticity_minutes(p["n_pairs"], 1, timm_id) == 21
    assert runtime.plasticity_minutes(p["n_pairs"], 2, timm_id) == 22


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_every_paper_job_matches_the_exact_estimate(paper: dict, attempt: int) -> None:
    p = paper["plasticity"]
    batch_size = paper["finetune"]["batch_size"]
    checked = 0
    for model in paper["models"].values():
        step = STEP.get(model["timm_id"].split("_")[1], STEP["huge"])
        for dataset in paper["datasets"].values():
            got = runtime.finetune_minutes(dataset["steps"], batch_size, model["timm_id"], attempt)
            assert got == exact_finetune(dataset["steps"], batch_size, step, attempt)
            checked += 1
        got = runtime.plasticity_minutes(
            p["n_pairs"], len(p["protocols"]), model["timm_id"], attempt
        )
        assert got == exact_plasticity(p["n_pairs"], len(p["protocols"]), step, attempt)
    assert checked == len(paper["models"]) * 11


@pytest.mark.parametrize(
    ("timm_id", "size"),
    [
        ("vit_tiny_patch16_224", "tiny"),
        ("vit_small_patch16_224.augreg_in21k_ft_in1k", "small"),
        ("vit_base_patch16_224.augreg2_in21k_ft_in1k", "base"),
        ("vit_large_patch16_224.augreg_in21k_ft_in1k", "large"),
        ("vit_huge_patch14_clip_224.laion2b_ft_in12k_in1k", "huge"),
        ("vit_giant_patch14_dinov2.lvd142m", "huge"),  # not listed: the largest
        ("deit3_medium_patch16_224", "huge"),
        ("resnet50", "huge"),  # no size word at all
    ],
)
def test_step_time_by_the_size_in_the_timm_id(timm_id: str, size: str) -> None:
    assert runtime.step_seconds(timm_id) == float(STEP[size])


def test_larger_batches_and_models_ask_for_more() -> None:
    base = "vit_base_patch16_224"
    # Half the batch, half the training time: 15 + 54 min 10 s.
    assert runtime.finetune_minutes(10_000, 256, base) == 69
    assert runtime.finetune_minutes(10_000, 512, "vit_large_patch16_224") == 394
    # A job never asks for less than its fixed allowance.
    assert runtime.finetune_minutes(1, 1, "vit_tiny_patch16_224") == 15
    assert runtime.plasticity_minutes(1, 1, "vit_tiny_patch16_224") == 20
