"""Theoretical upper bounds on the plasticity of every component (paper, Section 4).

For inputs x, y drawn from a set of token sequences (n tokens x d features):

- LayerNorm: ||gamma||_inf / sigma, sigma the smallest per-token standard deviation
  sqrt(var + eps) of the set. (Valid although {std >= sigma} is not convex: the normalised
  token is a radial projection, and the Dunkl-Williams inequality bounds its change by
  ||x - y|| / min(std(x), std(y)).)
- Linear (fc1, fc2): ||W||_2, the largest singular value.
- MHA: sum_h ||O^h||_2 ||V^h||_2 sqrt(3n + (12n + 3) r^4 ||A^h||_2^2), r the largest token
  norm of the set and A^h = Q^h K^hT / sqrt(d_h) with the paper's Q^h, K^h in R^{d x d_h}.
  In torch's (out, in) layout head h's query, key and value maps are the ROWS
  h*d_h:(h+1)*d_h of the stacked qkv weight (q, k, v along rows), so the paper's Q^h is the
  transpose of that row block and A^h = W_q^hT W_k^h / sqrt(d_h) (d x d: the bilinear form of
  the attention logits x_i^T A^h x_j; a model that scales its logits otherwise, GPT2 with
  its scale options, states its scale: ``AttentionWeights.logit_scale``); O^h is columns
  h*d_h:(h+1)*d_h of proj.weight. A causal mask (GPT2) keeps each row of attention weights
  on a face of the simplex, so the bound still holds (docs/architectures.md, "Bounds on
  text").
- MHA under bounded total energy E = sum_i ||x_i||^2 of a sequence:
  sum_h ||O^h||_2 ||V^h||_2 (sqrt(n) + alpha^2 E ||A^h||_2). The paper leaves alpha open to
  us; we take alpha = 1, which makes it a valid bound: the softmax Jacobian has norm <= 1/2,
  the logit change is <= 2 ||A|| ||X||_2 ||H||_F, and a row-stochastic P has ||P||_2 <= sqrt(n),
  so one head changes by at most ||V|| (sqrt(n) + ||X||_F^2 ||A||) ||H||_F.

The set is given by sample sequences (the embedding outputs of the reference images, or of a
text model's reference sequences): sigma, r and E are their extreme values. The attention
bounds ignore biases, as the paper does; the key and value biases cancel in every
difference, the query bias does not (zero in random-init models, small in the paper's
checkpoints, nonzero in pretrained GPT2 and BERT). Everything is computed in float64.

Which modules a component is comes from the model's architecture
(:func:`vitplasticity.models.architectures.architecture_for`). A component whose bound the paper does
not state for the model gets no rows, and the reason is given instead (:func:`undefined_bounds`):
a norm that is not a LayerNorm (RMSNorm divides by the root mean square, not the std about the
mean), and MHA where the architecture refuses it (rotary positions, normalised queries and
keys, a normalised or gated output). A family whose bounds the paper does not state at all
(Llama, Gemma: RMSNorm and rotary positions) is refused whole (:func:`bounds_architecture`).
A gated MLP's FC1 is its gate and up projections together, as plasticity measures it: the
map x -> [W_gate x; W_up x], whose bound is the spectral norm of the stacked (out, in)
weights [W_gate; W_up].

:func:`upper_bounds` computes them; :mod:`vitplasticity.plasticity.bounds` is the ``bounds``
stage, which sets them beside the measured plasticity, and
:mod:`vitplasticity.plasticity.text_bounds` its text counterpart.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import polars as pl
import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import (
    ARCHITECTURES,
    Architecture,
    AttentionWeights,
    UndefinedStage,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.models.architectures.base import linear_weight

log = logging.getLogger(__name__)

ENERGY_ALPHA = 1.0
"""alpha of the energy-based MHA bound (see the module docstring for why 1 is valid)."""

BOUND_SCHEMA: dict[str, pl.DataType] = {
    "block": pl.Int64(),
    "component": pl.String(),
    "bound": pl.Float64(),
    "bound_energy": pl.Float64(),
    "gamma_inf": pl.Float64(),
    "sigma": pl.Float64(),
    "spectral_norm": pl.Float64(),
    "n_tokens": pl.Int64(),
    "radius": pl.Float64(),
    "energy": pl.Float64(),
    "alpha": pl.Float64(),
}
"""Columns of :func:`upper_bounds`; a quantity a component's bound does not use is null."""


@dataclass(frozen=True)
class TokenStatistics:
    """The extreme values of a set of token sequences that the bounds need."""

    n_tokens: int
    width: int
    """Features per token d."""
    min_variance: float
    """Smallest per-token (biased) feature variance; sigma = sqrt(min_variance + eps)."""
    radius: float
    """Largest token norm r."""
    energy: float
    """Largest total energy sum_i ||x_i||^2 of one sequence."""
    n_sequences: int

    @classmethod
    def from_tokens(cls, tokens: torch.Tensor | Iterable[torch.Tensor]) -> TokenStatistics:
        """Reduce sequences (N, n, d), or an iterable of such batches, in float64.

        Raises:
            ValueError: when there are no sequences, a batch is not 3-D, or batches differ
                in token count or width.
        """
        batches = (tokens,) if isinstance(tokens, torch.Tensor) else tokens
        shape: tuple[int, int] | None = None
        min_var, radius, energy, count = math.inf, 0.0, 0.0, 0
        for batch in batches:
            if batch.ndim != 3:
                raise ValueError(f"tokens: expected (N, n, d) sequences, got {tuple(batch.shape)}")
            if shape is not None and tuple(batch.shape[1:]) != shape:
                raise ValueError(f"tokens: batches of shape {shape} and {tuple(batch.shape[1:])}")
            shape = tuple(batch.shape[1:])
            if not len(batch):
                continue
            x = batch.detach().to(torch.float64)
            squared_norms = x.square().sum(dim=-1)  # (N, n)
            min_var = min(min_var, x.var(dim=-1, correction=0).min().item())
            radius = max(radius, squared_norms.max().sqrt().item())
            energy = max(energy, squared_norms.sum(dim=-1).max().item())
            count += len(x)
        if count == 0 or shape is None:
            raise ValueError("tokens: no sequences")
        return cls(
            n_tokens=shape[0],
            width=shape[1],
            min_variance=min_var,
            radius=radius,
            energy=energy,
            n_sequences=count,
        )


def spectral_norm(matrix: torch.Tensor) -> float:
    """Largest singular value, in float64."""
    return torch.linalg.matrix_norm(matrix.detach().to(torch.float64), ord=2).item()


def stacked_weight(modules: Sequence[nn.Module]) -> torch.Tensor:
    """The (out, in) weights of linear ``modules`` that share one input, stacked along rows, in
    float64: the map whose output is the concatenation of theirs (a gated MLP's FC1 stage,
    [W_gate; W_up]), as plasticity measures it.

    Raises:
        UnsupportedModel: for a module that is not linear, or modules of different input
            widths (their outputs are not one map of one input).
    """
    weights = [linear_weight(module)[0].detach().to(torch.float64) for module in modules]
    widths = {weight.shape[1] for weight in weights}
    if len(widths) != 1:
        names = ", ".join(type(module).__name__ for module in modules)
        raise UnsupportedModel(f"{names}: input widths {sorted(widths)} differ")
    return weights[0] if len(weights) == 1 else torch.cat(weights)


def check_heads(weights: AttentionWeights) -> None:
    """Check that ``weights`` are ``num_heads`` heads of query, key and value rows each, and an
    output projection taking their concatenation.

    Raises:
        UndefinedStage: otherwise (grouped keys and values, for instance): the paper's MHA
            bound is per head, with one key and value head per query head.
    """
    query, key, value, output = weights.query, weights.key, weights.value, weights.output
    shapes = ", ".join(str(tuple(w.shape)) for w in (query, key, value))
    if not (query.shape == key.shape == value.shape) or query.shape[0] % weights.num_heads:
        raise UndefinedStage(
            f"query, key and value weights of shapes {shapes} are not {weights.num_heads} heads "
            "each: the paper's per-head MHA bound needs one key and value head per query head"
        )
    if output.shape[1] != query.shape[0]:
        raise UndefinedStage(
            f"the output projection takes {output.shape[1]} features, the heads give "
            f"{query.shape[0]}"
        )


def attention_head_norms(weights: AttentionWeights) -> list[tuple[float, float, float]]:
    """(||O^h||_2, ||V^h||_2, ||A^h||_2) of every head of one attention module.

    Raises:
        UndefinedStage: as :func:`check_heads`.
    """
    check_heads(weights)
    heads = weights.num_heads
    query, key, value = (
        w.detach().to(torch.float64) for w in (weights.query, weights.key, weights.value)
    )  # (h d_h, d) each: head h is rows h*d_h:(h+1)*d_h
    proj = weights.output.detach().to(torch.float64)  # (d, h d_h)
    d_h = query.shape[0] // heads
    norms = []
    for h in range(heads):
        rows = slice(h * d_h, (h + 1) * d_h)
        logits_form = query[rows].T @ key[rows]  # (d, d): x_i^T A x_j, once scaled
        if weights.logit_scale is None:
            logits_form = logits_form / math.sqrt(d_h)
        else:
            logits_form = logits_form * weights.logit_scale
        norms.append(
            (spectral_norm(proj[:, rows]), spectral_norm(value[rows]), spectral_norm(logits_form))
        )
    return norms


def layernorm_refusal(norm: nn.Module) -> str | None:
    """Why the paper's LayerNorm bound does not apply to ``norm`` (None: it does)."""
    if isinstance(norm, nn.LayerNorm):
        return None
    return (
        f"{type(norm).__name__} is not a LayerNorm: the bound ||gamma||_inf / sigma is stated for "
        "LayerNorm, sigma the smallest token std about the token's mean"
    )


def bounds_architecture(model: nn.Module) -> Architecture:
    """The architecture of ``model``, after checking that its family has bounds at all.

    Raises:
        UnsupportedModel: naming the model's class, for a model no architecture knows.
        UndefinedStage: naming the model and its family, when the family refuses the stage
            (Llama, Gemma: RMSNorm, rotary positions).
    """
    try:
        architecture = architecture_for(model)
    except UnsupportedModel as error:
        families = ", nor a ".join(a.title for a in ARCHITECTURES.values())
        raise UnsupportedModel(
            f"bounds: {type(model).__name__} ({type(model).__module__}) is not a {families}; "
            "no vitplasticity architecture knows this model class"
        ) from error
    refusal = architecture.refusal("bounds", model)
    if refusal is not None:
        raise UndefinedStage(
            f"bounds of {type(model).__name__} ({architecture.title}) are not defined: {refusal}"
        )
    return architecture


def undefined_bounds(model: nn.Module, architecture: Architecture | None = None) -> dict[str, str]:
    """Per component whose bound is not defined for ``model``, why (in :data:`COMPONENTS`
    order; empty when every bound is defined).

    A component refused in one block is refused in all: a partial curve would pass for the
    component's bound. MHA is refused where the architecture says the paper's bound does not
    hold for the model (rotary positions) or cannot give the heads' Q, K, V, O (normalised
    queries and keys, a normalised or gated output).

    Raises:
        UnsupportedModel, UndefinedStage: as :func:`bounds_architecture`; UnsupportedModel also
            for blocks the architecture cannot account for.
    """
    architecture = architecture or bounds_architecture(model)
    reasons: dict[str, str] = {}
    mha_refusal = architecture.mha_bound_refusal(model)
    if mha_refusal is not None:
        reasons["mha"] = mha_refusal
    for block in architecture.blocks(model):
        parts = architecture.components(block)
        for component in ("ln1", "ln2"):
            (norm,) = parts[component]
            refusal = layernorm_refusal(norm)
            if refusal is not None:
                reasons.setdefault(component, refusal)
        if "mha" not in reasons:
            try:
                check_heads(architecture.mha_weights(parts["mha"]))
            except UndefinedStage as error:
                reasons["mha"] = str(error)
    return {c: reasons[c] for c in COMPONENTS if c in reasons}


def log_undefined(model: nn.Module, undefined: dict[str, str]) -> None:
    if undefined:
        log.warning(
            "%s: no bound for %s",
            type(model).__name__,
            "; ".join(f"{component} ({reason})" for component, reason in undefined.items()),
        )


def _row(block: int, component: str, bound: float, **quantities: float | int | None) -> dict:
    row = dict.fromkeys(BOUND_SCHEMA)
    row.update(block=block, component=component, bound=bound, **quantities)
    return row


def _mha_row(index: int, heads: list[tuple[float, float, float]], stats: TokenStatistics) -> dict:
    n, r, energy = stats.n_tokens, stats.radius, stats.energy
    bound = sum(o * v * math.sqrt(3 * n + (12 * n + 3) * r**4 * a**2) for o, v, a in heads)
    bound_energy = sum(o * v * (math.sqrt(n) + ENERGY_ALPHA**2 * energy * a) for o, v, a in heads)
    return _row(
        index,
        "mha",
        bound,
        bound_energy=bound_energy,
        n_tokens=n,
        radius=r,
        energy=energy,
        alpha=ENERGY_ALPHA,
    )


def bound_rows(
    architecture: Architecture,
    model: nn.Module,
    stats: TokenStatistics,
    undefined: dict[str, str],
) -> pl.DataFrame:
    rows = []
    for index, block in enumerate(architecture.blocks(model)):
        parts = architecture.components(block)
        width = linear_weight(parts["fc1"][0])[0].shape[1]
        if width != stats.width:
            raise ValueError(f"tokens have {stats.width} features, block {index} expects {width}")
        for component, modules in parts.items():
            if component in undefined:
                continue
            if component in ("ln1", "ln2"):
                (norm,) = modules
                gamma_inf = (
                    1.0  # a LayerNorm without affine parameters: gamma = 1
                    if norm.weight is None
                    else norm.weight.detach().to(torch.float64).abs().max().item()
                )
                sigma = math.sqrt(stats.min_variance + norm.eps)
                rows.append(
                    _row(index, component, gamma_inf / sigma, gamma_inf=gamma_inf, sigma=sigma)
                )
            elif component in ("fc1", "fc2"):
                norm = spectral_norm(stacked_weight(modules))
                rows.append(_row(index, component, norm, spectral_norm=norm))
            else:
                # One module (a ViT's attn) or several run in turn (BERT's self-attention,
                # then its output projection): the architecture gives the heads either way.
                heads = attention_head_norms(architecture.mha_weights(modules))
                rows.append(_mha_row(index, heads, stats))
    return pl.DataFrame(rows, schema=BOUND_SCHEMA)


def bounds_from_statistics(model: nn.Module, stats: TokenStatistics) -> pl.DataFrame:
    """The bounds of every (block, component) of ``model`` for sequences summarised by ``stats``.

    A component in :func:`undefined_bounds` gets no rows (logged once, with the reason).

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for.
        UndefinedStage: for a family without bounds (Llama, Gemma).
        ValueError: when the tokens' width is not the model's.
    """
    architecture = bounds_architecture(model)
    undefined = undefined_bounds(model, architecture)
    log_undefined(model, undefined)
    return bound_rows(architecture, model, stats, undefined)


def upper_bounds(model: nn.Module, tokens: torch.Tensor | Iterable[torch.Tensor]) -> pl.DataFrame:
    """Upper bounds on the plasticity of every component of every block.

    Args:
        model: a model of a registered architecture (a timm ViT, Eva, ..., a transformers
            GPT2, BERT or RoBERTa).
        tokens: embedding-output sequences (N, n, d), or an iterable of such batches (of a
            text model: its embedding of token ids, not the ids): the set
            whose extreme values (smallest token std, largest token norm, largest sequence
            energy) the bounds assume of both inputs of every pair.

    Returns:
        One row per (block, component) whose bound is defined (:func:`undefined_bounds` says
        which are not, and why), columns :data:`BOUND_SCHEMA`: ``bound``, the energy-based
        MHA bound ``bound_energy`` (null for the other components), and the quantities used
        (gamma_inf and sigma for LayerNorms; spectral_norm for fc1/fc2; n_tokens, radius,
        energy and alpha for MHA).

    Raises:
        ValueError: for malformed tokens, or (:class:`UnsupportedModel`,
            :class:`UndefinedStage`) a model without bounds.
    """
    return bounds_from_statistics(model, TokenStatistics.from_tokens(tokens))
