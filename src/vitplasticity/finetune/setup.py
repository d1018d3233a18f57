"""What a run prepares before its first step: the checks, the device, the model and
optimizer, its task and data (:class:`RunContext`), from its source: an image dataset here
(:class:`ImageSource`), a text file in :mod:`vitplasticity.finetune.text_run`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from vitplasticity.data import loader, store
from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.finetune.checkpoint import CHECKPOINT_NAME, fingerprint
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.model import RunModel, build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.tasks import CLASSIFICATION, Batch, Task
from vitplasticity.models.build import pick_device

log = logging.getLogger(__name__)


def augment_on_device(settings: TrainingSettings, device: torch.device) -> bool:
    """Whether the run crops and flips on ``device`` (``augment``: auto means on a GPU)."""
    if settings.augment == "auto":
        return device.type == "cuda"
    return settings.augment == "device"


class StepInputs(Protocol):
    """The training batches of a run, the batch of a step known from the step alone (so a
    resumed run or a continued rung sees the batches an uninterrupted one sees)."""

    size: int  # training samples: the data position a checkpoint records

    def items(self, start_step: int, end: int) -> Iterator[Any]:
        """What the batches of steps ``start_step, ..., end - 1`` are made of, in order
        (prepared ahead by loader workers where there are)."""

    def batch(self, item: Any) -> Batch:
        """The batch of one step from its item (where needed, augmented on the device)."""


class RunSource(Protocol):
    """Where the runs of a job get their data and task: a prepared image dataset
    (:class:`ImageSource`) or a text file (:class:`vitplasticity.finetune.text_run.TextSource`)."""

    def check(self, training: TrainingSettings) -> torch.device:
        """The device of the runs, after checking the data and the source's own settings."""

    def key(self, settings: FinetuneSettings) -> str:
        """Fingerprint of what shapes a run's numbers (its checkpoint and kept copy match it)."""

    def setup(self, settings: FinetuneSettings, device: torch.device, out_dir: Path) -> RunContext:
        """The run's model, optimizer, task and data on ``device``."""


@dataclass
class RunContext:
    """What a source prepares before the first step: model, optimizer, task, data, device."""

    settings: FinetuneSettings
    out_dir: Path
    device: torch.device
    run_model: RunModel  # its model is the compiled one under ``compile``
    optimizer: torch.optim.Optimizer
    task: Task
    inputs: StepInputs
    evaluation: Any  # the task's validation (and test) data
    key: str  # :meth:`RunSource.key` of the run's settings
    record: dict[str, Any]  # the settings the summary's provenance records
    resolved: dict[str, Any]  # what the settings resolved to on this machine (provenance)
    started: float  # time.perf_counter() when the run started

    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / CHECKPOINT_NAME


@dataclass(frozen=True)
class ImageInputs:
    """The training batches of an image run (:class:`StepInputs`): from the loader, cropped
    and flipped on the device when the run augments there."""

    batches: loader.TrainBatches  # DeviceTrainBatches when augmenting on the device
    on_device: bool
    device: torch.device
    num_workers: int

    @property
    def size(self) -> int:
        return len(self.batches.bank)

    def items(self, start_step: int, end: int) -> Iterator[Any]:
        pin = self.device.type == "cuda"
        return loader.train_batches(self.batches, start_step, end, self.num_workers, pin)

    def batch(self, item: Any) -> Batch:
        """The uint8 images and labels of one step."""
        if not self.on_device:
            return item
        canvas, sizes, boxes, flips, labels = item
        canvas = canvas.to(self.device, non_blocking=True)
        input_size = self.batches.pre.input_size
        return loader.augment_on_device(canvas, sizes, boxes, flips, input_size), labels


@dataclass(frozen=True)
class EvalSets:
    """A classification run's evaluation data: validation and test sets (an image run's
    :class:`~vitplasticity.data.loader.EvalSet`, a text run's ``TensorSet``)."""

    val_set: Any
    test_set: Any


@dataclass(frozen=True)
class ImageSource:
    """The runs' data is a prepared image dataset; the task, :class:`Classification`."""

    dataset_dir: Path

    def check(self, training: TrainingSettings) -> torch.device:
        """The device of the runs, after checking the dataset folder and the device.

        Raises:
            FileNotFoundError: when ``dataset_dir`` is not a prepared dataset.
            ValueError: for a GPU device asked for where none is visible.
        """
        if not self.dataset_dir.is_dir():
            raise FileNotFoundError(
                f"--dataset-dir: prepared dataset {self.dataset_dir} does not exist"
            )
        store.read_meta(self.dataset_dir)  # names the folder when it is not a prepared dataset
        return usable_device(training)

    def key(self, settings: FinetuneSettings) -> str:
        return fingerprint(settings.fingerprint_fields())

    def setup(self, settings: FinetuneSettings, device: torch.device, out_dir: Path) -> RunContext:
        """Build the run's model, optimizer and data on ``device`` (settings, dataset and
        device checked already: :func:`vitplasticity.finetune.identity.check_runs`,
        :meth:`check`).

        Raises:
            UnsupportedModel: for a model its architecture refuses to finetune
                (:func:`vitplasticity.finetune.model.build_run_model`).
        """
        training, started = settings.training, time.perf_counter()
        seed = settings.run.seed
        splits = loader.load_finetune_splits(self.dataset_dir, seed, training.val_fraction)
        run_model = build_run_model(settings, splits.num_classes, device)
        optimizer = build_optimizer(run_model.trainable, settings)
        pre = run_model.preprocessing
        bank = loader.ImageBank(splits.train.images)
        on_device = augment_on_device(training, device)
        batch_class = loader.DeviceTrainBatches if on_device else loader.TrainBatches
        batches = batch_class(bank, splits.train.labels, pre, training.batch_size, seed)
        if training.compile:
            # The compiled module shares the parameters: optimizer and checkpoints unchanged.
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
            task=CLASSIFICATION,
            inputs=ImageInputs(batches, on_device, device, training.num_workers),
            evaluation=EvalSets(val_set, test_set),
            key=self.key(settings),
            record=settings.record(),
            resolved=resolved,
            started=started,
        )


def usable_device(training: TrainingSettings) -> torch.device:
    """The device ``training`` asks for.

    Raises:
        ValueError: for a GPU device asked for where none is visible.
    """
    device = pick_device(training.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device (finetune.device): {training.device!r} but no GPU is visible")
    return device


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
