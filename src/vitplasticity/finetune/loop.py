"""The steps of a run: train, log, validate (model selection on validation accuracy), and
checkpoint every ``checkpoint_every`` steps and on SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from vitplasticity.data import loader
from vitplasticity.finetune.resumable import ResumableState
from vitplasticity.finetune.setup import RunContext
from vitplasticity.finetune.step import StepResult, evaluate, training_step

log = logging.getLogger(__name__)


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written and the run stopped (rerun to resume)."""


@contextmanager
def _sigterm_flag() -> Iterator[threading.Event]:
    """An event set by SIGTERM while the block runs (main thread only; else never set)."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGTERM, previous)


def train_row(step: int, result: StepResult) -> dict[str, Any]:
    """The metrics row of a logged training step."""
    return {
        "step": step,
        "kind": "train",
        "lr": result.lr,
        "train_loss": result.loss,
        "grad_norm": result.grad_norm,
        **{f"grad_norm_{group}": value for group, value in result.group_norms.items()},
    }


def evaluation_point(context: RunContext, step: int, lr: float) -> dict[str, Any]:
    """The metrics row of a validation point: loss and accuracy on val, accuracy on test."""
    model, pre = context.run_model.model, context.run_model.preprocessing
    architecture = context.run_model.architecture
    val_loss, val_accuracy = evaluate(
        model, architecture, context.val_set, pre, context.device, context.settings.training
    )
    _, test_accuracy = evaluate(
        model, architecture, context.test_set, pre, context.device, context.settings.training
    )
    log.info("step %d val %.4f test %.4f", step, val_accuracy, test_accuracy)
    return {
        "step": step,
        "kind": "val",
        "lr": lr,
        "val_loss": val_loss,
        "val_accuracy": val_accuracy,
        "test_accuracy": test_accuracy,
    }


@dataclass(frozen=True)
class TrainingOutcome:
    """How the steps of one process ended."""

    diverged: bool
    final_step: int  # the last step taken (the start step when none was)
    train_seconds: float  # time spent in this process's steps (data included)


def _step_images(context: RunContext, item: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint8 images and labels of one batch from the loader (cropped on the device when
    the run augments there)."""
    if not context.on_device:
        return item
    canvas, sizes, boxes, flips, labels = item
    canvas = canvas.to(context.device, non_blocking=True)
    input_size = context.run_model.preprocessing.input_size
    return loader.augment_on_device(canvas, sizes, boxes, flips, input_size), labels


def train_steps(
    context: RunContext, state: ResumableState, stop_at: int | None = None
) -> TrainingOutcome:
    """The steps from ``state.start_step`` to the last: train, log, validate, checkpoint.

    Stops early when the loss or gradient becomes non-finite (the run diverged), or after
    step ``stop_at`` (a rung of successive halving): the schedule, logging and validation
    stay those of the full ``training.steps``, so a later process continues the run exactly.

    Raises:
        Preempted: when SIGTERM arrived; the checkpoint is written first.
    """
    settings, device = context.settings, context.device
    training = settings.training
    diverged, step, train_seconds = False, state.start_step, 0.0
    end = training.steps if stop_at is None else min(stop_at, training.steps)
    with _sigterm_flag() as sigterm:
        stream = loader.train_batches(
            context.batches,
            state.start_step,
            end,
            training.num_workers,
            device.type == "cuda",
        )
        for step_index, item in enumerate(stream, start=state.start_step):
            tick = time.perf_counter()
            images, labels = _step_images(context, item)
            step = step_index + 1
            logged = step == 1 or step % training.log_every == 0 or step == training.steps
            result = training_step(
                context.run_model,
                context.optimizer,
                images,
                labels,
                step_index,
                settings,
                device,
                logged,
            )
            train_seconds += time.perf_counter() - tick
            diverged = not result.finite
            if logged or diverged:
                state.record(train_row(step, result))
                log.info(
                    "step %d loss %.4f grad %.4f lr %.3g",
                    step,
                    result.loss,
                    result.grad_norm,
                    result.lr,
                )
            if diverged:
                log.warning("step %d: non-finite loss or gradient; the run diverged", step)
                break
            _after_step(context, state, step, result.lr, sigterm)
    return TrainingOutcome(diverged, step, train_seconds)


def _after_step(
    context: RunContext, state: ResumableState, step: int, lr: float, sigterm: threading.Event
) -> None:
    """Validate when due; checkpoint when due, or when SIGTERM arrived before the last step.

    Raises:
        Preempted: when SIGTERM arrived; the checkpoint is written first.
    """
    training = context.settings.training
    if step % training.val_every == 0 or step == training.steps:
        state.record(evaluation_point(context, step, lr))
    if step < training.steps and sigterm.is_set():
        state.save(context, step)
        raise Preempted(f"SIGTERM after step {step}: checkpoint {context.checkpoint_path} written")
    if step < training.steps and step % training.checkpoint_every == 0:
        state.save(context, step)
