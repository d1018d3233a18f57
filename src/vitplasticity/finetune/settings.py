"""The training settings of a finetuning job: each field is a ``vitplasticity finetune`` flag,
its check, and a ``params:`` entry of the finetune rules (see :mod:`vitplasticity.settings.declaration`).

Adding a setting: a field here (default, help, config key, bounds), the key with the same
default in workflow/schemas/config.schema.yaml, and its line in config.yaml; the flag, its
check and the rule's param and command line follow. tests/settings/test_settings_agreement.py fails
while the field and the schema disagree. Torch-free: the Snakefile imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from vitplasticity.models.spec import ModelSpec
from vitplasticity.settings.declaration import bad_setting, check_settings, setting
from vitplasticity.settings.sequences import sequence_length_setting, tokenizer_setting

__all__ = [
    "IMAGE_ONLY_TRAINING_FIELDS",
    "WORKFLOW_ONLY_KEYS",
    "TextFinetuneSettings",
    "TrainingSettings",
]

WORKFLOW_ONLY_KEYS: tuple[str, ...] = ("finetune.pack_runs",)
"""Keys of the finetune block that shape the jobs, not a run: no flag."""


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """The training settings that every run of one (experiment, model, dataset) shares.

    A run's identity (experiment, model, dataset, configuration, lr, seed) is not here: it
    is a :class:`vitplasticity.finetune.run.Run`, handed to :func:`vitplasticity.finetune.train.train`
    beside these settings, so that a packed job builds one ``TrainingSettings`` for all its
    runs. Field order is the order of the flags on the rule's command line.
    """

    # setting() returns a dataclasses.field, which ruff cannot see (RUF009).
    model_spec: dict[str, Any] = setting(  # noqa: RUF009
        help="the model's config entry, as JSON", key="models.<name>", json=True
    )
    optimizer: str = setting(
        "sgd",
        help="sgd (momentum) | adamw; no weight decay either way",
        key="experiments.<name>.optimizer",
        choices=("sgd", "adamw"),
    )
    steps: int = setting(help="optimizer steps", key="datasets.<name>.steps", minimum=1)
    val_every: int = setting(
        help="validation period in steps", key="datasets.<name>.val_every", minimum=1
    )
    batch_size: int = setting(
        512, help="images per optimizer step", key="finetune.batch_size", minimum=1
    )
    micro_batch_size: int = setting(
        512,
        help="images per forward pass; smaller than the batch accumulates gradients",
        key="finetune.micro_batch_size",
        minimum=1,
    )
    warmup_steps: int = setting(
        2000,
        help="linear warmup from 0, then cosine to 0",
        key="finetune.warmup_steps",
        minimum=0,
    )
    clip_grad_norm: float = setting(
        1.0,
        help="global gradient-norm clipping",
        key="finetune.clip_grad_norm",
        exclusive_minimum=0,
    )
    momentum: float = setting(
        0.9, help="SGD momentum (no nesterov)", key="finetune.momentum", minimum=0, maximum=1
    )
    adam_betas: tuple[float, float] = setting(
        (0.9, 0.999),
        help="AdamW betas",
        key="finetune.adam_betas",
        minimum=0,
        exclusive_maximum=1,
        metavar=("B1", "B2"),
    )
    val_fraction: float = setting(
        0.2,
        help="share held out for validation: of an image pool, a permutation seeded by the run "
        "seed; of a text's sequences, a fixed rule (every 1/f-th sequence), not seeded",
        key="finetune.val_fraction",
        exclusive_minimum=0,
        exclusive_maximum=1,
    )
    precision: str = setting(
        "fp32",
        help="fp32 (exact) | bf16 (autocast) | tf32 (TF32 matmuls on a GPU; fp32 on a CPU)",
        key="finetune.precision",
        choices=("fp32", "bf16", "tf32"),
    )
    device: str = setting("auto", help="auto | cpu | cuda[:N]", key="finetune.device")
    # 4: a SLURM GPU job decodes and augments ahead of the steps; the count never changes
    # the numbers (loader.train_batches), so it is not fingerprinted.
    num_workers: int = setting(
        4, help="data-loading worker processes", key="finetune.num_workers", minimum=0
    )
    augment: str = setting(
        "auto",
        help="where train crops/flips run: auto (on the GPU when the run is on one) | cpu | device",
        key="finetune.augment",
        choices=("auto", "cpu", "device"),
    )
    compile: bool = setting(
        False,
        help="torch.compile the model (GPU throughput; numbers may move ~1 ulp)",
        key="finetune.compile",
    )
    log_every: int = setting(
        50, help="steps between logged training rows", key="finetune.log_every", minimum=1
    )
    checkpoint_every: int = setting(
        500, help="steps between resumable checkpoints", key="finetune.checkpoint_every", minimum=1
    )
    demo: bool = setting(False, help="label the outputs as a demo", key="demo", switch=True)
    lora_rank: int = setting(
        8, help='LoRA rank r (configuration "lora"; paper: 8)', key="finetune.lora.rank", minimum=1
    )
    lora_alpha: float = setting(
        16.0,
        help='LoRA alpha (configuration "lora"; paper: 16)',
        key="finetune.lora.alpha",
        exclusive_minimum=0,
    )

    @cached_property
    def spec(self) -> ModelSpec:
        """The model entry's spec, parsed once per job (:meth:`validate` parses it first).

        Raises:
            ValueError: naming what the entry's family refuses.
        """
        return ModelSpec.from_config(self.model_spec)

    def validate(self, model: str = "<name>") -> None:
        """Check every value before any compute: the declared choices and bounds, then what
        involves several fields or the model.

        Args:
            model: the model's config key, named in a bad ``--model-spec``'s message.

        Raises:
            ValueError: naming the CLI flag and config key of the first bad value.
        """
        check_settings(self, {"models": model})
        if self.batch_size % self.micro_batch_size:
            raise bad_setting(
                "--micro-batch-size",
                "finetune.micro_batch_size",
                f"{self.micro_batch_size} does not divide the batch size {self.batch_size}",
            )
        try:
            self.spec  # noqa: B018 (parsed here, named by its flag; the run reuses it)
        except (TypeError, ValueError) as error:
            raise bad_setting("--model-spec", f"models.{model}", str(error)) from error


IMAGE_ONLY_TRAINING_FIELDS: tuple[str, ...] = (
    "num_workers",
    "augment",
    "compile",
    "lora_rank",
    "lora_alpha",
)
"""The TrainingSettings fields a text run does not use (the image loader's workers and
augmentation; compile, refused for text; LoRA's unless the run trains LoRA): the workflow
passes a text run their defaults and its provenance does not record them, so that it never
states a value the run did not run with."""


@dataclass(frozen=True, kw_only=True)
class TextFinetuneSettings:
    """How a text run turns its text file into training and validation sequences (its
    dataset entry's keys), and masks an encoder's (``finetune.mask_probability``). The
    ``finetune`` flags ``--tokenizer``, ``--sequence-length`` and ``--mask-probability``,
    which go with ``--text``."""

    tokenizer: str = tokenizer_setting()
    sequence_length: int = sequence_length_setting()
    mask_probability: float = setting(
        0.15,
        help="share of each sequence's tokens masked for an encoder's masked-LM loss (BERT: 0.15)",
        key="finetune.mask_probability",
        exclusive_minimum=0,
        exclusive_maximum=1,
    )
