"""The gradient criteria of recommend (:mod:`.criteria`): the relative gradient norm (Auto-RGN,
Lee et al. 2023) and the gradient signal-to-noise ratio of every named tensor
(:func:`gradient_statistics`), measured after a short warm-up of a new classifier head
(:func:`head_warmup`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.models.architectures import (
    Architecture,
    ParameterMap,
    architecture_for,
    parameter_map,
)

Batch = tuple[torch.Tensor, torch.Tensor]
"""Preprocessed images (B, 3, H, W) on the model's device and dtype, and int64 labels (B,)."""

TENSOR_SCHEMA: dict[str, pl.DataType] = {
    "parameter": pl.String(),
    "component": pl.String(),
    "block": pl.Int64(),
    "numel": pl.Int64(),
    "weight_norm": pl.Float64(),
    "relative_gradient_norm": pl.Float64(),
    "gradient_snr": pl.Float64(),
    "n_batches": pl.Int64(),
}
"""Columns of :func:`gradient_statistics`: one row per parameter tensor."""


def _check_eval(model: nn.Module) -> None:
    if model.training:
        raise ValueError(
            "model is in training mode (dropout would make gradients random): call model.eval()"
        )


def head_warmup(
    model: nn.Module,
    batches: Iterable[Any],
    lr: float,
    momentum: float = 0.9,
    *,
    head: Sequence[nn.Parameter] | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> list[float]:
    """Train the classifier head alone for one SGD step per batch; return the losses.

    A fresh random head makes every backbone gradient mostly noise from the head, so the
    gradient criteria are measured after a short warm-up, as surgical fine-tuning does. The
    backbone (final norm included) is frozen: its features are computed without gradient
    and only the head learns (SGD with ``momentum``, no weight decay). Seed the caller's RNG
    before building the head for a reproducible warm-up.

    Args:
        head: the head's parameters (None: the architecture's classifier's,
            :meth:`~vitplasticity.models.architectures.Architecture.classifier`); a text
            classifier passes what was drawn for it (its classifier, a pooler it lacked).
        loss: the loss of a batch (None: :func:`classification_loss` of (images, labels)).
    """
    _check_eval(model)
    if not lr > 0:
        raise ValueError(f"warm-up learning rate must be > 0, got {lr}")
    architecture = architecture_for(model)
    if head is None:
        classifier = architecture.classifier(model)
        if not isinstance(classifier, nn.Module) or not list(classifier.parameters()):
            raise ValueError(f"{type(model).__name__} has no classifier head to warm up")
        head = list(classifier.parameters())
    if loss is None:
        loss = functools.partial(classification_loss, model, architecture=architecture)
    trained = {id(p) for p in head}
    flags = {p: p.requires_grad for p in model.parameters()}
    optimizer = torch.optim.SGD(head, lr=lr, momentum=momentum, weight_decay=0.0)
    losses = []
    try:
        # Only the head requires a gradient: the backbone and pooling run as without one, and
        # the logits are the model's own (its pooling; a timm model: head(forward_head(...))).
        for parameter in flags:
            parameter.requires_grad_(id(parameter) in trained)
        for batch in batches:
            value = loss(batch)
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
            losses.append(value.item())
    finally:
        for parameter, flag in flags.items():
            parameter.requires_grad_(flag)
    optimizer.zero_grad(set_to_none=True)
    return losses


def classification_loss(
    model: nn.Module, batch: Batch, architecture: Architecture | None = None
) -> torch.Tensor:
    """The mean cross-entropy of ``model``'s logits (its architecture's
    :meth:`~vitplasticity.models.architectures.Architecture.logits`) on a labelled image batch: the
    loss whose gradients :func:`gradient_statistics` takes unless it is given another."""
    images, labels = batch
    architecture = architecture_for(model) if architecture is None else architecture
    return F.cross_entropy(architecture.logits(model, images), labels)


def gradient_statistics(
    model: nn.Module,
    batches: Iterable[Any],
    names: Sequence[str],
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> pl.DataFrame:
    """Relative gradient norm and gradient signal-to-noise ratio of each named tensor.

    For each batch b, g_b is the gradient of the batch's loss (by default its mean
    cross-entropy, :func:`classification_loss`) with respect to a tensor w (the model in eval
    mode). Over the B batches:

    - relative gradient norm (Auto-RGN): (1/B) sum_b ||g_b||_F / ||w||_F; NaN for a tensor
      whose norm is 0 (a zero-initialised bias), which the pooled value then leaves out. w is
      what the layer applies: a Gemma RMSNorm's scale 1 + weight, as its family declares
      (:meth:`~vitplasticity.models.architectures.base.Architecture.weight_offsets`), not the
      stored offset (0 at init, which would leave its ratio undefined).
    - gradient SNR: ||gbar||_F / sqrt((1/B) sum_b ||g_b - gbar||_F^2), gbar = (1/B) sum_b g_b
      (the noise term is the population variance, ddof 0, summed over the tensor's entries).

    Args:
        model: a timm model of a known architecture, in eval mode, with its classifier head.
        batches: (images, labels) on the model's device, or what ``loss`` takes (2 at least).
        names: parameter names to measure (any of the model's).
        loss: the scalar loss of one batch (None: :func:`classification_loss`); the text
            recommend passes a causal LM's next-token loss, the LM holding ``model``.

    Returns:
        One row per name, columns :data:`TENSOR_SCHEMA`: component, the configuration that
        trains the tensor (``Owner.gradient_group``: a component, ``emb``, ``head``, ``lora``,
        or ``other`` for ``full`` alone), and block, the block that holds it (null outside the
        blocks), both from the model's :class:`~vitplasticity.models.architectures.ParameterMap`.

    Raises:
        ValueError: for a model in training mode, an unknown name, or fewer than 2 batches.
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    _check_eval(model)
    owners = parameter_map(model)
    parameters = dict(model.named_parameters())
    unknown = [name for name in names if name not in parameters]
    if unknown:
        raise ValueError(f"unknown parameters {unknown[:3]}")
    if loss is None:
        loss = functools.partial(classification_loss, model, architecture=owners.architecture)
    tracked = [parameters[name] for name in names]
    offsets = owners.architecture.weight_offsets(model)
    with _requiring_grad_only(parameters, set(names)):
        columns = _gradient_columns(batches, tracked, [offsets.get(p, 0.0) for p in tracked], loss)
    return _tensor_table(names, owners, parameters, columns)


def _tensor_table(
    names: Sequence[str],
    owners: ParameterMap,
    parameters: dict[str, nn.Parameter],
    columns: dict[str, Any],
) -> pl.DataFrame:
    """The :data:`TENSOR_SCHEMA` rows of the tensors ``names``: who owns each and its size,
    then the gradient ``columns``."""
    return pl.DataFrame(
        {
            "parameter": list(names),
            "component": [owners.owners[name].gradient_group for name in names],
            "block": [owners.owners[name].block for name in names],
            "numel": [parameters[name].numel() for name in names],
            **columns,
        },
        schema=TENSOR_SCHEMA,
    )


@contextmanager
def _requiring_grad_only(parameters: dict[str, nn.Parameter], wanted: set[str]) -> Iterator[None]:
    """Inside the block only the ``wanted`` of ``parameters`` (by name) require a gradient;
    after it each requires one as it did before."""
    flags = {name: p.requires_grad for name, p in parameters.items()}
    for name, parameter in parameters.items():
        parameter.requires_grad_(name in wanted)
    try:
        yield
    finally:
        for name, parameter in parameters.items():
            parameter.requires_grad_(flags[name])


def _gradient_columns(
    batches: Iterable[Any],
    tracked: Sequence[torch.Tensor],
    offsets: Sequence[float],
    loss: Callable[[Any], torch.Tensor],
) -> dict[str, Any]:
    """The weight norm, relative gradient norm, gradient SNR and batch count of each tracked
    tensor over the batches (in float64, by Welford's update: no gradient is kept), as
    :data:`TENSOR_SCHEMA` columns. The weight norm is that of what the layer applies,
    ``offset + w`` (``offsets``: Gemma's RMSNorm gains 1, else 0); the gradient is the same
    with respect to either.

    Raises:
        ValueError: for fewer than 2 batches.
    """
    weight_norms = torch.stack(
        [
            torch.linalg.vector_norm(p.detach().to(torch.float64) + offset)
            for p, offset in zip(tracked, offsets, strict=True)
        ]
    )  # (T,)
    ratio_sums = torch.zeros_like(weight_norms)
    means = [torch.zeros_like(p, dtype=torch.float64) for p in tracked]
    squares = torch.zeros_like(weight_norms)  # Welford's M2 per tensor
    count = 0
    for batch in batches:
        count += 1
        gradients = torch.autograd.grad(loss(batch), tracked)
        for index, gradient in enumerate(gradients):
            g = gradient.detach().to(torch.float64)
            ratio_sums[index] += torch.linalg.vector_norm(g) / weight_norms[index]
            delta = g - means[index]
            means[index] += delta / count
            squares[index] += (delta * (g - means[index])).sum()
    if count < 2:
        raise ValueError(f"gradient criteria need at least 2 batches, got {count}")
    mean_norms = torch.stack([torch.linalg.vector_norm(m) for m in means])
    rgn = (ratio_sums / count).cpu().numpy()
    rgn[(weight_norms == 0).cpu().numpy()] = np.nan  # ||g|| / 0: undefined, not infinite
    return {
        "weight_norm": weight_norms.cpu().numpy(),
        "relative_gradient_norm": rgn,
        "gradient_snr": (mean_norms / (squares / count).sqrt()).cpu().numpy(),
        "n_batches": [count] * len(tracked),
    }
