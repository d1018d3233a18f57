"""The criteria that rank the components of a ViT for finetuning, one function each.

Every criterion is measured once per *item* of each component and pooled afterwards, so that
any configuration (a component, or a '+' combination such as ``mha+fc1``) is the mean over
the items of its parts:

- ``plasticity``: items are the (block, pair) ratios ||f(x) - f(y)|| / ||x - y|| that
  :func:`vitplasticity.plasticity.measure.measure` returns (embedding protocol by default, as the
  paper). Mean and 95% CI = mean +/- 1.96 std / sqrt(n) over the n pooled ratios.
- ``relative_gradient_norm`` (Auto-RGN, Lee et al. 2023, "Surgical Fine-Tuning Improves
  Adaptation to Distribution Shifts"): items are parameter tensors; per tensor,
  ||g_b|| / ||w|| averaged over the gradient batches b (after
  :func:`.gradients.head_warmup`).
- ``gradient_snr``: items are parameter tensors; per tensor, ||mean_b g_b|| /
  sqrt(mean_b ||g_b - mean_b g_b||^2) (see :func:`.gradients.gradient_statistics`).
- ``weight_spectral`` (data-free): items are blocks; the weight factor of the paper's
  Section 4 bound (see :func:`weight_statistics`).
- ``nfn`` (PLoP's normalised feature norm, Hayou et al., ICLR 2026): items are the linear maps
  of every block (a gated FC1 is one map, gate and up together); per map, the mean output norm
  on the task's real inputs over the same on Gaussian inputs of the same norms, from one
  forward pass of the first gradient batch (:mod:`.nfn`). The norms (LN1, LN2) hold no linear
  map: their NFN is n/a (NaN, ranked last and never recommended), and a configuration that
  joins a norm to linear components has the NFN of its linear maps. PLoP finetunes the
  *lowest* NFN first (:data:`vitplasticity.criteria.LOWER_FIRST`), the opposite end from the
  other criteria.
- ``spectrum_snr`` (Spectrum) and ``kappa`` (KappaTune's condition number), data-free: items
  are the 2-D weight tensors of every block; per tensor, from its singular values
  (:mod:`.matrix_criteria`). Norms hold no matrix: n/a, as for NFN. KappaTune finetunes the
  *lowest* kappa first.

Which items each criterion pools, and how, is its :class:`vitplasticity.criteria.Items`
(:data:`vitplasticity.criteria.REGISTRY`); :func:`pooled_estimate` pools them.

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
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.criteria import REGISTRY, Items
from vitplasticity.models.architectures import (
    Architecture,
    ParameterMap,
    UndefinedStage,
    architecture_for,
    parameter_map,
    parse_configuration,
)
from vitplasticity.models.streamed import StreamedModel, loaded_blocks
from vitplasticity.plasticity.finite import PAIR_MEASURED, check_finite_rows
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.pairs import Images
from vitplasticity.plasticity.upper_bounds import (
    attention_head_norms,
    layernorm_refusal,
    spectral_norm,
    stacked_weight,
)
from vitplasticity.recommend.gradients import Batch, gradient_statistics, head_warmup
from vitplasticity.recommend.matrix_criteria import MATRIX_SCHEMA, matrix_statistics
from vitplasticity.recommend.nfn import NFN_SEED, feature_norm_statistics
from vitplasticity.recommend.settings import CRITERIA as CRITERIA  # the flag's choices

Z95 = 1.96
"""Normal quantile of a two-sided 95% interval (the paper's CI)."""

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
# Any criterion of a configuration, pooled over its items


def pooled_estimate(criterion: str, measured: pl.DataFrame, components: Sequence[str]) -> Estimate:
    """``criterion`` of the configuration joining ``components``: the unweighted mean of its
    items (the rows of ``measured`` whose ``component`` is one of them), as the criterion's
    :class:`vitplasticity.criteria.Items` say.

    Every item counts once, whatever its size (a tensor, weight or bias, LayerNorm gamma or
    beta; a block; a linear map; a (block, pair) ratio). Items whose value is not finite are
    left out (identical plasticity inputs, a zero weight norm, a norm's NFN, an n/a matrix),
    except for a criterion that keeps them (the weight statistic: its NaN then makes every
    configuration holding the component n/a). No item left: NaN (n/a), never a number. With
    an interval (plasticity), mean +/- 1.96 std / sqrt(n) over the same n items (ddof 1): the
    ratios of one pair in different blocks are not independent, so the interval is the
    paper's nominal one, narrower than an honest one over pairs.

    Args:
        criterion: a name of :data:`CRITERIA`.
        measured: the rows of the criterion's ``Items.measured`` field of
            :class:`Measurements`.
        components: the configuration's components.

    Raises:
        ValueError: for a criterion recommend does not measure.
    """
    items = _items(criterion)
    values = (
        measured.filter(pl.col("component").is_in(list(components)))[items.column]
        .to_numpy()
        .astype(np.float64)
    )
    if items.drop_undefined:
        values = values[np.isfinite(values)]
    if not len(values):
        return Estimate(math.nan)
    mean = float(values.mean())
    if not items.interval or len(values) < 2:
        return Estimate(mean, n_items=len(values))
    half = Z95 * float(values.std(ddof=1)) / math.sqrt(len(values))
    return Estimate(mean, mean - half, mean + half, len(values))


# ---------------------------------------------------------------------------------------------
# The data-free weight statistic


def weight_statistics(model: nn.Module | StreamedModel) -> pl.DataFrame:
    """The weight factor of the paper's plasticity bound, per (block, component), in float64;
    of a streamed model block by block from its checkpoint (the same numbers).

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
    warning names the component and why. NaN, not absent rows: :func:`pooled_estimate` is
    then NaN for every configuration that contains the component (reported "n/a", ranked
    last, never recommended nor joined into a union), where absent rows would make
    ``mha+fc1`` the mean of fc1 alone. Computed with :mod:`vitplasticity.plasticity.upper_bounds`.

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for (a
            ValueError).
        UndefinedStage: for a family that refuses the recommend stage (a ValueError).
    """
    root = model.model if isinstance(model, StreamedModel) else model
    architecture = _ranked_architecture(root)
    undefined: dict[str, str] = {}
    rows = []
    for index, block in loaded_blocks(model, architecture.blocks(root)):
        for component, modules in architecture.components(block).items():
            value, reason = _weight_factor(architecture, component, modules)
            if reason is not None:
                undefined.setdefault(component, reason)
            rows.append({"block": index, "component": component, "weight_spectral": value})
    if undefined:
        logging.getLogger(__name__).warning(
            "%s: weight statistic refused (NaN) for %s",
            type(root).__name__,
            "; ".join(f"{component} ({reason})" for component, reason in undefined.items()),
        )
    return pl.DataFrame(rows, schema=WEIGHT_SCHEMA)


def _ranked_architecture(model: nn.Module) -> Architecture:
    """The architecture of ``model``, once it accepts the recommend stage.

    Raises:
        UnsupportedModel: for a model no architecture knows.
        UndefinedStage: naming the model and its family, when the family refuses the stage.
    """
    architecture = architecture_for(model)
    refusal = architecture.refusal("recommend", model)
    if refusal is not None:
        raise UndefinedStage(
            f"the weight statistic of {type(model).__name__} ({architecture.title}) is not "
            f"defined: {refusal}"
        )
    return architecture


def _weight_factor(
    architecture: Architecture, component: str, modules: Sequence[nn.Module]
) -> tuple[float, str | None]:
    """The weight factor of one block's ``component`` (its ``modules``) and None, or NaN and
    why it is not defined (:func:`weight_statistics`)."""
    if component in ("ln1", "ln2"):
        (norm,) = modules
        reason = layernorm_refusal(norm)
        if reason is not None:
            return math.nan, reason
        gamma = norm.weight  # None in a LayerNorm without affine parameters: gamma = 1
        return (1.0 if gamma is None else gamma.detach().double().abs().max().item()), None
    if component in ("fc1", "fc2"):
        return spectral_norm(stacked_weight(modules)), None
    try:
        heads = attention_head_norms(architecture.mha_weights(tuple(modules)))
    except UndefinedStage as error:
        return math.nan, str(error)
    return sum(o * v for o, v, _ in heads), None


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
    matrices: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=MATRIX_SCHEMA))
    """:func:`vitplasticity.recommend.matrix_criteria.matrix_statistics` rows (one per tensor);
    empty: Spectrum SNR and kappa n/a for every configuration."""

    @classmethod
    def of_components(
        cls,
        model: nn.Module,
        *,
        pairs: pl.DataFrame,
        weights: pl.DataFrame,
        features: pl.DataFrame,
        gradients: Callable[[list[str]], pl.DataFrame],
        matrices: pl.DataFrame | None = None,
    ) -> Measurements:
        """The measurements of ``model``'s five components: ``gradients`` gives the gradient
        statistics of the parameter names it is called with (every component's, in
        :data:`COMPONENTS` order); the parameter counts come from the model's
        :class:`~vitplasticity.models.architectures.ParameterMap`; ``matrices``: the
        matrix statistics when already measured (None: :func:`matrix_statistics` of
        ``model``)."""
        parameters = parameter_map(model)
        names = {c: parameters.component_names(c) for c in COMPONENTS}
        sizes = dict(model.named_parameters())
        return cls(
            pairs=pairs,
            tensors=gradients([name for c in COMPONENTS for name in names[c]]),
            weights=weights,
            component_parameters={c: sum(sizes[n].numel() for n in names[c]) for c in COMPONENTS},
            always_trained=always_trained_parameters(model, parameters),
            features=features,
            matrices=matrix_statistics(model) if matrices is None else matrices,
        )

    def check_finite(self, what: str) -> None:
        """Raise unless what was measured is finite: the plasticity pairs' numerators and
        denominators, and the weight and relative gradient norms of every tensor whose weight
        is not zero (NaN by design there; a weight statistic or NFN refused for a component
        is NaN by design too, and is not checked).

        Raises:
            ValueError: naming ``what`` (the model), the block and component at fault.
        """
        check_finite_rows(self.pairs, PAIR_MEASURED, what)
        gradients = self.tensors.filter(pl.col("weight_norm") != 0)
        check_finite_rows(gradients, ("weight_norm", "relative_gradient_norm"), what)

    def trainable_parameters(self, configuration: str) -> int:
        """Trainable parameters of ``configuration`` beyond the head and final norm (its
        components' parameters are disjoint, so the sum)."""
        return sum(self.component_parameters[c] for c in configuration_components(configuration))

    def estimates(self, configuration: str) -> dict[str, Estimate]:
        """Every criterion of ``configuration``, keyed by :data:`CRITERIA` names (in that
        order), each pooled from the field its registry entry names
        (:func:`pooled_estimate`)."""
        parts = configuration_components(configuration)
        return {
            criterion: pooled_estimate(criterion, getattr(self, _items(criterion).measured), parts)
            for criterion in CRITERIA
        }


def _items(criterion: str) -> Items:
    """What recommend measures of ``criterion``.

    Raises:
        ValueError: for a criterion recommend does not measure (the criteria check's own).
    """
    items = REGISTRY[criterion].items
    if items is None:
        raise ValueError(
            f"criterion {criterion!r} is not one recommend measures ({', '.join(CRITERIA)})"
        )
    return items


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
        warmup_lr: the warm-up's SGD learning rate.
        n_pairs, batch_size, protocol, progress: the plasticity's pairs, pairs per forward
            pass, protocol (embedding: the paper's) and progress callback (pairs done).
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
    return _after_warmup(model, pairs, weights, gradient_batches, nfn_seed)


def _after_warmup(
    model: nn.Module,
    pairs: pl.DataFrame,
    weights: pl.DataFrame,
    gradient_batches: Iterable[Batch],
    nfn_seed: int,
) -> Measurements:
    """The measurements of the warmed-up ``model``, with its ``pairs`` and ``weights``: the
    NFN of the first gradient batch, then the gradient statistics of every batch.

    Raises:
        ValueError: for fewer than 2 gradient batches.
    """
    batches = iter(gradient_batches)
    first = next(batches, None)
    if first is None:
        raise ValueError("gradient criteria need at least 2 batches, got 0")
    return Measurements.of_components(
        model,
        pairs=pairs,
        weights=weights,
        features=feature_norm_statistics(model, first[0], seed=nfn_seed),
        gradients=lambda names: gradient_statistics(
            model, itertools.chain([first], batches), names
        ),
    )
