"""The settings of text finetuning beyond the finetune block's: how the text becomes
sequences (its dataset entry's, :mod:`vitplasticity.settings.sequences`) and how an encoder's
tokens are masked (``text_finetune``). Torch-free: the Snakefile imports it.

A text run trains with the :class:`~vitplasticity.finetune.settings.TrainingSettings` of
the ``finetune`` block (batch size, warm-up, clipping, precision, checkpoints...), its steps
and validation period from its dataset entry, its optimizer from ``text_finetune``, and these.
"""

from __future__ import annotations

from dataclasses import dataclass

from vitplasticity.settings.declaration import setting
from vitplasticity.settings.sequences import sequence_length_setting, tokenizer_setting

__all__ = ["IMAGE_ONLY_TRAINING_FIELDS", "TEXT_FINETUNE_RUN_KEYS", "TextFinetuneSettings"]

IMAGE_ONLY_TRAINING_FIELDS: tuple[str, ...] = (
    "num_workers",
    "augment",
    "compile",
    "lora_rank",
    "lora_alpha",
)
"""The TrainingSettings fields a text run does not use (the image loader's workers and
augmentation, compile, LoRA): the workflow passes them no value and a text run's provenance
does not record them, so that it never states a value the run did not run with."""

TEXT_FINETUNE_RUN_KEYS: tuple[str, ...] = (
    "enabled",
    "experiment",
    "run_models",
    "datasets",
    "configurations",
    "lrs",
    "seeds",
    "optimizer",
)
"""Keys of the text_finetune block that say which runs, not a setting of this class (the grid,
and the TrainingSettings flag --optimizer)."""


@dataclass(frozen=True, kw_only=True)
class TextFinetuneSettings:
    """How ``vitplasticity finetune-text`` turns a text file into training and validation
    sequences (its dataset entry's keys), and masks an encoder's (``text_finetune``)."""

    tokenizer: str = tokenizer_setting()
    sequence_length: int = sequence_length_setting()
    mask_probability: float = setting(
        0.15,
        help="share of each sequence's tokens masked for an encoder's masked-LM loss (BERT: 0.15)",
        key="text_finetune.mask_probability",
        exclusive_minimum=0,
        exclusive_maximum=1,
    )
