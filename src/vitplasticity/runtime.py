"""The wall time (minutes) a finetuning or plasticity job asks a scheduler for.

Pure functions of config values (plain Python, no torch import): the workflow's rules send
them to SLURM as each job's ``runtime`` resource. They live here, not in the workflow
profile, because a profile's resource expressions cannot read the config. Each estimate is
scaled by the retry attempt: a job killed at its time limit is resubmitted asking for more,
and a finetuning retry resumes from its checkpoint.

The step times (``STEP_SECONDS_BY_SIZE``) are estimates, not measurements: one training step
of batch 512 on one A100-class GPU. ViT-B/16 costs 52.7 G multiply-adds per 224 px image,
forward + backward (DESIGN.md; 105.1 GFLOP counted by ``torch.utils.flop_counter``,
docs/benchmarks.md), i.e. ~27 T multiply-adds per step; 0.5 s per step is ~108 TFLOP/s,
a tensor-core rate (TF32 or bf16). The other sizes are set relative to ViT-B/16: ViT-L/16
3.5x and ViT-H/14 9.5x its FLOPs; ViT-S/16 0.3x (27.5 GFLOP per image, docs/benchmarks.md,
is 0.26x) and ViT-Ti/16 0.1x.
"""

from __future__ import annotations

# Seconds of one batch-512 training step by ViT size (the second word of a timm id:
# vit_base_patch16_224 -> base). A size not listed gets the largest, so that an unknown
# model is never cut short.
STEP_SECONDS_BY_SIZE: dict[str, float] = {
    "tiny": 0.05,
    "small": 0.15,
    "base": 0.5,
    "large": 1.75,
    "huge": 4.75,
}
# The batch the step times are for (the paper's finetuning batch, PROTOCOL.md).
REFERENCE_BATCH = 512
# Finetuning: validation and test evaluations add ~30% to the training steps; start-up
# (imports, loading the prepared dataset and the weights) gets a fixed allowance.
FINETUNE_EVAL_FACTOR = 1.3
FINETUNE_FIXED_MINUTES = 15
# Plasticity: one forward pass per image and protocol, a third of a training step's work
# per image (backward ~2x forward); a 10x margin covers image decoding and the per-module
# norm bookkeeping, plus a fixed allowance for start-up.
PLASTICITY_FORWARD_SHARE = 3
PLASTICITY_MARGIN = 10
PLASTICITY_FIXED_MINUTES = 20


def model_size(timm_id: str) -> str:
    """The size word of a timm ViT id (``vit_base_patch16_224.augreg_in21k`` -> ``base``);
    ``""`` for an id without one."""
    return timm_id.split("_")[1] if "_" in timm_id else ""


def step_seconds(timm_id: str) -> float:
    """Estimated seconds of one batch-512 training step of the timm model ``timm_id``.

    Sizes not in ``STEP_SECONDS_BY_SIZE`` get the largest step time listed.
    """
    return STEP_SECONDS_BY_SIZE.get(model_size(timm_id), max(STEP_SECONDS_BY_SIZE.values()))


def finetune_minutes(steps: int, batch_size: int, timm_id: str, attempt: int = 1) -> int:
    """Minutes one finetuning run asks for: steps x step time (scaled from batch 512 to
    ``batch_size``), +30% for evaluation, +15 min, times the attempt; rounded down.

    Args:
        steps: the dataset's finetuning steps (``datasets.<name>.steps``).
        batch_size: images per optimizer step (``finetune.batch_size``).
        timm_id: the model's timm id (``models.<name>.timm_id``).
        attempt: the scheduler's attempt, 1 for the first submission.
    """
    batch_scale = batch_size / REFERENCE_BATCH
    seconds = FINETUNE_EVAL_FACTOR * steps * step_seconds(timm_id) * batch_scale
    return int(attempt * (FINETUNE_FIXED_MINUTES + seconds / 60))


def plasticity_minutes(n_pairs: int, n_protocols: int, timm_id: str, attempt: int = 1) -> int:
    """Minutes one plasticity job asks for: two images per pair and protocol, each a third
    of a training step's work per image, times a 10x margin, +20 min, times the attempt;
    rounded down.

    Args:
        n_pairs: image pairs measured (``plasticity.n_pairs``).
        n_protocols: protocols measured (``len(plasticity.protocols)``).
        timm_id: the model's timm id (``models.<name>.timm_id``).
        attempt: the scheduler's attempt, 1 for the first submission.
    """
    images = 2 * n_pairs * n_protocols
    seconds = (
        PLASTICITY_MARGIN
        * images
        * step_seconds(timm_id)
        / (PLASTICITY_FORWARD_SHARE * REFERENCE_BATCH)
    )
    return int(attempt * (PLASTICITY_FIXED_MINUTES + seconds / 60))
