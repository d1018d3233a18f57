"""vitplasticity.runtime: the wall time a finetuning, plasticity or recommend job asks SLURM
for, against the estimate computed by hand in exact rational arithmetic from the documented
constants and the training FLOPs counted by hand (tests/test_train_flops.py's formula)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from tests.helpers.flops import hand_count
from tests.helpers.workflow import paper_dry_run
from vitplasticity import runtime

REPO = Path(__file__).resolve().parents[1]

# Training FLOPs per image by hand: patches, width, depth, MLP width, patch size, tokens
# before the patches (class + registers).
FLOPS = {
    "vit_tiny_patch16_224": hand_count(196, 192, 12, 768, 16),
    "vit_base_patch16_224": hand_count(196, 768, 12, 3072, 16),
    "vit_large_patch16_224": hand_count(196, 1024, 24, 4096, 16),
    "vit_huge_patch14_224": hand_count(256, 1280, 32, 5120, 14),
    "vit_base_patch16_dinov3": hand_count(256, 768, 12, 3072, 16, prefix=5),
}
# The documented sustained TFLOP/s on an A100-class GPU, by precision.
TFLOPS = {
    "bf16": Fraction("107.6224"),
    "fp32": Fraction(14),
    "float32": Fraction(14),
    "float64": Fraction(7),
}
BASE = "vit_base_patch16_224.orig_in21k"


@pytest.fixture(scope="module")
def paper() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def seconds_per_image(timm_id: str, precision: str) -> Fraction:
    return Fraction(FLOPS[timm_id.partition(".")[0]]) / (TFLOPS[precision] * 10**12)


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
    """config.yaml finetunes in fp32: 105.147 GFLOP x 512 / 14 TFLOP/s = 3.845 s per step;
    10,000 steps x 1.3 = 49,990 s = 833 min 10 s, + 15 min: 848 min."""
    steps = paper["datasets"]["cifar10"]["steps"]
    timm_id = paper["models"]["vit_base"]["timm_id"]
    batch_size = paper["finetune"]["batch_size"]
    precision = paper["finetune"]["precision"]
    assert (steps, batch_size, precision) == (10_000, 512, "fp32")
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision) == 848
    # A TIMEOUT retry asks for the attempt's multiple.
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision, attempt=2) == 1696
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision, attempt=3) == 2544


def test_paper_vit_b_on_cifar10_in_bf16_keeps_two_hours(paper: dict) -> None:
    """bf16: 0.5002 s per step (0.5 s before); 6,503 s = 108 min 23 s, + 15 min: 123 min."""
    steps = paper["datasets"]["cifar10"]["steps"]
    timm_id = paper["models"]["vit_base"]["timm_id"]
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16") == 123
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16", attempt=2) == 246
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16", attempt=3) == 370


def test_fp32_is_7_7_times_slower_than_bf16_and_float64_twice_fp32() -> None:
    fp32 = runtime.image_seconds(BASE, "fp32")
    assert fp32 / runtime.image_seconds(BASE, "bf16") == Fraction("107.6224") / 14
    assert 7.68 < float(fp32 / runtime.image_seconds(BASE, "bf16")) < 7.69
    # fp32 and float32 (plasticity.dtype's name) are one precision; float64 is half as fast.
    assert runtime.image_seconds(BASE, "float32") == fp32
    assert runtime.image_seconds(BASE, "float64") == 2 * fp32


def test_paper_plasticity_of_vit_b(paper: dict) -> None:
    """12,800 pairs x 2 images x 1 protocol = 25,600 forwards at a third of 105.147 GFLOP,
    at 14 TFLOP/s in float32, x 10 margin: 640.9 s, + 20 min: 30 min (in_situ too: 41 min);
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
    gradient batches): 9,322.7 images of training work at 14 TFLOP/s, x 10 margin: 700.2 s,
    + 20 min: 31 min. The demo's tiny ViT (256 pairs, batch 16, 20 warm-up steps, 4
    batches) stays at the 20 min allowance."""
    rec = paper["recommend"]
    n_pairs = paper["plasticity"]["n_pairs"]
    settings = (rec["batch_size"], rec["warmup_steps"], rec["batches"])
    assert rec["n_pairs"] is None and settings == (32, 50, 8)
    assert runtime.recommend_minutes(n_pairs, *settings, BASE) == 31
    assert runtime.recommend_minutes(n_pairs, *settings, BASE, attempt=2) == 63
    assert runtime.recommend_minutes(256, 16, 20, 4, "vit_tiny_patch16_224") == 20


def test_the_work_is_the_architectures_count_whatever_the_tag() -> None:
    """Listed architectures (the paper's and the demo's among them) by their hand counts,
    their tags aside; DINOv3 ViT-B at its 256 px, not a 224 px ViT-B's."""
    for timm_id in (BASE, "vit_base_patch16_224", "vit_base_patch16_224.augreg2_in21k_ft_in1k"):
        assert runtime.train_gflop_per_image(timm_id) == Fraction(
            FLOPS["vit_base_patch16_224"], 10**9
        )
    for architecture, flops in FLOPS.items():
        assert runtime.TRAIN_FLOPS_PER_IMAGE[architecture] == flops
        for precision in TFLOPS:
            expected = Fraction(flops, 10**9) / (1000 * TFLOPS[precision])
            assert runtime.image_seconds(f"{architecture}.any_tag", precision) == expected


def test_an_unlisted_id_is_counted_and_an_unknown_family_refused() -> None:
    """DeiT III ViT-M/16 is in no table: counted (196 patches, 512 wide, 12 blocks); the old
    estimate gave it ViT-H's work. A ResNet has no architecture: refused by name."""
    from vitplasticity.architectures import UnsupportedModel

    assert "deit3_medium_patch16_224" not in runtime.TRAIN_FLOPS_PER_IMAGE
    flops = hand_count(196, 512, 12, 2048, 16)
    assert runtime.train_gflop_per_image("deit3_medium_patch16_224.fb_in1k") == Fraction(
        flops, 10**9
    )
    with pytest.raises(UnsupportedModel, match="ResNet"):
        runtime.train_gflop_per_image("resnet50")


def test_listed_ids_import_neither_torch_nor_timm() -> None:
    """Every job's runtime is evaluated when Snakemake builds its DAG, in every process."""
    script = (
        "import sys\n"
        "from vitplasticity import runtime\n"
        "for timm_id in sys.argv[1:]:\n"
        "    runtime.finetune_minutes(10_000, 512, timm_id, 'fp32')\n"
        "    runtime.plasticity_minutes(12_800, 2, timm_id, 'float64')\n"
        "print(sorted(m for m in ('torch', 'timm') if m in sys.modules))\n"
    )
    ids = [f"{architecture}.tag" for architecture in runtime.TRAIN_FLOPS_PER_IMAGE]
    result = subprocess.run(
        [sys.executable, "-c", script, *ids], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_every_listed_count_is_the_architectures() -> None:
    """The table cannot drift from the architectures, timm or torch: each entry recounted on
    the meta device; and each architecture's tags share its input size, so that the tag
    cannot change the count."""
    from timm.models import get_arch_pretrained_cfgs

    from vitplasticity.models import train_flops_per_image

    for architecture, flops in runtime.TRAIN_FLOPS_PER_IMAGE.items():
        assert train_flops_per_image(architecture) == flops, architecture
        sizes = {cfg.input_size for cfg in get_arch_pretrained_cfgs(architecture).values()}
        assert len(sizes) == 1, (architecture, sizes)


def test_unknown_precision_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown precision 'fp16' \(known: bf16, float32"):
        runtime.finetune_minutes(10, 512, BASE, "fp16")


def test_larger_batches_models_and_precisions_ask_for_more() -> None:
    # Half the batch, half the training time: 15 + 54 min 11 s.
    assert runtime.finetune_minutes(10_000, 256, BASE, "bf16") == 69
    assert runtime.finetune_minutes(10_000, 512, "vit_large_patch16_224", "bf16") == 395
    assert runtime.finetune_minutes(10_000, 512, "vit_large_patch16_224", "fp32") == 2938
    # A job never asks for less than its fixed allowance.
    assert runtime.finetune_minutes(1, 1, "vit_tiny_patch16_224", "fp32") == 15
    assert runtime.plasticity_minutes(1, 1, "vit_tiny_patch16_224", "float64") == 20


def test_a_cap_limits_the_request_and_none_leaves_it() -> None:
    assert runtime.capped(848, None) == 848
    assert runtime.capped(848, 2880) == 848
    assert runtime.capped(15_916, 2880) == 2880


@pytest.mark.slow
def test_the_paper_plan_asks_for_at_most_the_schedulers_cap(tmp_path: Path) -> None:
    """`snakemake -n` on config.yaml with scheduler.max_runtime_minutes: ViT-H's fp32
    DomainNet run asks for the cap instead of ~11 days; ViT-B's cifar10 run keeps its own."""
    cap = 2880  # two days, a common partition limit
    runs = {
        "sgd/vit_base/cifar10/mha/lr0.01_seed0": 848,
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
    assert huge == 15_916 > 5 * cap  # 11 days
