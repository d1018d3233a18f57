"""A run's :class:`~vitplasticity.finetune.identity.FinetuneSettings` from one flat set of
keyword arguments, as the tests write them: the :class:`~vitplasticity.finetune.run.Run` fields make
the run, the rest its :class:`~vitplasticity.finetune.settings.TrainingSettings`."""

from __future__ import annotations

import dataclasses
from typing import Any

from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TrainingSettings

RUN_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Run))


def finetune_settings(**fields: Any) -> FinetuneSettings:
    """The settings of ``fields`` (every :class:`Run` field, plus training settings)."""
    run = Run(**{name: fields.pop(name) for name in RUN_FIELDS})
    return FinetuneSettings(run, TrainingSettings(**fields))
