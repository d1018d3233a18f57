"""What a run prepares before its first step: the checks, the device, the model and
optimizer, and the data (:class:`RunContext`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitplasticity.data import loader, store
from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.finetune.checkpoint import CHECKPOINT_NAME
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.model import RunModel, build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.models.build import pick_device

log = logging.getLogger(__name__)


def augment_on_device(settings: TrainingSettings, device: torch.device) -> bool:
    """Whether the run crops and flips on ``device`` (``augment``: auto means on a GPU)."""
    if settings.augment == "auto":
        return device.type == "cuda"
    return settings.augment == "device"


@dataclass
class RunContext:
    """What :func:`setup_run` prepares before the first step: model, optimizer, data, device."""

    settings: FinetuneSettings
    out_dir: Path
    device: torch.device
    run_model: RunModel  # its model is the compiled one under ``compile``
    optimizer: torch.optim.Optimizer
    batches: loader.TrainBatches  # DeviceTrainBatches when augmenting on the device
    on_device: bool  # crops and flips on the device
    train_size: int  # training images (the data position a checkpoint records)
    val_set: loader.EvalSet
    test_set: loader.EvalSet
    resolved: dict[str, Any]  # what the settings resolved to on this machine (provenance)
    started: float  # time.perf_counter() when the run started

    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / CHECKPOINT_NAME


def checked_device(training: TrainingSettings, dataset_dir: str | Path) -> torch.device:
    """The device of the runs, after checking the dataset folder and the device.

    Raises:
        FileNotFoundError: when ``dataset_dir`` is not a prepared dataset.
        ValueError: for a GPU device asked for where none is visible.
    """
    dataset_dir = Path(dataset_dir)
    if not dataset_dir.is_dir():
        raise FileNotFoundError(f"--dataset-dir: prepared dataset {dataset_dir} does not exist")
    store.read_meta(dataset_dir)  # names the folder when it is not a prepared dataset
    device = pick_device(training.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device (finetune.device): {training.device!r} but no GPU is visible")
    return device


def setup_run(
    settings: FinetuneSettings,
    device: torch.device,
    dataset_dir: str | Path,
    out_dir: str | Path,
) -> RunContext:
    """Build the run's model, optimizer and data on ``device`` (settings, dataset and device
    checked already: :func:`vitplasticity.finetune.identity.check_runs`,
    :func:`checked_device`).

    Raises:
        UnsupportedModel: for a model its architecture refuses to finetune
            (:func:`vitplasticity.finetune.model.build_run_model`).
    """
    dataset_dir, out_dir = Path(dataset_dir), Path(out_dir)
    training = settings.training
    started = time.perf_counter()
    splits = loader.load_finetune_splits(dataset_dir, settings.run.seed, training.val_fraction)
    run_model = build_run_model(settings, splits.num_classes, device)
    optimizer = build_optimizer(run_model.trainable, settings)
    pre = run_model.preprocessing
    bank = loader.ImageBank(splits.train.images)
    on_device = augment_on_device(training, device)
    batch_class = loader.DeviceTrainBatches if on_device else loader.TrainBatches
    batches = batch_class(bank, splits.train.labels, pre, training.batch_size, settings.run.seed)
    if training.compile:
        # The compiled module shares the parameters: optimizer and checkpoints are unchanged.
        run_model = dataclasses.replace(run_model, model=torch.compile(run_model.model))
    val_set, test_set = loader.eval_set(splits.val, pre), loader.eval_set(splits.test, pre)
    resolved = _resolved(device, splits, len(test_set), bank.decoded, on_device, pre)
    log.info("run %s: %s", out_dir, resolved)
    return RunContext(
        settings=settings,
        out_dir=out_dir,
        device=device,
        run_model=run_model,
        optimizer=optimizer,
        batches=batches,
        on_device=on_device,
        train_size=len(bank),
        val_set=val_set,
        test_set=test_set,
        resolved=resolved,
        started=started,
    )


def _resolved(
    device: torch.device,
    splits: loader.FinetuneSplits,
    test_size: int,
    decoded_once: bool,
    on_device: bool,
    pre: Preprocessing,
) -> dict[str, Any]:
    """What the run resolved at setup (logged, and recorded in its summary)."""
    return {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "num_classes": splits.num_classes,
        "split_sizes": {"train": len(splits.train), "val": len(splits.val), "test": test_size},
        "val_source": splits.val_source,
        "train_images_decoded_once": decoded_once,
        "augment_on": str(device) if on_device else "cpu",
        "preprocessing": dataclasses.asdict(pre),
        "model_selection": "test accuracy at the step of best validation accuracy (earliest)",
    }
