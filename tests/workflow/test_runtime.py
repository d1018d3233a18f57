"""vitplasticity.workflow.runtime: the wall time a finetuning, plasticity or recommend job asks SLURM
for. Checked against values worked by hand from the documented model (training GFLOP per image
over the precision's sustained TFLOP/s; finetuning x1.3 + 15 min, plasticity and recommend a
third of an image per forward x10 + 20 min; x attempt; rounded down), with the arithmetic in
the comments, and against the properties the scheduler relies on: more work never asks for
less time, fp32 costs the documented factor over bf16, a retry asks for its attempt's
multiple, and no job asks for less than its fixed allowance. The FLOPs per image are checked
against tests/helpers/flops.py's hand count."""

from __future__ import annotations

import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from tests.helpers.flops import hand_count
from tests.helpers.repo import REPO
from tests.helpers.workflow import paper_dry_run
from vitplasticity.workflow import runtime

# Training FLOPs per image by hand: patches, width, depth, MLP width, patch size, tokens
# before the patches (class + registers).
FLOPS = {
    "vit_tiny_patch16_224": hand_count(196, 192, 12, 768, 16),
    "vit_base_patch16_224": hand_count(196, 768, 12, 3072, 16),
    "vit_large_patch16_224": hand_count(196, 1024, 24, 4096, 16),
    "vit_huge_patch14_224": hand_count(256, 1280, 32, 5120, 14),
    "vit_base_patch16_dinov3": hand_count(256, 768, 12, 3072, 16, prefix=5),
}
BASE = "vit_base_patch16_224.orig_in21k"
TINY = "vit_tiny_patch16_224"
# The paper's ViTs from the smallest to the largest (their counts rise: the FLOPS above).
BY_SIZE = [TINY, "vit_base_patch16_224", "vit_large_patch16_224", "vit_huge_patch14_224"]
PRECISIONS = ("fp32", "bf16")
DTYPES = ("float32", "float64")


@pytest.fixture(scope="module")
def paper() -> dict:
    return yaml.safe_load((REPO / "config/config.yaml").read_text())


# -- values worked by hand ----------------------------------------------------------------
# ViT-B/16 at 224 px: 105,147,150,336 FLOPs = 105.147150336 GFLOP per training image.


def test_paper_vit_b_on_cifar10_in_fp32_asks_for_14_hours(paper: dict) -> None:
    """fp32 at 14 TFLOP/s: 105.147150336 / 14,000 = 0.0075105107 s per image; 10,000 steps x
    512 = 5,120,000 images, x 1.3 for evaluation = 6,656,000: 49,989.96 s = 833.166 min;
    + 15 min = 848.166, rounded down 848. A retry asks 2 x 848.166 = 1696.33 -> 1696 and
    3 x 848.166 = 2544.50 -> 2544 (the attempt scales the unrounded minutes)."""
    steps = paper["datasets"]["cifar10"]["steps"]
    timm_id = paper["models"]["vit_base"]["timm_id"]
    batch_size = paper["finetune"]["batch_size"]
    precision = paper["finetune"]["precision"]
    assert (steps, batch_size, precision) == (10_000, 512, "fp32")
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision) == 848
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision, attempt=2) == 1696
    assert runtime.finetune_minutes(steps, batch_size, timm_id, precision, attempt=3) == 2544


def test_paper_vit_b_on_cifar10_in_bf16_keeps_two_hours(paper: dict) -> None:
    """bf16 at 107.6224 TFLOP/s: 105.147150336 / 107,622.4 = 0.00097700061 s per image (a
    step of 512: 0.5002 s); x 6,656,000 = 6,502.92 s = 108.382 min; + 15 = 123.382 -> 123;
    x 2 = 246.76 -> 246; x 3 = 370.15 -> 370."""
    steps = paper["datasets"]["cifar10"]["steps"]
    timm_id = paper["models"]["vit_base"]["timm_id"]
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16") == 123
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16", attempt=2) == 246
    assert runtime.finetune_minutes(steps, 512, timm_id, "bf16", attempt=3) == 370


def test_paper_plasticity_of_vit_b(paper: dict) -> None:
    """12,800 pairs x 2 images x 1 protocol = 25,600 forwards, each a third of an image:
    8,533.33 images x 0.0075105107 s (float32 = fp32) = 64.09 s, x 10 margin = 640.90 s =
    10.68 min; + 20 = 30.68 -> 30. Two protocols: 21.36 + 20 -> 41. float64 at 7 TFLOP/s
    doubles the seconds: 21.36 + 20 -> 41, and 42.73 + 20 -> 62."""
    p = paper["plasticity"]
    assert (p["n_pairs"], p["protocols"], p["dtype"]) == (12_800, ["embedding"], "float32")
    timm_id = paper["models"]["vit_base"]["timm_id"]
    assert runtime.plasticity_minutes(p["n_pairs"], 1, timm_id, p["dtype"]) == 30
    assert runtime.plasticity_minutes(p["n_pairs"], 2, timm_id, p["dtype"]) == 41
    assert runtime.plasticity_minutes(p["n_pairs"], 1, timm_id, "float64") == 41
    assert runtime.plasticity_minutes(p["n_pairs"], 2, timm_id, "float64") == 62


def test_recommend_of_the_paper_models_and_the_demo(paper: dict) -> None:
    """ViT-B, 12,800 pairs, the recommend block's defaults (batch 32, 50 warm-up steps, 8
    gradient batches), in float32: (25,600 pair forwards + 50 x 32 = 1,600 warm-up forwards)
    / 3 = 9,066.67 images, + 8 x 32 = 256 gradient images = 9,322.67 images x 0.0075105107 s
    x 10 margin = 700.18 s = 11.67 min; + 20 = 31.67 -> 31; x 2 = 63.34 -> 63. The demo's
    ViT-Ti (7.463 GFLOP, 256 pairs, batch 16, 20 warm-up steps, 4 batches): (512 + 320) / 3
    + 64 = 341.33 images x 7.463 / 14,000 s x 10 = 1.82 s: 20 min, the allowance."""
    rec = paper["recommend"]
    n_pairs = paper["plasticity"]["n_pairs"]
    settings = (rec["batch_size"], rec["warmup_steps"], rec["batches"])
    assert rec["n_pairs"] is None and settings == (32, 50, 8)
    assert runtime.recommend_minutes(n_pairs, *settings, BASE) == 31
    assert runtime.recommend_minutes(n_pairs, *settings, BASE, attempt=2) == 63
    assert runtime.recommend_minutes(256, 16, 20, 4, TINY) == 20


def test_vit_l_and_half_the_batch() -> None:
    """ViT-L/16: 369.013850112 GFLOP. bf16: / 107,622.4 x 6,656,000 = 22,821.4 s = 380.36
    min; + 15 -> 395. fp32: / 14,000 x 6,656,000 = 175,439.7 s = 2,924.0 min; + 15 -> 2938.
    ViT-B at batch 256 in bf16: half of 108.382 = 54.19 min; + 15 -> 69."""
    assert runtime.finetune_minutes(10_000, 512, "vit_large_patch16_224", "bf16") == 395
    assert runtime.finetune_minutes(10_000, 512, "vit_large_patch16_224", "fp32") == 2938
    assert runtime.finetune_minutes(10_000, 256, BASE, "bf16") == 69


# -- properties ---------------------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("timm_id", BY_SIZE)
def test_finetuning_asks_for_more_with_more_steps_and_larger_batches(
    timm_id: str, precision: str
) -> None:
    steps = [0, 1, 100, 1_000, 10_000, 20_000, 50_000]
    by_steps = [runtime.finetune_minutes(n, 512, timm_id, precision) for n in steps]
    assert by_steps == sorted(by_steps)
    batches = [1, 8, 64, 256, 512, 1024]
    by_batch = [runtime.finetune_minutes(10_000, b, timm_id, precision) for b in batches]
    assert by_batch == sorted(by_batch)
    # Beyond the allowance the time is proportional to the images (rounding aside): twice
    # the steps or twice the batch, twice the minutes above the 15 min allowance.
    once = runtime.finetune_minutes(20_000, 512, timm_id, precision) - 15
    for steps, batch_size in ((40_000, 512), (20_000, 1024)):
        twice = runtime.finetune_minutes(steps, batch_size, timm_id, precision) - 15
        assert 0 < 2 * once <= twice <= 2 * once + 1


def test_larger_models_ask_for_more() -> None:
    for precision in PRECISIONS:
        minutes = [runtime.finetune_minutes(10_000, 512, m, precision) for m in BY_SIZE]
        assert minutes == sorted(minutes) and len(set(minutes)) == len(minutes), minutes
    for dtype in DTYPES:
        minutes = [runtime.plasticity_minutes(12_800, 2, m, dtype) for m in BY_SIZE]
        assert minutes == sorted(minutes) and minutes[-1] > minutes[0], minutes
    minutes = [runtime.recommend_minutes(12_800, 32, 50, 8, m) for m in BY_SIZE]
    assert minutes == sorted(minutes) and minutes[-1] > minutes[0], minutes


@pytest.mark.parametrize("dtype", DTYPES)
def test_plasticity_asks_for_more_with_more_pairs_and_protocols(dtype: str) -> None:
    pairs = [1, 256, 1_024, 12_800, 100_000]
    for protocols in (1, 2):
        by_pairs = [runtime.plasticity_minutes(n, protocols, BASE, dtype) for n in pairs]
        assert by_pairs == sorted(by_pairs)
    one, two = (runtime.plasticity_minutes(100_000, n, BASE, dtype) for n in (1, 2))
    assert two > one


@pytest.mark.parametrize(
    "which", ["n_pairs", "batch_size", "warmup_steps", "batches"], ids=lambda name: name
)
def test_recommend_asks_for_more_with_each_of_its_settings(which: str) -> None:
    base = {"n_pairs": 12_800, "batch_size": 32, "warmup_steps": 50, "batches": 8}
    minutes = [
        runtime.recommend_minutes(**{**base, which: base[which] * factor}, timm_id=BASE)
        for factor in (1, 4, 16, 64, 256)
    ]
    assert minutes == sorted(minutes) and minutes[-1] > minutes[0], minutes


def test_fp32_costs_the_documented_factor_over_bf16() -> None:
    """Per image, fp32 takes 107.6224 / 14 = 7.687 times bf16's seconds (the A100's fp32
    rate has no tensor cores); float32 is fp32 by another name; float64 takes twice fp32."""
    for timm_id in (TINY, BASE, "vit_huge_patch14_224"):
        fp32 = runtime.image_seconds(timm_id, "fp32")
        assert fp32 / runtime.image_seconds(timm_id, "bf16") == Fraction("107.6224") / 14
        assert runtime.image_seconds(timm_id, "float32") == fp32
        assert runtime.image_seconds(timm_id, "float64") == 2 * fp32
        for steps in (1_000, 10_000):
            fp32_minutes = runtime.finetune_minutes(steps, 512, timm_id, "fp32")
            assert fp32_minutes >= runtime.finetune_minutes(steps, 512, timm_id, "bf16")


JOBS = {
    "finetune": (lambda attempt: runtime.finetune_minutes(10_000, 512, BASE, "fp32", attempt)),
    "finetune_tiny": (lambda attempt: runtime.finetune_minutes(1, 1, TINY, "bf16", attempt)),
    "plasticity": (lambda attempt: runtime.plasticity_minutes(12_800, 2, BASE, "float64", attempt)),
    "recommend": (lambda attempt: runtime.recommend_minutes(12_800, 32, 50, 8, BASE, attempt)),
}


@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("attempt", [2, 3, 5])
def test_a_retry_asks_for_its_attempts_multiple(job: str, attempt: int) -> None:
    """The attempt scales the unrounded minutes: k x first rounded down lies within
    [k x first's minutes, k x (first's minutes + 1))."""
    first = JOBS[job](1)
    assert attempt * first <= JOBS[job](attempt) < attempt * (first + 1)


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_no_job_asks_for_less_than_its_allowance(attempt: int) -> None:
    """The least work of each kind asks for exactly its fixed allowance (15 min finetuning,
    20 min plasticity and recommend) times the attempt: its seconds are a fraction of a
    minute; more work never asks for less."""
    assert runtime.finetune_minutes(0, 512, BASE, "fp32", attempt) == 15 * attempt
    assert runtime.finetune_minutes(1, 1, TINY, "bf16", attempt) == 15 * attempt
    assert runtime.plasticity_minutes(1, 1, TINY, "float32", attempt) == 20 * attempt
    assert runtime.recommend_minutes(1, 1, 0, 2, TINY, attempt) == 20 * attempt
    for timm_id in BY_SIZE:
        for steps in (1, 10, 10_000):
            assert runtime.finetune_minutes(steps, 512, timm_id, "bf16", attempt) >= 15 * attempt
        for n_pairs in (1, 12_800):
            assert runtime.plasticity_minutes(n_pairs, 1, timm_id, "float32", attempt) >= (
                20 * attempt
            )
            assert runtime.recommend_minutes(n_pairs, 1, 0, 2, timm_id, attempt) >= 20 * attempt


def test_the_work_is_the_architectures_count_whatever_the_tag() -> None:
    """Listed architectures (the paper's and the demo's among them) by their hand counts,
    their tags aside; DINOv3 ViT-B at its 256 px, not a 224 px ViT-B's."""
    for timm_id in (BASE, "vit_base_patch16_224", "vit_base_patch16_224.augreg2_in21k_ft_in1k"):
        assert runtime.train_gflop_per_image(timm_id) == Fraction(
            FLOPS["vit_base_patch16_224"], 10**9
        )
    for architecture, flops in FLOPS.items():
        assert runtime.TRAIN_FLOPS_PER_IMAGE[architecture] == flops
        assert runtime.train_gflop_per_image(f"{architecture}.any_tag") == Fraction(flops, 10**9)


def test_an_unlisted_id_is_counted_and_an_unknown_family_refused() -> None:
    """DeiT III ViT-M/16 is in no table: counted (196 patches, 512 wide, 12 blocks); the old
    estimate gave it ViT-H's work. A ResNet has no architecture: refused by name."""
    from vitplasticity.models.architectures import UnsupportedModel

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
        "from vitplasticity.workflow import runtime\n"
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

    from vitplasticity.models.build import train_flops_per_image

    for architecture, flops in runtime.TRAIN_FLOPS_PER_IMAGE.items():
        assert train_flops_per_image(architecture) == flops, architecture
        sizes = {cfg.input_size for cfg in get_arch_pretrained_cfgs(architecture).values()}
        assert len(sizes) == 1, (architecture, sizes)


def test_unknown_precision_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown precision 'fp16' \(known: bf16, float32"):
        runtime.finetune_minutes(10, 512, BASE, "fp16")


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
