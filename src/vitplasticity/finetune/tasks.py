"""What a run learns (:class:`Task`): the loss of a micro-batch, the validation row, the
metric that selects the run's result and the summary's result fields. The training loop
(:mod:`vitplasticity.finetune.loop`) is the same for every task.

- :class:`Classification` (images) and :class:`TextClassification` (labelled text):
  cross-entropy of the logits; validation loss and accuracy, test accuracy; the result is the
  test accuracy at the highest validation accuracy (the earliest on ties).
- :class:`CausalLM` (a decoder): the next-token loss; :class:`MaskedLM` (an encoder): the
  masked-token loss on fixed validation masks. Both are means over the predicted tokens;
  validation loss and perplexity (``exp`` of the mean token loss); the result is the lowest
  validation loss (the earliest on ties). Unlabelled text has no test split.

A batch is a tuple of tensors whose first dimension is the batch (images and labels; token
ids, and an encoder's masked positions); the loop cuts it into micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import polars as pl
import torch
import torch.nn.functional as functional

from vitplasticity.data.transforms import normalize
from vitplasticity.finetune.model import RunModel
from vitplasticity.finetune.precision import autocast
from vitplasticity.finetune.settings import TrainingSettings

Batch = tuple[torch.Tensor, ...]
"""The tensors of a batch, each (B, ...): cut into micro-batches along the first dimension."""

EVAL_BATCH_FACTOR = 4
"""Eval batches hold this many micro-batches: without stored activations they fit."""


class Task:
    """What differs between what runs learn; one subclass per task, no state but settings."""

    metric_columns: ClassVar[dict[str, pl.DataType]]  # the validation columns of metrics.parquet
    selection: ClassVar[str]  # the validation metric that selects the run's result
    higher_is_better: ClassVar[bool]
    best_fields: ClassVar[tuple[str, ...]]  # the validation row's fields the best point keeps
    samples_field: ClassVar[str]  # the summary's throughput field (samples per second)

    def on_device(self, run_model: RunModel, batch: Batch, device: torch.device) -> Batch:
        """``batch`` moved to ``device``, ready for :meth:`loss` (copies not awaited)."""
        return tuple(part.to(device, non_blocking=True) for part in batch)

    def loss(self, run_model: RunModel, batch: Batch, training: TrainingSettings) -> torch.Tensor:
        """The mean loss of the micro-batch ``batch`` (on the device, fp32)."""
        raise NotImplementedError

    def evaluation_row(
        self, run_model: RunModel, data: Any, device: torch.device, training: TrainingSettings
    ) -> dict[str, Any]:
        """The metrics of a validation point on the run's evaluation ``data``."""
        raise NotImplementedError

    def better(self, row: dict[str, Any], best: dict[str, Any] | None) -> bool:
        """Whether validation ``row`` beats every earlier one (so ties keep the earliest)."""
        if best is None:
            return True
        if self.higher_is_better:
            return row[self.selection] > best[self.selection]
        return row[self.selection] < best[self.selection]

    def result_fields(self, best: dict[str, Any] | None) -> dict[str, Any]:
        """The summary's result fields from the best validation point."""
        raise NotImplementedError


class Classification(Task):
    """Image classification: cross-entropy of the logits; select on validation accuracy.
    Batches: (images, labels)."""

    metric_columns: ClassVar[dict[str, pl.DataType]] = {
        "val_loss": pl.Float64(),
        "val_accuracy": pl.Float64(),
        "test_accuracy": pl.Float64(),
    }
    selection = "val_accuracy"
    higher_is_better = True
    best_fields = ("step", "val_accuracy", "val_loss", "test_accuracy")
    samples_field = "images_per_second"

    def on_device(self, run_model: RunModel, batch: Batch, device: torch.device) -> Batch:
        images, labels = batch
        images = normalize(images.to(device, non_blocking=True), run_model.preprocessing)
        return images, labels.to(device, non_blocking=True)  # (B, 3, S, S), (B,)

    def logits(self, run_model: RunModel, batch: Batch) -> torch.Tensor:
        """The logits (m, C) of the micro-batch ``batch`` on the device (its labels last)."""
        return run_model.architecture.logits(run_model.model, batch[0])

    def loss(self, run_model: RunModel, batch: Batch, training: TrainingSettings) -> torch.Tensor:
        with autocast(batch[0].device, training.precision):
            logits = self.logits(run_model, batch).float()  # (m, C)
        return functional.cross_entropy(logits, batch[-1])

    def evaluation_row(
        self, run_model: RunModel, data: Any, device: torch.device, training: TrainingSettings
    ) -> dict[str, Any]:
        """Loss and accuracy on ``data.val_set``, accuracy on ``data.test_set``."""
        val_loss, val_accuracy = self.evaluate(run_model, data.val_set, device, training)
        _, test_accuracy = self.evaluate(run_model, data.test_set, device, training)
        return {"val_loss": val_loss, "val_accuracy": val_accuracy, "test_accuracy": test_accuracy}

    def evaluate(
        self, run_model: RunModel, data: Any, device: torch.device, training: TrainingSettings
    ) -> tuple[float, float]:
        """(mean cross-entropy, top-1 accuracy) of the run's model on the eval set ``data``
        (``len`` and ``batches(size)``, each batch's labels last)."""
        model = run_model.model
        model.eval()
        loss_sum, correct = 0.0, 0
        with torch.inference_mode(), autocast(device, training.precision):
            for batch in data.batches(EVAL_BATCH_FACTOR * training.micro_batch_size):
                batch = self.on_device(run_model, batch, device)
                logits, labels = self.logits(run_model, batch).float(), batch[-1]  # (B, C), (B,)
                loss_sum += float(functional.cross_entropy(logits, labels, reduction="sum"))
                correct += int((logits.argmax(dim=1) == labels).sum())
        model.train()
        return loss_sum / len(data), correct / len(data)

    def result_fields(self, best: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "best_step": best["step"] if best else None,
            "best_val_accuracy": best["val_accuracy"] if best else None,
            "best_val_loss": best["val_loss"] if best else None,
            "test_accuracy": best["test_accuracy"] if best else None,
        }


class TextClassification(Classification):
    """Classification of labelled text by a text model's sequence classifier (which pools the
    sequence as its family does): as for images, select on validation accuracy. Batches:
    (token ids, attention mask, labels)."""

    samples_field = "sequences_per_second"

    def on_device(self, run_model: RunModel, batch: Batch, device: torch.device) -> Batch:
        return Task.on_device(self, run_model, batch, device)

    def logits(self, run_model: RunModel, batch: Batch) -> torch.Tensor:
        ids, attention = batch[0], batch[1]  # (m, L), (m, L)
        return run_model.model(input_ids=ids, attention_mask=attention).logits


CAUSAL = "causal"
"""The task of a decoder: predict token t + 1 from the tokens up to t."""

MASKED = "masked"
"""The task of an encoder: predict the masked tokens from the whole sequence."""


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``ids[:, t + 1]`` from ``logits[:, t]``.

    Args:
        logits: (B, L, V) the LM's output on ``ids``.
        ids: (B, L) the token ids.
    """
    predicted = logits[:, :-1].reshape(-1, logits.shape[-1]).float()  # (B (L - 1), V)
    return functional.cross_entropy(predicted, ids[:, 1:].reshape(-1))


def masked_inputs(ids: torch.Tensor, mask: torch.Tensor, mask_id: int) -> torch.Tensor:
    """``ids`` with every masked position replaced by ``mask_id`` (BERT's [MASK] token; the
    80/10/10 replacement of its pre-training is not used: finetuning here measures how well a
    configuration learns the text, and the masked tokens are the ones scored)."""
    return torch.where(mask, torch.full_like(ids, mask_id), ids)


def masked_lm_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the original ``ids`` at the ``mask`` positions.

    Args:
        logits: (B, L, V) the encoder's MLM output on the masked inputs.
        ids: (B, L) the original token ids.
        mask: (B, L) which positions were masked (at least one).
    """
    return functional.cross_entropy(logits[mask].float(), ids[mask])  # (masked, V) vs (masked,)


def perplexity(mean_loss: float) -> float:
    """``exp`` of a mean token cross-entropy (inf past float range)."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf


class _LanguageModelling(Task):
    """What the text tasks share: validation loss and perplexity, the lowest loss wins."""

    name: ClassVar[str]  # the summary's ``task`` field: causal or masked

    metric_columns: ClassVar[dict[str, pl.DataType]] = {
        "val_loss": pl.Float64(),
        "val_perplexity": pl.Float64(),
    }
    selection = "val_loss"
    higher_is_better = False
    best_fields = ("step", "val_loss", "val_perplexity")
    samples_field = "sequences_per_second"

    def evaluation_row(
        self, run_model: RunModel, data: Any, device: torch.device, training: TrainingSettings
    ) -> dict[str, Any]:
        """Mean token cross-entropy over the validation batches ``data`` (each sequence
        predicts as many tokens as the others, so the size-weighted mean of the batch means
        is exact) and its perplexity."""
        run_model.model.eval()
        total, count = 0.0, 0
        with torch.inference_mode():
            for batch in data.batches(EVAL_BATCH_FACTOR * training.micro_batch_size):
                batch = self.on_device(run_model, batch, device)
                total += float(self.loss(run_model, batch, training)) * len(batch[0])
                count += len(batch[0])
        run_model.model.train()
        loss = total / count
        return {"val_loss": loss, "val_perplexity": perplexity(loss)}

    def result_fields(self, best: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "task": self.name,
            "best_step": best["step"] if best else None,
            "best_val_loss": best["val_loss"] if best else None,
            "best_val_perplexity": best["val_perplexity"] if best else None,
        }


class CausalLM(_LanguageModelling):
    """A decoder: predict token t + 1 from the tokens up to t. Batches: (ids,)."""

    name = CAUSAL

    def loss(self, run_model: RunModel, batch: Batch, training: TrainingSettings) -> torch.Tensor:
        (ids,) = batch  # (m, L)
        with autocast(ids.device, training.precision):
            logits = run_model.model(input_ids=ids, use_cache=False).logits  # (m, L, V)
            return next_token_loss(logits, ids)


@dataclass(frozen=True)
class MaskedLM(_LanguageModelling):
    """An encoder: predict the masked tokens. Batches: (ids, masked positions)."""

    mask_id: int  # the id a masked position gets
    name = MASKED

    def loss(self, run_model: RunModel, batch: Batch, training: TrainingSettings) -> torch.Tensor:
        ids, mask = batch  # (m, L), (m, L) bool
        with autocast(ids.device, training.precision):
            logits = run_model.model(input_ids=masked_inputs(ids, mask, self.mask_id)).logits
            return masked_lm_loss(logits, ids, mask)


CLASSIFICATION = Classification()
"""The task of every image run."""
