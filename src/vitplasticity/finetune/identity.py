"""A run's identity (a :class:`vitplasticity.config.Run`) checked, and one run's settings:
its identity with the :class:`~vitplasticity.finetune.settings.TrainingSettings` it trains
with, and the part of them a resumable checkpoint must match.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vitplasticity.architectures import parse_configuration
from vitplasticity.config import Run
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.settings import bad_setting

# Settings that do not change a run's numbers: a checkpoint written under other values of
# these is still resumed.
_NOT_FINGERPRINTED = ("checkpoint_every", "num_workers")


def check_identity(run: Run) -> None:
    """Check a run's configuration, learning rate and seed before any compute.

    Raises:
        ValueError: naming the CLI flag and config key of the first bad value.
    """
    try:
        parse_configuration(run.configuration)
    except ValueError as error:
        raise bad_setting(
            "--configuration", "experiments.<name>.configurations", str(error)
        ) from None
    if not (run.lr > 0 and math.isfinite(run.lr)):
        raise bad_setting(
            "--lr", "experiments.<name>.lrs", f"must be a finite number > 0, got {run.lr}"
        )
    if run.seed < 0:
        raise bad_setting("--seed", "experiments.<name>.seeds", f"must be >= 0, got {run.seed}")


_IDENTITY_FIELDS = tuple(field.name for field in dataclasses.fields(Run))


@dataclass(frozen=True, kw_only=True)
class FinetuneSettings(TrainingSettings):
    """One run: its identity (the fields of :class:`vitplasticity.config.Run`) and its
    :class:`TrainingSettings`, flat, so that each field is the CLI flag of that name.

    What :func:`run` and the pieces of a run take. Build one from its two parts with
    :meth:`of`; :attr:`identity` and :attr:`training` give them back.
    """

    experiment: str
    model: str
    dataset: str
    configuration: str
    lr: float
    seed: int

    @classmethod
    def of(cls, run: Run, training: TrainingSettings) -> FinetuneSettings:
        """The settings of ``run`` trained with ``training``."""
        shared = {f.name: getattr(training, f.name) for f in dataclasses.fields(TrainingSettings)}
        return cls(**shared, **{name: getattr(run, name) for name in _IDENTITY_FIELDS})

    @property
    def identity(self) -> Run:
        """Which run this is (experiment, model, dataset, configuration, lr, seed)."""
        return Run(**{name: getattr(self, name) for name in _IDENTITY_FIELDS})

    @property
    def training(self) -> TrainingSettings:
        """The training settings alone (what the runs of one packed job share)."""
        fields = dataclasses.fields(TrainingSettings)
        return TrainingSettings(**{f.name: getattr(self, f.name) for f in fields})

    def validate(self, model: str | None = None) -> None:
        """Check the identity, then the training settings, before any compute.

        Raises:
            ValueError: naming the CLI flag and config key of the first bad value.
        """
        check_identity(self.identity)
        super().validate(self.model if model is None else model)

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that shape the numbers (what a resumable checkpoint must match)."""
        fields = dataclasses.asdict(self)
        for name in _NOT_FINGERPRINTED:
            fields.pop(name)
        if "lora" not in parse_configuration(self.configuration):
            # LoRA settings shape only LoRA runs: other runs' checkpoints stay resumable.
            fields.pop("lora_rank")
            fields.pop("lora_alpha")
        return fields
