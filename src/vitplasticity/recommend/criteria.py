"""The criteria that rank the components of a ViT for finetuning, one function each.

Every criterion is measured once per *item* of each component and pooled afterwards, so that
any configuration (a component, or a '+' combination such as ``mha+fc1``) is the mean over
the items of its parts:

- ``plasticity``: items are the (block, pair) ratios ||f(x) - f(y)|| / ||x - y|| that
  :func:`vitplasticity.plasticity.measure.measure` returns (embedding protocol by default, as the
  paper). Mean and 95% CI = mean +/- 1.96 std / sqrt(n) over the n pooled ratios.
- ``relative_gradient_norm`` (Auto-RGN, Lee et al. 2023, "Surgical Fine-Tuning Improves
  Adaptation to Distribution Shifts"): items are parameter tensors; per tensor,
  ||g_b|| / ||w|| averaged over the gradient batches b (after :func:`head_warmup`).
- ``gradient_snr``: items are parameter tensors; per tensor, ||mean_b g_b|| /
  sqrt(mean_b ||g_b - mean_b g_b||^2) (see :func:`gradient_statistics`).
- ``weight_spectral`` (data-free): items are blocks; the weight factor of the paper's
  Section 4 bound (see :func:`weight_statistics`).
- ``nfn`` (PLoP's normalised feature norm, Hayou et al., ICLR 2026): items are the linear maps
  of every block (a gated FC1 is one map, gate and up together); per map, the mean output norm
  on the task's real inputs over the same on Gaussian inputs of the same norms, from one
  forward pass of the first gradient batch (:mod:`.nfn`). The norms (LN1, LN2) hold no linear
  map: their NFN is n/a (NaN, ranked last and never recommended), and a configuration that
  joins a norm to linear components has the NFN of its linear maps. PLoP finetunes the
  *lowest* NFN first (:data:`.ranking.LOWER_FIRST`), the opposite end from the other criteria.

A configuration's trainable parameters exclude the classifier head and the final norm, which
every configuration trains (:func:`always_trained_parameters` counts those). Which parameter
belongs to which component comes from the model's architecture
(:class:`vitplasticity.models.architectures.ParameterMap`, by identity).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import (
    Architecture,
    ParameterMap,
    UndefinedStage,
    architecture_for,
    parameter_map,
    parse_configuration,
)
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.pairs import Images
from vitplasticity.plasticity.upper_bounds import (
    attention_head_norms,
    layernorm_refusal,
    spectral_norm,
    stacked_weight,
)
from vitplasticity.recommend.nfn import NFN_SEED, feature_norm_statistics
from vitplasticity.recommend.settings import CRITERIA as CRITERIA  # declared with the flags

Z95 = 1.96
"""Normal quantile of a two-sided 95% interval (the paper's CI)."""

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

WEIGHT_SCHEMA: dict[str, pl.DataType] = {
    "block": pl.Int64(),
    "component": pl.String(),
    "weight_spectral": pl.Float64(),
}
"""Columns of :func:`weight_statistics`: one row per (block, component)."""


@dataclass(frozen=True)
class Estimate:
    """A criterion's value for one configuration, with its 95% CI where it has one."""

    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    n_items: int = 0
    """How many items (ratios, tensors, blocks) the value pools."""


def configuration_components(configuration: str) -> tuple[str, ...]:
    """The components (ln1, mha, ln2, fc1, fc2) a configuration such as ``mha+fc1`` joins.

    Raises:
        ValueError: for an unknown name, a configuration that is not made of the five
            components (full, emb, head and lora have no per-block plasticity), or a
            component named twice.
    """
    parts = parse_configuration(configuration)
    others = [part for part in parts if part not in COMPONENTS]
    if others:
        raise ValueError(
            f"configuration {configuration!r}: {', '.join(others)} cannot be ranked; recommend "
            f"ranks the components {', '.join(COMPONENTS)} and their '+' combinations"
        )
    if len(set(parts)) != len(parts):
        raise ValueError(f"configuration {configuration!r} names a component twice")
    return parts


def component_parameter_names(model: nn.Module, component: str) -> list[str]:
    """The parameters ``component`` trains in every block, head and final norm excluded,
    in ``named_parameters`` order.

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    return parameter_map(model).component_names(component)


def _count(model: nn.Module, names: set[str]) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if name in names)


def trainable_parameters(model: nn.Module, configuration: str) -> int:
    """Parameters that ``configuration`` trains beyond the head and final norm.

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    parameters = parameter_map(model)
    beyond_head = parameters.trained_names(configuration) - parameters.trained_names("head")
    return _count(model, beyond_head)


def always_trained_parameters(model: nn.Module, parameters: ParameterMap | None = None) -> int:
    """Parameters of the classifier head and final norm, trained in every configuration
    (``parameters``: the model's map, when already built).

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    parameters = parameter_map(model) if parameters is None else parameters
    return _count(model, parameters.trained_names("head"))


# ---------------------------------------------------------------------------------------------
# Plasticity


def plasticity_estimate(pairs: pl.DataFrame, components: Sequence[str]) -> Estimate:
    """Plasticity of the configuration joining ``components``, pooled over its ratios.

    Args:
        pairs: rows of :func:`vitplasticity.plasticity.measure.measure` (one protocol).
        components: the configuration's components.

    Returns:
        The mean of every finite (block, pair) ratio of the components (identical inputs give
        NaN ratios, left out), and mean +/- 1.96 std / sqrt(n) with std over the same n
        ratios (ddof 1). The ratios of one pair in different blocks are not independent, so
        the interval is the paper's nominal one, narrower than an honest one over pairs.
    """
    ratios = (
        pairs.filter(pl.col("component").is_in(list(components)))["ratio"]
        .to_numpy()
        .astype(np.float64)
    )
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return Estimate(math.nan)
    mean = float(ratios.mean())
    if len(ratios) < 2:
        return Estimate(mean, n_items=len(ratios))
    half = Z95 * float(ratios.std(ddof=1)) / math.sqrt(len(ratios))
    return Estimate(mean, mean - half, mean + half, len(ratios))


# ---------------------------------------------------------------------------------------------
# Gradient criteria


def _check_eval(model: nn.Module) -> None:
    if model.training:
        raise ValueError(
            "model is in training mode (dropout would make gradients random): call model.eval()"
        )


def head_warmup(
    model: nn.Module, batches: Iterable[Batch], lr: float, momentum: float = 0.9
) -> list[float]:
    """Train the classifier head alone for one SGD step per batch; return the losses.

    A fresh random head makes every backbone gradient mostly noise from the head, so the
    gradient criteria are measured after a short warm-up, as surgical fine-tuning does. The
    backbone (final norm included) is frozen: its features are computed without gradient
    and only the head learns (SGD with ``momentum``, no weight decay). Seed the caller's RNG
    before building the head for a reproducible warm-up.
    """
    _check_eval(model)
    if not lr > 0:
        raise ValueError(f"warm-up learning rate must be > 0, got {lr}")
    architecture = architecture_for(model)
    head = architecture.classifier(model)
    if not isinstance(head, nn.Module) or not list(head.parameters()):
        raise ValueError(f"{type(model).__name__} has no classifier head to warm up")
    trained = {id(p) for p in head.parameters()}
    flags = {p: p.requires_grad for p in model.parameters()}
    optimizer = torch.optim.SGD(head.parameters(), lr=lr, momentum=momentum, weight_decay=0.0)
    losses = []
    try:
        # Only the head requires a gradient: the backbone and pooling run as without one, and
        # the logits are the model's own (its pooling; a timm model: head(forward_head(...))).
        for parameter in flags:
            parameter.requires_grad_(id(parameter) in trained)
        for images, labels in batches:
            loss = F.cross_entropy(architecture.logits(model, images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
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
      whose norm is 0 (a zero-initialised bias), which the pooled value then leaves out.
    - gradient SNR: ||gbar||_F / sqrt((1/B) sum_b ||g_b - gbar||_F^2), gbar = (1/B) sum_b g_b
      (the noise term is the population variance, ddof 0, summed over the tensor's entries).
      Accumulated with Welford's update in float64, so no per-batch gradient is kept.

    Args:
        model: a timm model of a known architecture, in eval mode, with its classifier head.
        batches: (images, labels) on the model's device, or whatever ``loss`` takes; at least
            two for the SNR.
        names: parameter names to measure (any of the model's).
        loss: the scalar loss of one batch (None: :func:`classification_loss` of ``model``);
            the text recommend passes a causal LM's next-token loss, the LM holding ``model``.

    Returns:
        One row per name, columns :data:`TENSOR_SCHEMA`: component, the configuration that
        trains the tensor (:attr:`vitplasticity.models.architectures.Owner.gradient_group`: a
        component, ``emb``, ``head``, ``lora``, or ``other`` for ``full`` alone), and block,
        the block that holds it (null outside the blocks), both from the model's
        :class:`~vitplasticity.models.architectures.ParameterMap`.

    Raises:
        ValueError: for a model in training mode, an unknown name, or fewer than 2 batches.
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    _check_eval(model)
    parameter_owners = parameter_map(model)
    owners, architecture = parameter_owners.owners, parameter_owners.architecture
    parameters = dict(model.named_parameters())
    unknown = [name for name in names if name not in parameters]
    if unknown:
        raise ValueError(f"unknown parameters {unknown[:3]}")
    tracked = [parameters[name] for name in names]
    flags = {name: p.requires_grad for name, p in parameters.items()}
    wanted = set(names)
    for name, parameter in parameters.items():
        parameter.requires_grad_(name in wanted)
    try:
        weight_norms = torch.stack(
            [torch.linalg.vector_norm(p.detach().to(torch.float64)) for p in tracked]
        )  # (T,)
        ratio_sums = torch.zeros_like(weight_norms)
        means = [torch.zeros_like(p, dtype=torch.float64) for p in tracked]
        squares = torch.zeros_like(weight_norms)  # Welford's M2 per tensor
        count = 0
        for batch in batches:
            count += 1
            value = classification_loss(model, batch, architecture) if loss is None else loss(batch)
            gradients = torch.autograd.grad(value, tracked)
            for index, gradient in enumerate(gradients):
                g = gradient.detach().to(torch.float64)
                ratio_sums[index] += torch.linalg.vector_norm(g) / weight_norms[index]
                delta = g - means[index]
                means[index] += delta / count
                squares[index] += (delta * (g - means[index])).sum()
    finally:
        for name, parameter in parameters.items():
            parameter.requires_grad_(flags[name])
    if count < 2:
        raise ValueError(f"gradient criteria need at least 2 batches, got {count}")
    mean_norms = torch.stack([torch.linalg.vector_norm(m) for m in means])
    rgn = (ratio_sums / count).cpu().numpy()
    rgn[(weight_norms == 0).cpu().numpy()] = np.nan  # ||g|| / 0: undefined, not infinite
    snr = (mean_norms / (squares / count).sqrt()).cpu().numpy()
    return pl.DataFrame(
        {
            "parameter": list(names),
            "component": [owners[name].gradient_group for name in names],
            "block": [owners[name].block for name in names],
            "numel": [p.numel() for p in tracked],
            "weight_norm": weight_norms.cpu().numpy(),
            "relative_gradient_norm": rgn,
            "gradient_snr": snr,
            "n_batches": [count] * len(names),
        },
        schema=TENSOR_SCHEMA,
    )


def tensor_estimate(tensors: pl.DataFrame, components: Sequence[str], criterion: str) -> Estimate:
    """A gradient criterion of a configuration: the unweighted mean over its tensors.

    Every tensor (weight, bias, LayerNorm gamma and beta, of every block) counts once,
    whatever its size; tensors whose value is not finite (zero weight norm) are left out.
    """
    values = (
        tensors.filter(pl.col("component").is_in(list(components)))[criterion]
        .to_numpy()
        .astype(np.float64)
    )
    values = values[np.isfinite(values)]
    return Estimate(float(values.mean()) if len(values) else math.nan, n_items=len(values))


# ---------------------------------------------------------------------------------------------
# The data-free weight statistic


def weight_statistics(model: nn.Module) -> pl.DataFrame:
    """The weight factor of the paper's plasticity bound, per (block, component), in float64.

    The components' modules come from the model's architecture
    (:func:`vitplasticity.models.architectures.architecture_for`):

    - ln1, ln2: ||gamma||_inf (the LayerNorm bound ||gamma||_inf / sigma without the data's
      sigma);
    - fc1, fc2: ||W||_2, the largest singular value (the linear bound itself); a gated MLP's
      FC1 is the map to its gate and up projections together, W = [W_gate; W_up] (the
      modules' (out, in) weights stacked along rows), as plasticity measures it;
    - mha: sum_h ||O^h||_2 ||V^h||_2 (the weight factor of both MHA bounds, without their
      data terms n, r and ||A^h||: the Lipschitz constant of the heads' value-output path
      with the attention pattern held fixed, up to ||P||_2 <= sqrt(n)), from the
      architecture's per-head weights (``attention_weights``).

    Rotary positions (DINOv3, EVA-02, the rope ViTs) change only the attention pattern, so the
    MHA statistic is still that value-output factor there, although the paper's MHA bound is
    not defined (:func:`vitplasticity.plasticity.upper_bounds.undefined_bounds`). A statistic that is not
    defined for the model (a norm that is not a LayerNorm; attention whose value-output path
    the architecture cannot give as per-head V and O: normalised queries and keys, a
    normalised or gated output) is refused for that component: its rows hold NaN and one
    warning names the component and why. NaN, not absent rows: :func:`weight_estimate` is
    then NaN for every configuration that contains the component (reported "n/a", ranked
    last, never recommended nor joined into a union), where absent rows would make
    ``mha+fc1`` the mean of fc1 alone.

    Computed with :mod:`vitplasticity.plasticity.upper_bounds` (``spectral_norm``, ``stacked_weight``,
    ``attention_head_norms``).

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for (a
            ValueError).
        UndefinedStage: for a family that refuses the recommend stage (a ValueError).
    """
    architecture = architecture_for(model)
    refusal = architecture.refusal("recommend", model)
    if refusal is not None:
        raise UndefinedStage(
            f"the weight statistic of {type(model).__name__} ({architecture.title}) is not "
            f"defined: {refusal}"
        )
    undefined: dict[str, str] = {}
    rows = []
    for index, block in enumerate(architecture.blocks(model)):
        for component, modules in architecture.components(block).items():
            value = math.nan
            if component in ("ln1", "ln2"):
                (norm,) = modules
                reason = layernorm_refusal(norm)
                if reason is None:  # gamma = 1 in a LayerNorm without affine parameters
                    gamma = norm.weight
                    value = 1.0 if gamma is None else gamma.detach().double().abs().max().item()
            elif component in ("fc1", "fc2"):
                reason, value = None, spectral_norm(stacked_weight(modules))
            else:
                try:
                    heads = attention_head_norms(architecture.attention_weights(modules[0]))
                except UndefinedStage as error:
                    reason = str(error)
                else:
                    reason, value = None, sum(o * v for o, v, _ in heads)
            if reason is not None:
                undefined.setdefault(component, reason)
            rows.append({"block": index, "component": component, "weight_spectral": value})
    if undefined:
        logging.getLogger(__name__).warning(
            "%s: weight statistic refused (NaN) for %s",
            type(model).__name__,
            "; ".join(f"{component} ({reason})" for component, reason in undefined.items()),
        )
    return pl.DataFrame(rows, schema=WEIGHT_SCHEMA)


def weight_estimate(weights: pl.DataFrame, components: Sequence[str]) -> Estimate:
    """The weight statistic of a configuration: its mean over (block, component) rows."""
    values = (
        weights.filter(pl.col("component").is_in(list(components)))["weight_spectral"]
        .to_numpy()
        .astype(np.float64)
    )
    return Estimate(float(values.mean()) if len(values) else math.nan, n_items=len(values))


# ---------------------------------------------------------------------------------------------
# PLoP's normalised feature norm


def nfn_estimate(features: pl.DataFrame, components: Sequence[str]) -> Estimate:
    """The NFN of a configuration: the unweighted mean over its linear maps (every block's).

    A configuration made of norms alone has no map: NaN (n/a), never a number. Maps whose NFN
    is not finite (an input of norm 0 throughout) are left out.
    """
    values = (
        features.filter(pl.col("component").is_in(list(components)))["nfn"]
        .to_numpy()
        .astype(np.float64)
    )
    values = values[np.isfinite(values)]
    return Estimate(float(values.mean()) if len(values) else math.nan, n_items=len(values))


# ---------------------------------------------------------------------------------------------
# Everything measured, pooled per configuration


@dataclass(frozen=True)
class Measurements:
    """What was measured once per component; any configuration's criteria pool from it."""

    pairs: pl.DataFrame
    """:func:`vitplasticity.plasticity.measure.measure` rows."""
    tensors: pl.DataFrame
    """:func:`gradient_statistics` rows of every component's tensors."""
    weights: pl.DataFrame
    """:func:`weight_statistics` rows."""
    component_parameters: dict[str, int]
    """Trainable parameters of each component (head and final norm excluded)."""
    always_trained: int
    """Parameters of the head and final norm (trained by every configuration)."""
    features: pl.DataFrame
    """:func:`vitplasticity.recommend.nfn.feature_norm_statistics` rows (one per linear map)."""

    def trainable_parameters(self, configuration: str) -> int:
        """Trainable parameters of ``configuration`` beyond the head and final norm (its
        components' parameters are disjoint, so the sum)."""
        return sum(self.component_parameters[c] for c in configuration_components(configuration))

    def estimates(self, configuration: str) -> dict[str, Estimate]:
        """Every criterion of ``configuration``, keyed by :data:`CRITERIA` names."""
        parts = configuration_components(configuration)
        return {
            "plasticity": plasticity_estimate(self.pairs, parts),
            "relative_gradient_norm": tensor_estimate(
                self.tensors, parts, "relative_gradient_norm"
            ),
            "gradient_snr": tensor_estimate(self.tensors, parts, "gradient_snr"),
            "weight_spectral": weight_estimate(self.weights, parts),
            "nfn": nfn_estimate(self.features, parts),
        }


def measure_criteria(
    model: nn.Module,
    reference: Images,
    downstream: Images,
    warmup_batches: Iterable[Batch],
    gradient_batches: Iterable[Batch],
    *,
    n_pairs: int,
    warmup_lr: float,
    batch_size: int = 64,
    protocol: str = "embedding",
    progress: Callable[[int], None] | None = None,
    nfn_seed: int = NFN_SEED,
) -> Measurements:
    """Measure every criterion of the five components of ``model``.

    In order: the weight statistic and the plasticity (on the model as given), then the head
    warm-up (:func:`head_warmup`, which changes the head only), then the NFN of every linear
    map on the first gradient batch (one forward pass without gradients; the warm-up did not
    touch the maps), then the gradient statistics of every component's tensors (that batch
    included).

    Args:
        model: a timm model of a known architecture in eval mode, with a classifier head for the
            downstream classes (seed the RNG before building it).
        reference: preprocessed reference images, as :func:`vitplasticity.plasticity.measure.measure`
            takes them; ``downstream`` likewise (pair i: reference i, downstream i, cycled).
        warmup_batches: labelled batches of the head warm-up (one SGD step each).
        gradient_batches: labelled batches the gradient criteria average over (>= 2).
        n_pairs: plasticity pairs.
        warmup_lr: the warm-up's SGD learning rate.
        batch_size: plasticity pairs per forward pass.
        protocol: the plasticity protocol (embedding: the paper's).
        progress: called with the plasticity pairs done.
        nfn_seed: the seed of NFN's random inputs.

    Raises:
        ValueError: for fewer than 2 gradient batches.
    """
    weights = weight_statistics(model)
    pairs = measure(
        model,
        reference,
        downstream,
        protocol=protocol,
        batch_size=batch_size,
        n_pairs=n_pairs,
        progress=progress,
    )
    head_warmup(model, warmup_batches, warmup_lr)
    batches = iter(gradient_batches)
    first = next(batches, None)
    if first is None:
        raise ValueError("gradient criteria need at least 2 batches, got 0")
    features = feature_norm_statistics(model, first[0], seed=nfn_seed)
    parameters = parameter_map(model)
    names = {c: parameters.component_names(c) for c in COMPONENTS}
    sizes = dict(model.named_parameters())
    tensors = gradient_statistics(
        model, itertools.chain([first], batches), [n for c in COMPONENTS for n in names[c]]
    )
    return Measurements(
        pairs=pairs,
        tensors=tensors,
        weights=weights,
        component_parameters={c: sum(sizes[n].numel() for n in names[c]) for c in COMPONENTS},
        always_trained=always_trained_parameters(model, parameters),
        features=features,
    )
