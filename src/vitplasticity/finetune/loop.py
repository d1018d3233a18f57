"""The steps of a run, whatever its task (:mod:`vitplasticity.finetune.tasks`): train, log,
validate (model selection on the task's metric), and checkpoint every ``checkpoint_every``
steps and on SIGTERM.

Host synchronisation: a step that logs, validates, checkpoints or ends the run reads its loss
and gradient norm back (:func:`training_step`); every other step leaves them on the device
(:func:`deferred_training_step`), so the GPU is never idle waiting for the host between
steps. The deferred values are read back together, one copy for all, before the next such
step (at most ``MAX_DEFERRED_STEPS`` apart) and checked there: the run stops at the first
non-finite one with the same row, step and outcome as a per-step check, because nothing
computed from the weights after that step is kept (docs/benchmarks.md).
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

from vitplasticity.finetune.resumable import ResumableState
from vitplasticity.finetune.setup import RunContext
from vitplasticity.finetune.step import (
    PendingStep,
    StepResult,
    deferred_training_step,
    training_step,
)

log = logging.getLogger(__name__)

MAX_DEFERRED_STEPS = 100
"""Steps whose values stay on the device before they are read back, whatever log_every: a
diverged run stops at most this many steps after it diverged (its result unchanged)."""


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written and the run stopped (rerun to resume)."""


@contextmanager
def sigterm_flag() -> Iterator[threading.Event]:
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
    """The metrics row of a validation point: the task's metrics on the run's evaluation
    data (for images: loss and accuracy on val, accuracy on test)."""
    row = context.task.evaluation_row(
        context.run_model, context.evaluation, context.device, context.settings.training
    )
    log.info("step %d %s", step, " ".join(f"{name} {value:.4g}" for name, value in row.items()))
    return {"step": step, "kind": "val", "lr": lr, **row}


@dataclass(frozen=True)
class TrainingOutcome:
    """How the steps of one process ended."""

    diverged: bool
    final_step: int  # the last step taken (the start step when none was)
    train_seconds: float  # time spent in this process's steps (data included)


def _step_batch(context: RunContext, item: Any) -> tuple[torch.Tensor, ...]:
    """The batch of one step from its item (for images, cropped on the device when the run
    augments there)."""
    return context.inputs.batch(item)


def _synchronous(
    training: Any, step: int, end: int, deferred: int, sigterm: threading.Event
) -> bool:
    """Whether ``step`` reads its values back: it logs, validates, checkpoints, ends the run
    or its rung (``end``), follows SIGTERM, or ``MAX_DEFERRED_STEPS`` steps are waiting."""
    return (
        step == 1
        or step % training.log_every == 0
        or step % training.val_every == 0
        or step % training.checkpoint_every == 0
        or step == training.steps
        or step == end
        or deferred + 1 >= MAX_DEFERRED_STEPS
        or sigterm.is_set()
    )


def _record_step(context: RunContext, state: ResumableState, step: int, result: StepResult) -> None:
    state.record(train_row(step, result), context.task)
    log.info("step %d loss %.4f grad %.4f lr %.3g", step, result.loss, result.grad_norm, result.lr)
    if not result.finite:
        log.warning("step %d: non-finite loss or gradient; the run diverged", step)


def _first_nonfinite(pending: list[tuple[int, PendingStep]]) -> tuple[int, StepResult] | None:
    """The first deferred step whose loss or gradient is non-finite (one read-back for
    all), or None."""
    results = PendingStep.read([step for _, step in pending])
    for (step, _), result in zip(pending, results, strict=True):
        if not result.finite:
            return step, result
    return None


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
    pending: list[tuple[int, PendingStep]] = []
    end = training.steps if stop_at is None else min(stop_at, training.steps)
    with sigterm_flag() as sigterm:
        stream = context.inputs.items(state.start_step, end)
        for step_index, item in enumerate(stream, start=state.start_step):
            tick = time.perf_counter()
            batch = _step_batch(context, item)
            step = step_index + 1
            arguments = (context.run_model, context.optimizer, batch, step_index, settings, device)
            if not _synchronous(training, step, end, len(pending), sigterm):
                pending.append((step, deferred_training_step(*arguments, context.task)))
                train_seconds += time.perf_counter() - tick
                continue
            failed = _first_nonfinite(pending)
            pending.clear()
            if failed is not None:  # an earlier step diverged: the run stops there
                train_seconds += time.perf_counter() - tick
                step = failed[0]
                _record_step(context, state, *failed)
                diverged = True
                break
            logged = step == 1 or step % training.log_every == 0 or step == training.steps
            result = training_step(*arguments, logged, context.task)
            train_seconds += time.perf_counter() - tick
            diverged = not result.finite
            if logged or diverged:
                _record_step(context, state, step, result)
            if diverged:
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
        state.record(evaluation_point(context, step, lr), context.task)
    if step < training.steps and sigterm.is_set():
        state.save(context, step)
        raise Preempted(f"SIGTERM after step {step}: checkpoint {context.checkpoint_path} written")
    if step < training.steps and step % training.checkpoint_every == 0:
        state.save(context, step)
