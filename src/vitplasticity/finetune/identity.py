"""A run's identity (a :class:`vitplasticity.finetune.run.Run`) and its training settings: their
checks, done once before any compute, and :class:`FinetuneSettings`, the two together (with
the part of them a resumable checkpoint must match).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.models.architectures import parse_configuration
from vitplasticity.settings.declaration import bad_setting
from vitplasticity.utils.tracking import TrackedJob

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


def check_runs(runs: Sequence[Run], training: TrainingSettings) -> None:
    """Check every run's identity, then the training settings they share, before any compute
    (once per process: :func:`vitplasticity.finetune.train.train_runs` calls it).

    Raises:
        ValueError: naming the CLI flag and config key of the first bad value, or when
            ``runs`` is empty.
    """
    if not runs:
        raise ValueError("finetune: no run given")
    for run in runs:
        check_identity(run)
    # The runs of one job share their model (a packed job is one experiment, model, dataset).
    training.validate(runs[0].model)


@dataclass(frozen=True)
class FinetuneSettings:
    """One run: which run it is (its :class:`~vitplasticity.finetune.run.Run`) and the
    :class:`~vitplasticity.finetune.settings.TrainingSettings` it trains with (shared by the
    runs of one packed job). What the pieces of a run take."""

    run: Run
    training: TrainingSettings

    def record(self) -> dict[str, Any]:
        """The settings as one flat mapping, as the run's provenance records them: the
        training fields, then the run's."""
        return {**dataclasses.asdict(self.training), **dataclasses.asdict(self.run)}

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that shape the numbers (what a resumable checkpoint must match)."""
        fields = self.record()
        for name in _NOT_FINGERPRINTED:
            fields.pop(name)
        if "lora" not in parse_configuration(self.run.configuration):
            # LoRA settings shape only LoRA runs: other runs' checkpoints stay resumable.
            fields.pop("lora_rank")
            fields.pop("lora_alpha")
        return fields


def tracked_job(settings: FinetuneSettings, job_type: str = "finetune") -> TrackedJob:
    """The tracker run of a finetuning run: named by its results folder, grouped by its
    (experiment, model, dataset), its settings as the config."""
    run = settings.run
    return TrackedJob(
        name=run.directory,
        group=f"{run.experiment}/{run.model}/{run.dataset}",
        job_type=job_type,
        config=settings.record(),
    )
