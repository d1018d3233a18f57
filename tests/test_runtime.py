"""vitplasticity.runtime: the wall time a finetuning, plasticity or recommend job asks SLURM
for, against the estimate computed by hand in exact rational arithmetic from the documented
constants."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from tests.test_config import paper_dry_run
from vitplasticity import runtime

REPO = Path(__file__).resolve().parents[1]

# The documented training GFLOP per image (forward + backward): ViT-S/16 and ViT-B/16 as
# counted (docs/benchmarks.md), the others 0.1x, 3.5x and 9.5x ViT-B/16.
GFLOP = {
    "tiny": Fraction("10.51"),
    "small": Fraction("27.5"),
    "base": Fraction("105.1"),
    "large": Fraction("367.85"),
    "huge": Fraction("998.45"),
}
# The documented sustained TFLOP/s on an A100-class GPU, by precision.
TFLOPS = {
    "bf16": Fraction("107.6224"),
    "fp32": Fraction(14),
    "float32": Fraction(14),
    "float64": Fraction(7),
}
# The step times (seconds per batch-512 step) of the model before the precision mattered,
# which bf16 keeps for every size but small (now from its counted FLOPs, not 0.3x ViT-B).
OLD_STEP = {
    "tiny": Fraction(1, 20),
    "base": Fraction(1, 2),
    "large": Fraction(7, 4),
    "huge": Fraction(19, 4),
}
BASE = "vit_base_patch16_224.orig_in21k"


@pytest.fixture(scope="module")
def paper() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def size_of(timm_id: str) -> str:
    word = timm_id.split("_")[1] if "_" in timm_id else ""
    return word if word in GFLOP else "huge"


def seconds_per_image(timm_id: str, precision: str) -> Fraction:
    return GFLOP[size_of(timm_id)] * 10**9 / (TFLOPS[precision] * 10**12)


def exact_finetune(steps: int, batch_size: int, timm_id: str, precision: str, attempt: int) -> int:
    """attempt x (15 min + 1.3 x steps x batch_size x seconds per image), rounded down."""
    seconds = Fraction(13, 10) * steps * batch_size * seconds_per_image(timm_id, precision)
    return math.floor(attempt * (15 + seconds / 60))


def exact_plasticity(
    n_pairs: int, n_protocols: int, timm_id: str, precision: str, attempt: int
) -> int:
    """attempt x (20 min + 10 x two forwards per pair and protocol x a third of an image)."""
    seconds = 10 * 2 * n_pairs * n_protocols * seconds_per_image(timm_id, precision) / 3
    return math.floor(attempt * (20 + seconds / 60))


def exact_recommend(
    n_pairs: int, batch_size: int, warmup_steps: int, batches: int, timm_id: str, attempt: int
) -> int:
    """attempt x (20 min + 10 x (pair forwards and warm-up forwards at a third of an image,
    gradient batches at a whole one) in float32)."""
    images = Fraction(2 * n_pairs, 3) + Fraction(warmup_steps * batch_size, 3)
    images += batches * batch_size
    seconds = 10 * images * seconds_per_image(timm_id, "float32")
    return math.floor(attempt * (20 + seconds / 60))


def test_paper_vit_b_on_cifar10_in_fp32_asks_for_14_hours(paper: dict) -> None:
    """config.yaml finetunes in fp32: 105.1 GFLOP x 512 / 14 TFLOP/s = 3.84 s per step;
    10,000 steps x 1.3 = 49,967 s = 832 min 48 s, + 15 min: 847 min."""
    steps = paper["datasets"]["cifar10"]["steps"]
    timm_id = paper["models"]["vit_base"]["timm_id"]
    batch_size = paper["finetune"]["batch_size"]
    precision = paper["finetune"]["precision"]
    assert (steps, batch_size, precision) == (10_000, 512, "fp32")
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision) == 847
    # A TIMEOUT retry asks for the attempt's multiple.
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision, attempt=2) == 1695
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision, attempt=3) == 2543


def test_paper_vit_b_on_cifar10_in_bf16_keeps_two_hours(paper: dict) -> None:
    """bf16: 0.5 s per step, as before; 6,500 s = 108 min 20 s, + 15 min: 123 min."""
    steps = paper["datasets"]["cifar10"]["steps"]
    timm_id = paper["models"]["vit_base"]["timm_id"]
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16") == 123
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16", attempt=2) == 246
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16", attempt=3) == 370


def test_bf16_keeps_the_old_step_times_and_fp32_is_7_7_times_slower() -> None:
    for size, step in OLD_STEP.items():
        assert 512 * runtime.image_seconds(f"vit_{size}_patch16_224", "bf16") == step
    fp32 = runtime.image_seconds(BASE, "fp32")
    assert fp32 / runtime.image_seconds(BASE, "bf16") == Fraction("107.6224") / 14
    assert 7.68 < float(fp32 / runtime.image_seconds(BASE, "bf16")) < 7.69
    # fp32 and float32 (plasticity.dtype's name) are one precision; float64 is half as fast.
    assert runtime.image_seconds(BASE, "float32") == fp32
    assert runtime.image_seconds(BASE, "float64") == 2 * fp32


def test_paper_plasticity_of_vit_b(paper: dict) -> None:
    """12,800 pairs x 2 images x 1 protocol = 25,600 forwards at a third of 105.1 GFLOP, at
    14 TFLOP/s in float32, x 10 margin: 640.6 s, + 20 min: 30 min (in_situ too: 41 min);
    in float64 twice the seconds."""
    p = paper["plasticity"]
    assert (p["n_pairs"], p["protocols"], p["dtype"]) == (12_800, ["embedding"], "float32")
    timm_id = paper["models"]["vit_base"]["timm_id"]
    assert runtime.plasticity_minutes(p["n_pairs"], 1, timm_id, p["dtype"]) == 30
    assert runtime.plasticity_minutes(p["n_pairs"], 2, timm_id, p["dtype"]) == 41
    assert runtime.plasticity_minutes(p["n_pairs"], 1, timm_id, "float64") == 41
    assert runtime.plasticity_minutes(p["n_pairs"], 2, timm_id, "float64") == 62


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_every_paper_job_matches_the_exact_estimate(paper: dict, attempt: int) -> None:
    p = paper["plasticity"]
    batch_size = paper["finetune"]["batch_size"]
    checked = 0
    for model in paper["models"].values():
        timm_id = model["timm_id"]
        for dataset in paper["datasets"].values():
            for precision in ("fp32", "bf16"):
                got = runtime.finetune_minutes(
                    dataset["steps"], batch_size, timm_id, precision, attempt
                )
                assert got == exact_finetune(
                    dataset["steps"], batch_size, timm_id, precision, attempt
                )
                checked += 1
        for dtype in ("float32", "float64"):
            got = runtime.plasticity_minutes(
                p["n_pairs"], len(p["protocols"]), timm_id, dtype, attempt
            )
            assert got == exact_plasticity(
                p["n_pairs"], len(p["protocols"]), timm_id, dtype, attempt
            )
        got = runtime.recommend_minutes(p["n_pairs"], 32, 50, 8, timm_id, attempt)
        assert got == exact_recommend(p["n_pairs"], 32, 50, 8, timm_id, attempt)
    assert checked == len(paper["models"]) * 11 * 2


def test_recommend_of_the_paper_models_and_the_demo(paper: dict) -> None:
    """ViT-B, 12,800 pairs, the recommend block's defaults (batch 32, 50 warm-up steps, 8
    gradient batches): 9,322.7 images of training work at 14 TFLOP/s, x 10 margin: 699.9 s,
    + 20 min: 31 min. The demo's tiny ViT (256 pairs, batch 16, 20 warm-up steps, 4
    batches) stays at the 20 min allowance."""
    rec = paper["recommend"]
    n_pairs = paper["plasticity"]["n_pairs"]
    settings = (rec["batch_size"], rec["warmup_steps"], rec["batches"])
    assert rec["n_pairs"] is None and settings == (32, 50, 8)
    assert runtime.recommend_minutes(n_pairs, *settings, BASE) == 31
    assert runtime.recommend_minutes(n_pairs, *settings, BASE, attempt=2) == 63
    assert runtime.recommend_minutes(256, 16, 20, 4, "vit_tiny_patch16_224") == 20


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
def test_work_by_the_size_in_the_timm_id(timm_id: str, size: str) -> None:
    for precision in TFLOPS:
        expected = GFLOP[size] / (1000 * TFLOPS[precision])
        assert runtime.image_seconds(timm_id, precision) == expected


def test_unknown_precision_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown precision 'fp16' \(known: bf16, float32"):
        runtime.finetune_minutes(10, 512, BASE, "fp16")


def test_larger_batches_models_and_precisions_ask_for_more() -> None:
    # Half the batch, half the training time: 15 + 54 min 10 s.
    assert runtime.finetune_minutes(10_000, 256, BASE, "bf16") == 69
    assert runtime.finetune_minutes(10_000, 512, "vit_large_patch16_224", "bf16") == 394
    assert runtime.finetune_minutes(10_000, 512, "vit_large_patch16_224", "fp32") == 2929
    # A job never asks for less than its fixed allowance.
    assert runtime.finetune_minutes(1, 1, "vit_tiny_patch16_224", "fp32") == 15
    assert runtime.plasticity_minutes(1, 1, "vit_tiny_patch16_224", "float64") == 20


def test_a_cap_limits_the_request_and_none_leaves_it() -> None:
    assert runtime.capped(847, None) == 847
    assert runtime.capped(847, 2880) == 847
    assert runtime.capped(15_838, 2880) == 2880


@pytest.mark.slow
def test_the_paper_plan_asks_for_at_most_the_schedulers_cap(tmp_path: Path) -> None:
    """`snakemake -n` on config.yaml with scheduler.max_runtime_minutes: ViT-H's fp32
    DomainNet run asks for the cap instead of ~11 days; ViT-B's cifar10 run keeps its own."""
    cap = 2880  # two days, a common partition limit
    runs = {
        "sgd/vit_base/cifar10/mha/lr0.01_seed0": 847,
        "model_size/vit_huge/domainnet-clipart/mha/lr0.01_seed0": cap,
    }
    result = paper_dry_run(
        tmp_path,
        *(f"results/finetune/{run}/summary.json" for run in runs),
        edit=yaml.safe_dump({"scheduler": {"max_runtime_minutes": cap}}),
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    asked = {}
    for block in re.split(r"\n(?=rule )", text):
        if block.startswith("rule finetune:"):
            output = re.search(r"output: results/finetune/(\S+)/summary.json", block).group(1)
            asked[output] = int(re.search(r"runtime=(\d+)", block).group(1))
    assert asked == runs
    # Uncapped, ViT-H would ask for far more than the partition allows.
    huge = runtime.finetune_minutes(20_000, 512, "vit_huge_patch14_224.orig_in21k", "fp32")
    assert huge == 15_838 > 5 * cap  # 11 days
