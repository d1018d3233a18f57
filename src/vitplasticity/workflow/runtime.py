"""The wall time (minutes) a finetuning, plasticity or recommend job asks a scheduler for.

Pure functions of config values: the workflow's rules send them to SLURM as each job's
``runtime`` resource. They live here, not in the workflow profile, because a profile's
resource expressions cannot read the config. Each estimate is scaled by the retry attempt: a
job killed at its time limit is resubmitted asking for more, and a finetuning retry resumes
from its checkpoint.

The model: a job's work in training FLOPs (forward + backward of one image at the model's
input resolution) over a sustained throughput on one A100-class GPU that depends on the
precision the job computes in (``SUSTAINED_TFLOPS``). The throughput is an estimate, not a
measurement: no GPU was available to the session that wrote this; ``python -m
benchmarks.run --device cuda`` (docs/benchmarks.md) measures images/s and the FLOPs per
image on a real one. The arithmetic is exact (fractions), rounded down once at the end.

The FLOPs per image are the model's architecture's own count
(``Architecture.train_flops_per_image``: the embedding and every block, forward and
backward, on the meta device), never guessed from the id:

- ``TRAIN_FLOPS_PER_IMAGE`` holds that count for the timm architectures config.yaml names
  or suggests (tests/workflow/test_runtime.py recounts every entry, so it cannot drift from the
  architectures, timm or torch). Looking one up imports nothing: Snakemake evaluates every
  job's runtime when it builds the DAG (about 1,600 evaluations in a dry run of the paper's
  workflow), in the main process, in every dry run and again in every SLURM job, which
  re-parses the Snakefile; the whole dry run takes about 9 s.
- Any other timm id is counted when its first job's runtime is asked for in a process (once
  per process and id). That imports torch and timm, measured at 1.9 s and 4.2 s (timm
  includes torch) on the 2-core machine that wrote this, against 0.02 s for this module,
  and builds the model on the meta device (0.4 s for ViT-B, 2 s for DINOv3 7B): a few
  seconds more per Snakemake process, for models the table does not list. A model that no
  architecture knows is refused there (UnsupportedModel, naming its class).

The id's tag does not change the count (each listed architecture's tags share its input
size; the test checks it). The model entry's ``kwargs`` are not seen: a model shrunk by them
(the demo's 32 px ViT) asks for its architecture's time, more than it needs; one enlarged by
them (a larger ``img_size``) would ask for too little.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from fractions import Fraction

from vitplasticity.workflow.calibration import Calibration, Throughput

# Training FLOPs of one image (forward + backward, 2 FLOPs per multiply-add) at the input
# resolution of each timm architecture, as its architecture counts them (models.
# train_flops_per_image). The old estimate read a size word from the id and assumed 224 px:
# DINOv2 at 518 px came out at a tenth of its count, DINOv3 7B ("7b", an unknown word) at a
# tenth of it too.
TRAIN_FLOPS_PER_IMAGE: dict[str, int] = {
    # ViT at 224 px: the paper's ViT-B/16, ViT-L/16, ViT-H/14 (docs/protocol.md), the demo's
    # ViT-Ti/16 (its kwargs shrink it), ViT-S/16.
    "vit_tiny_patch16_224": 7_463_144_448,
    "vit_small_patch16_224": 27_475_384_320,
    "vit_base_patch16_224": 105_147_150_336,
    "vit_large_patch16_224": 369_013_850_112,
    "vit_huge_patch14_224": 1_003_377_623_040,
    # DINOv3 at 256 px (config.yaml's optional dinov3_base and the sizes it suggests).
    "vit_small_patch16_dinov3": 37_320_726_528,
    "vit_small_plus_patch16_dinov3": 48_404_699_136,
    "vit_base_patch16_dinov3": 141_145_288_704,
    "vit_large_patch16_dinov3": 493_811_171_328,
    "vit_huge_plus_patch16_dinov3": 1_348_145_479_680,
    "vit_7b_patch16_dinov3": 10_646_400_663_552,
    # DINOv2 at 518 px.
    "vit_small_patch14_dinov2": 279_562_217_472,
    "vit_base_patch14_dinov2": 908_205_871_104,
    "vit_large_patch14_dinov2": 3_039_174_377_472,
    "vit_giant_patch14_dinov2": 10_697_584_877_568,
}
# Sustained throughput (TFLOP/s) of a training step on one A100-class GPU, by the precision
# the job computes in (finetune.precision; plasticity.dtype).
# - bf16: 107.6224, the rate the previous model's ViT-B/16 step of 0.5 s at batch 512 implied
#   (512 x 105.1 GFLOP / 0.5 s; counted exactly, 105.147 GFLOP, the step is 0.5002 s); 34%
#   of the A100's 312 TFLOP/s dense bf16 tensor-core peak.
# - fp32: 14, ~72% of the A100's 19.5 TFLOP/s fp32 peak (NVIDIA A100 datasheet). fp32 means
#   no tensor cores: TF32 is off by default (torch.backends.cuda.matmul.allow_tf32 is False)
#   and nothing in vitplasticity turns it on. A ViT-B/16 step of 512 takes 3.84 s, 7.7x bf16's.
# - float64 (plasticity.dtype: float64): 7, the same ~72% of the A100's 9.7 TFLOP/s fp64
#   peak. cuBLAS may run fp64 matmuls on the A100's fp64 tensor cores (19.5 TFLOP/s), but
#   the plain rate is the safe side; consumer GPUs run fp64 at 1/32 to 1/64 of fp32 and would
#   need far more than this.
# - tf32 (finetune.precision: tf32): 53.8112, half the bf16 rate, as the A100's dense TF32
#   tensor-core peak (156 TFLOP/s) is half its bf16 one. Derived, not measured.
# These are the last resort: measured speeds come first (vitplasticity.workflow.calibration).
SUSTAINED_TFLOPS: dict[str, Fraction] = {
    "bf16": Fraction("107.6224"),
    "tf32": Fraction("53.8112"),
    "fp32": Fraction(14),
    "float64": Fraction(7),
}
# plasticity.dtype names fp32 as torch does.
PRECISION_ALIASES = {"float32": "fp32"}

# Finetuning: validation and test evaluations add ~30% to the training steps; start-up
# (imports, loading the prepared dataset and the weights) gets a fixed allowance, once per
# job: a pack's runs share its process, so a job of several runs asks for one allowance and
# their compute (pack_minutes).
FINETUNE_EVAL_FACTOR = Fraction(13, 10)
FINETUNE_FIXED_MINUTES = 15
# Plasticity: one forward pass per image and protocol, a third of a training image's work
# (backward ~2x forward); a 10x margin covers image decoding and the per-module norm
# bookkeeping, plus a fixed allowance for start-up. The recommend job gets the same margin
# and allowance.
FORWARD_SHARE = 3
PLASTICITY_MARGIN = 10
PLASTICITY_FIXED_MINUTES = 20
# The recommend command computes in float32: its --dtype default, which the rule does not set.
RECOMMEND_PRECISION = "fp32"


def train_gflop_per_image(timm_id: str) -> Fraction:
    """The training GFLOP of one image of ``timm_id`` (its tag aside): the table's count, or
    the architecture's count of the model built on the meta device (torch and timm imported
    then; see the module's docstring).

    Raises:
        UnsupportedModel: no architecture knows the model (naming its class).
    """
    architecture = timm_id.partition(".")[0]
    flops = TRAIN_FLOPS_PER_IMAGE.get(architecture)
    if flops is None:
        flops = _counted_flops(timm_id)
    return Fraction(flops, 10**9)


@functools.cache
def _counted_flops(timm_id: str) -> int:
    from vitplasticity.models.build import train_flops_per_image

    return train_flops_per_image(timm_id)


def _precision_name(precision: str) -> str:
    name = PRECISION_ALIASES.get(precision, precision)
    if name not in SUSTAINED_TFLOPS:
        known = sorted([*SUSTAINED_TFLOPS, *PRECISION_ALIASES])
        raise ValueError(f"unknown precision {precision!r} (known: {', '.join(known)})")
    return name


def throughput(
    timm_id: str,
    precision: str,
    calibration: Calibration | None = None,
    training_run: bool = False,
) -> Throughput:
    """Seconds of one image's training forward + backward on one GPU, and their source:
    a finished run's measured speed (``training_run`` jobs only: a finetuning run of the same
    model and precision), else the calibration's sustained TFLOP/s (gpu-check JSON, then
    the GPU class table), else the A100 estimate (:data:`SUSTAINED_TFLOPS`).

    Raises:
        ValueError: ``precision`` is unknown.
    """
    name = _precision_name(precision)
    if calibration is not None:
        if training_run:
            measured = calibration.measured_image_seconds(timm_id.partition(".")[0], name)
            if measured is not None:
                return Throughput(measured, "finished")
        rate = calibration.tflops(name)
        if rate is not None:
            return Throughput(train_gflop_per_image(timm_id) / (1000 * rate[0]), rate[1])
    seconds = train_gflop_per_image(timm_id) / (1000 * SUSTAINED_TFLOPS[name])
    return Throughput(seconds, "a100_estimate")


def image_seconds(timm_id: str, precision: str, calibration: Calibration | None = None) -> Fraction:
    """Estimated seconds of one image's training forward + backward on one GPU, from the
    calibration's sustained TFLOP/s or the A100 estimate (:func:`throughput`).

    Args:
        timm_id: the model's timm id (:func:`train_gflop_per_image`).
        precision: ``fp32``, ``bf16`` or ``tf32`` (``finetune.precision``), ``float32`` or
            ``float64`` (``plasticity.dtype``).
        calibration: measured speeds (vitplasticity.workflow.calibration); None: the A100
            estimate.

    Raises:
        ValueError: ``precision`` is none of these.
    """
    return throughput(timm_id, precision, calibration).image_seconds


def finetune_step_seconds(batch_size: int, timm_id: str, precision: str) -> Fraction:
    """Estimated seconds of one finetuning step of ``batch_size`` images on one GPU, +30%
    for evaluation (as :func:`finetune_minutes` counts a run, without its start-up), by the
    A100 estimate (:func:`image_seconds`): what a budgeted verification's report converts its
    steps to GPU-hours with."""
    return FINETUNE_EVAL_FACTOR * batch_size * image_seconds(timm_id, precision)


def _minutes(fixed: Fraction | int, seconds: Fraction, attempt: int) -> int:
    return math.floor(attempt * (fixed + seconds / 60))


def finetune_compute_seconds(
    steps: int,
    batch_size: int,
    timm_id: str,
    precision: str,
    calibration: Calibration | None = None,
) -> Fraction:
    """Seconds of one finetuning run's work, its start-up left out: steps x batch_size images
    of training work, +30% for evaluation.

    Args:
        steps: the dataset's finetuning steps (``datasets.<name>.steps``).
        batch_size: images per optimizer step (``finetune.batch_size``).
        timm_id: the model's timm id (``models.<name>.timm_id``).
        precision: ``finetune.precision`` (fp32, bf16 or tf32).
        calibration: measured speeds, finished runs' first (:func:`throughput`).
    """
    per_image = throughput(timm_id, precision, calibration, training_run=True).image_seconds
    return FINETUNE_EVAL_FACTOR * steps * batch_size * per_image


def pack_minutes(compute_seconds: Iterable[Fraction], attempt: int = 1) -> int:
    """Minutes a job of finetuning runs done one after another asks for: one start-up
    allowance (15 min) plus every run's compute, times the attempt; rounded down. A run of
    its own is a pack of one.

    Args:
        compute_seconds: each run's :func:`finetune_compute_seconds`.
        attempt: the scheduler's attempt, 1 for the first submission.
    """
    seconds = sum(compute_seconds, Fraction(0))
    return _minutes(FINETUNE_FIXED_MINUTES, seconds, attempt)


def finetune_minutes(
    steps: int,
    batch_size: int,
    timm_id: str,
    precision: str,
    attempt: int = 1,
    calibration: Calibration | None = None,
) -> int:
    """Minutes one finetuning run asks for: steps x batch_size images of training work,
    +30% for evaluation, +15 min, times the attempt; rounded down (:func:`pack_minutes` of
    the run alone; the arguments are :func:`finetune_compute_seconds`'s).
    """
    seconds = finetune_compute_seconds(steps, batch_size, timm_id, precision, calibration)
    return pack_minutes([seconds], attempt)


def plasticity_minutes(
    n_pairs: int,
    n_protocols: int,
    timm_id: str,
    precision: str,
    attempt: int = 1,
    calibration: Calibration | None = None,
) -> int:
    """Minutes one plasticity job asks for: two images per pair and protocol, each a third
    of a training image's work, times a 10x margin, +20 min, times the attempt; rounded down.

    Args:
        n_pairs: image pairs measured (``plasticity.n_pairs``).
        n_protocols: protocols measured (``len(plasticity.protocols)``).
        timm_id: the model's timm id (``models.<name>.timm_id``).
        precision: ``plasticity.dtype`` (float32 or float64).
        attempt: the scheduler's attempt, 1 for the first submission.
    """
    forwards = 2 * n_pairs * n_protocols
    per_image = image_seconds(timm_id, precision, calibration)
    seconds = PLASTICITY_MARGIN * forwards * per_image / FORWARD_SHARE
    return _minutes(PLASTICITY_FIXED_MINUTES, seconds, attempt)


def recommend_minutes(
    n_pairs: int,
    batch_size: int,
    warmup_steps: int,
    batches: int,
    timm_id: str,
    attempt: int = 1,
    calibration: Calibration | None = None,
) -> int:
    """Minutes one recommend job asks for, in float32: its plasticity pairs (two forwards
    each) and head warm-up batches (forwards only), a third of a training image's work per
    image, and its gradient batches (forward + backward), times a 10x margin, +20 min, times
    the attempt; rounded down.

    Args:
        n_pairs: plasticity pairs (``recommend.n_pairs``, else ``plasticity.n_pairs``).
        batch_size: images per gradient and warm-up batch (``recommend.batch_size``).
        warmup_steps: head-only warm-up steps (``recommend.warmup_steps``).
        batches: gradient batches (``recommend.batches``).
        timm_id: the model's timm id (``models.<name>.timm_id``).
        attempt: the scheduler's attempt, 1 for the first submission.
    """
    training_images = (
        Fraction(2 * n_pairs + warmup_steps * batch_size, FORWARD_SHARE) + batches * batch_size
    )
    per_image = image_seconds(timm_id, RECOMMEND_PRECISION, calibration)
    seconds = PLASTICITY_MARGIN * training_images * per_image
    return _minutes(PLASTICITY_FIXED_MINUTES, seconds, attempt)


def capped(minutes: int, max_minutes: int | None) -> int:
    """``minutes``, or ``max_minutes`` when that is smaller (config
    ``scheduler.max_runtime_minutes``; None: no cap).

    A partition's MaxTime rejects or holds a job that asks for more. A finetuning run that
    needs longer than the cap is stopped at its limit (SLURM sends SIGTERM first: the run
    writes its checkpoint) and resumes from it on its retry, so capping trades one long job
    for several resumable ones.
    """
    return minutes if max_minutes is None else min(minutes, max_minutes)
