"""A tiny finetuning run's settings and command line, and its first training batch."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tests.helpers.run_settings import finetune_settings
from vitplasticity.data import loader
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.models.spec import TimmSpec


def settings_for(spec: TimmSpec, **overrides: Any) -> FinetuneSettings:
    """The settings of a 6-step SGD run of ``spec`` on demo-stripes, tuning mha, on the CPU,
    with ``overrides``."""
    base = dict(
        experiment="sgd",
        model="tiny",
        dataset="demo-stripes",
        model_spec=dataclasses.asdict(spec),
        configuration="mha",
        lr=0.05,
        seed=0,
        steps=6,
        val_every=3,
        batch_size=8,
        micro_batch_size=4,
        warmup_steps=2,
        device="cpu",
        log_every=2,
        checkpoint_every=2,
    )
    return finetune_settings(**{**base, **overrides})


def first_batch(dataset: Path, settings: FinetuneSettings, pre: Any, step: int = 0) -> tuple:
    """The (images, labels) training batch of ``step`` of a run of ``settings`` on ``dataset``."""
    splits = loader.load_finetune_splits(dataset, settings.run.seed, settings.training.val_fraction)
    batches = loader.TrainBatches(
        loader.ImageBank(splits.train.images),
        splits.train.labels,
        pre,
        settings.training.batch_size,
        0,
    )
    return batches[step]


def cli_args(spec: TimmSpec, dataset: Path, out: Path, **flags: Any) -> list[str]:
    """``vitplasticity finetune``'s argv for :func:`settings_for`'s run of ``spec`` on
    ``dataset`` into ``out``; ``flags`` (flag name without dashes -> text) replace or add."""
    values = {
        "experiment": "sgd",
        "model": "tiny",
        "dataset": "demo-stripes",
        "model-spec": json.dumps(dataclasses.asdict(spec)),
        "dataset-dir": str(dataset),
        "configuration": "mha",
        "optimizer": "sgd",
        "lr": "0.05",
        "seed": "0",
        "steps": "6",
        "val-every": "3",
        "batch-size": "8",
        "micro-batch-size": "4",
        "warmup-steps": "2",
        "clip-grad-norm": "1.0",
        "momentum": "0.9",
        "val-fraction": "0.2",
        "precision": "fp32",
        "device": "cpu",
        "num-workers": "0",
        "log-every": "2",
        "checkpoint-every": "2",
        "out-dir": str(out),
        **flags,
    }
    argv = ["finetune", "--adam-betas", "0.9", "0.999"]
    for key, value in values.items():
        argv += [f"--{key}", value]
    return argv
