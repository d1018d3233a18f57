"""The wall time (minutes) a finetuning, plasticity or recommend job asks a scheduler for.

Pure functions of config values (plain Python, no torch import): the workflow's rules send
them to SLURM as each job's ``runtime`` resource. They live here, not in the workflow
profile, because a profile's resource expressions cannot read the config. Each estimate is
scaled by the retry attempt: a job killed at its time limit is resubmitted asking for more,
and a finetuning retry resumes from its checkpoint.

The model: a job's work in training FLOPs (forward + backward of one image, by ViT size,
``TRAIN_GFLOP_PER_IMAGE``) over a sustained throughput on one A100-class GPU that depends on
the precision the job computes in (``SUSTAINED_TFLOPS``). Both are estimates, not
measurements: no GPU was available to the session that wrote this; ``python -m
benchmarks.run --device cuda`` (docs/benchmarks.md) measures images/s and the FLOPs per
image on a real one. The arithmetic is exact (fractions), rounded down once at the end.
"""

from __future__ import annotations

import math
from fractions import Fraction

# Training FLOPs of one 224 px image, forward + backward (2 FLOPs per multiply-add), in
# GFLOP, by ViT size (the second word of a timm id: vit_base_patch16_224 -> base). ViT-S/16
# and ViT-B/16 are counted by torch.utils.flop_counter (docs/benchmarks.md; DESIGN.md's
# "52.7 GFLOP" for ViT-B/16 counts multiply-adds). The others are set relative to ViT-B/16,
# as the step times of the previous model were: ViT-Ti/16 0.1x, ViT-L/16 3.5x, ViT-H/14 9.5x.
# A size not listed gets the largest, so that an unknown model is never cut short.
_BASE_GFLOP = Fraction("105.1")
TRAIN_GFLOP_PER_IMAGE: dict[str, Fraction] = {
    "tiny": _BASE_GFLOP / 10,
    "small": Fraction("27.5"),
    "base": _BASE_GFLOP,
    "large": _BASE_GFLOP * Fraction(7, 2),
    "huge": _BASE_GFLOP * Fraction(19, 2),
}
# Sustained throughput (TFLOP/s) of a training step on one A100-class GPU, by the precision
# the job computes in (finetune.precision; plasticity.dtype).
# - bf16: 107.6224, the rate the previous model's ViT-B/16 step of 0.5 s at batch 512 implied
#   (512 x 105.1 GFLOP / 0.5 s); 34% of the A100's 312 TFLOP/s dense bf16 tensor-core peak.
# - fp32: 14, ~72% of the A100's 19.5 TFLOP/s fp32 peak (NVIDIA A100 datasheet). fp32 means
#   no tensor cores: TF32 is off by default (torch.backends.cuda.matmul.allow_tf32 is False)
#   and nothing in vitplasticity turns it on. A ViT-B/16 step of 512 takes 3.84 s, 7.7x bf16's.
# - float64 (plasticity.dtype: float64): 7, the same ~72% of the A100's 9.7 TFLOP/s fp64
#   peak. cuBLAS may run fp64 matmuls on the A100's fp64 tensor cores (19.5 TFLOP/s), but
#   the plain rate is the safe side; consumer GPUs run fp64 at 1/32 to 1/64 of fp32 and would
#   need far more than this.
SUSTAINED_TFLOPS: dict[str, Fraction] = {
    "bf16": Fraction("107.6224"),
    "fp32": Fraction(14),
    "float64": Fraction(7),
}
# plasticity.dtype names fp32 as torch does.
PRECISION_ALIASES = {"float32": "fp32"}

# Finetuning: validation and test evaluations add ~30% to the training steps; start-up
# (imports, loading the prepared dataset and the weights) gets a fixed allowance.
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


def model_size(timm_id: str) -> str:
    """The size word of a timm ViT id (``vit_base_patch16_224.augreg_in21k`` -> ``base``);
    ``""`` for an id without one."""
    return timm_id.split("_")[1] if "_" in timm_id else ""


def image_seconds(timm_id: str, precision: str) -> Fraction:
    """Estimated seconds of one image's training forward + backward on one GPU.

    Args:
        timm_id: the model's timm id; sizes not in ``TRAIN_GFLOP_PER_IMAGE`` get the largest.
        precision: ``fp32`` or ``bf16`` (``finetune.precision``), ``float32`` or ``float64``
            (``plasticity.dtype``).

    Raises:
        ValueError: ``precision`` is none of these.
    """
    name = PRECISION_ALIASES.get(precision, precision)
    if name not in SUSTAINED_TFLOPS:
        known = sorted([*SUSTAINED_TFLOPS, *PRECISION_ALIASES])
        raise ValueError(f"unknown precision {precision!r} (known: {', '.join(known)})")
    gflop = TRAIN_GFLOP_PER_IMAGE.get(model_size(timm_id), max(TRAIN_GFLOP_PER_IMAGE.values()))
    return gflop / (1000 * SUSTAINED_TFLOPS[name])


def _minutes(fixed: int, seconds: Fraction, attempt: int) -> int:
    return math.floor(attempt * (fixed + seconds / 60))


def finetune_minutes(
    steps: int, batch_size: int, timm_id: str, precision: str, attempt: int = 1
) -> int:
    """Minutes one finetuning run asks for: steps x batch_size images of training work,
    +30% for evaluation, +15 min, times the attempt; rounded down.

    Args:
        steps: the dataset's finetuning steps (``datasets.<name>.steps``).
        batch_size: images per optimizer step (``finetune.batch_size``).
        timm_id: the model's timm id (``models.<name>.timm_id``).
        precision: ``finetune.precision`` (fp32 or bf16).
        attempt: the scheduler's attempt, 1 for the first submission.
    """
    images = steps * batch_size
    seconds = FINETUNE_EVAL_FACTOR * images * image_seconds(timm_id, precision)
    return _minutes(FINETUNE_FIXED_MINUTES, seconds, attempt)


def plasticity_minutes(
    n_pairs: int, n_protocols: int, timm_id: str, precision: str, attempt: int = 1
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
    seconds = PLASTICITY_MARGIN * forwards * image_seconds(timm_id, precision) / FORWARD_SHARE
    return _minutes(PLASTICITY_FIXED_MINUTES, seconds, attempt)


def recommend_minutes(
    n_pairs: int, batch_size: int, warmup_steps: int, batches: int, timm_id: str, attempt: int = 1
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
    seconds = PLASTICITY_MARGIN * training_images * image_seconds(timm_id, RECOMMEND_PRECISION)
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
