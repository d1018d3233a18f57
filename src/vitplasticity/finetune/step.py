"""One optimizer update: gradients of the task's loss accumulated over micro-batches,
clipped, applied at the scheduled learning rate (:mod:`vitplasticity.finetune.tasks` says
what the loss is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vitplasticity.finetune.gradients import group_grad_norms
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.model import RunModel
from vitplasticity.finetune.schedule import warmup_cosine_lr
from vitplasticity.finetune.tasks import CLASSIFICATION, Batch, Task


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step measured."""

    loss: float  # mean cross-entropy over the batch
    grad_norm: float  # total gradient norm before clipping
    lr: float  # learning rate of this update
    group_norms: dict[str, float]  # per component group, before clipping (when asked)

    @property
    def finite(self) -> bool:
        """False when the loss or the gradient is NaN or infinite (the run diverged)."""
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


@dataclass(frozen=True)
class PendingStep:
    """An optimizer step whose loss and gradient norm are still on the device: reading them
    (:meth:`read`) waits for the GPU, so the loop reads a run of them at once."""

    values: torch.Tensor  # (2,): the loss and the gradient norm before clipping, fp32
    lr: float

    @staticmethod
    def read(pending: list[PendingStep]) -> list[StepResult]:
        """The results of ``pending`` steps, in one device-to-host copy (one synchronisation
        however many steps)."""
        if not pending:
            return []
        values = torch.stack([step.values for step in pending]).tolist()  # (n, 2)
        return [
            StepResult(loss, norm, step.lr, {})
            for step, (loss, norm) in zip(pending, values, strict=True)
        ]


def _gradients(
    run_model: RunModel,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    settings: FinetuneSettings,
    device: torch.device,
    group_norms: bool,
    task: Task,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The batch's accumulated gradients, clipped: (loss and norm before clipping as one
    (2,) fp32 tensor on the device, per-group norms when asked). Synchronises only for the
    group norms."""
    training = settings.training
    parameters = [parameter for _, parameter in run_model.trainable]
    optimizer.zero_grad(set_to_none=True)
    batch = task.on_device(run_model, batch, device)
    total = torch.zeros((), device=device)
    for start in range(0, training.batch_size, training.micro_batch_size):
        chunk = slice(start, start + training.micro_batch_size)
        micro = tuple(part[chunk] for part in batch)
        loss = task.loss(run_model, micro, training) * (
            training.micro_batch_size / training.batch_size
        )
        loss.backward()
        total += loss.detach()  # on the device: no synchronisation per micro-batch
    norms = group_grad_norms(run_model.trainable, run_model.parameters) if group_norms else {}
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, training.clip_grad_norm)
    return torch.stack([total, grad_norm.to(total.dtype)]), norms


def scheduled_lr(step_index: int, settings: FinetuneSettings) -> float:
    """The learning rate of update ``step_index`` (0-based) under the run's warm-up and
    cosine schedule."""
    training = settings.training
    return warmup_cosine_lr(step_index, settings.run.lr, training.warmup_steps, training.steps)


def _apply(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()


def training_step(
    run_model: RunModel,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    step_index: int,
    settings: FinetuneSettings,
    device: torch.device,
    group_norms: bool = False,
    task: Task = CLASSIFICATION,
) -> StepResult:
    """One optimizer update on one batch (for images: uint8 images (B, 3, S, S) and labels).

    Gradients are accumulated over micro-batches, each micro-batch's mean loss weighted by
    its share of the batch (so the gradient is that of the batch's mean loss), clipped to
    ``clip_grad_norm``, and applied at the scheduled learning rate. A non-finite loss or
    gradient skips the update. Reads the loss and norm back: one synchronisation.
    """
    values, norms = _gradients(run_model, optimizer, batch, settings, device, group_norms, task)
    lr = scheduled_lr(step_index, settings)
    # One device-to-host copy for both numbers (one synchronisation per step, not two).
    loss_value, norm_value = values.tolist()
    result = StepResult(loss_value, norm_value, lr, norms)
    if result.finite:
        _apply(optimizer, lr)
    return result


def deferred_training_step(
    run_model: RunModel,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    step_index: int,
    settings: FinetuneSettings,
    device: torch.device,
    task: Task = CLASSIFICATION,
) -> PendingStep:
    """:func:`training_step`'s update without reading anything back (no synchronisation):
    the GPU queues the next steps while this one computes.

    The update is applied even when the loss or gradient is non-finite, where
    :func:`training_step` skips it: the caller must read the step back
    (:meth:`PendingStep.read`) before it uses the weights for anything it keeps (an
    evaluation, a checkpoint), and stop the run at the first non-finite step, as
    training_step's caller does; the weights after it are then never used.
    """
    values, _ = _gradients(run_model, optimizer, batch, settings, device, False, task)
    lr = scheduled_lr(step_index, settings)
    _apply(optimizer, lr)
    return PendingStep(values, lr)
