"""Two data-free criteria of a weight matrix's singular values: Spectrum's SNR and KappaTune's
condition number, per 2-D weight tensor of every component.

- ``spectrum_snr`` (Hartford et al. 2024, "Spectrum: Targeted Training on Signal to Noise
  Ratio", arXiv 2406.06623; cognitivecomputations/spectrum ``spectrum.py``,
  ``calculate_snr_for_layer``): the singular values s of an (n, m) weight, sigma = IQR(s) /
  1.349 (quartiles by linear interpolation, as ``torch.quantile``), the Marchenko-Pastur
  threshold sigma (1 + sqrt(beta)) with beta = min(n, m) / max(n, m); signal = the sum of the
  s above the threshold, noise = the sum of the others; SNR = signal / noise / s_max. Spectrum
  trains the modules of *highest* SNR.
- ``kappa`` (Ludwig 2025, "The Condition Number as a Scale-Invariant Proxy for Information
  Encoding in Neural Units", arXiv 2506.16289; oswaldoludwig/kappaTune
  ``selective_fine_tuning.py``): kappa = s_max / s_min over the same singular values;
  KappaTune finetunes the *lowest* kappa first (the least anisotropic tensors), so kappa ranks
  its lowest value first (:data:`vitplasticity.criteria.LOWER_FIRST`).

Spectrum's code returns a number in cases where the number means something else; here those
are n/a (NaN) with the reason in ``reason``, never a value:

- a 1-D tensor (a norm's gamma or beta, a bias): Spectrum unsqueezes it to a 1 x d matrix, one
  singular value, IQR 0, threshold 0, so it scores 1.0 whatever the weights (KappaTune skips
  tensors below 2-D). Norms (LN1, LN2) therefore have neither criterion, as they have no NFN;
- no singular value at or below the threshold (``no noise``): Spectrum then divides by 1
  instead of a noise sum, so the value turns into sum(s) / s_max, a count of directions, not a
  ratio of signal to noise. It happens whenever the singular values bunch, since the
  threshold comes from their own spread: i.i.d. noise of a rectangular shape (a random-init
  FC1 or FC2: every one of their matrices in the demo model) as well as an orthogonal matrix
  (IQR 0), so "no noise" is no statement that the matrix holds only signal;
- every value at or below the threshold is 0 (a rank-deficient matrix whose other singular
  values bunch): Spectrum divides by a noise sum of 0, infinity;
- s_max = 0 (a zero matrix): no spectrum at all; for kappa, s_min = 0 (a singular matrix:
  KappaTune's infinity) is n/a likewise, so that a configuration's mean stays a number.

A 3-D tensor is a stack of matrices, one per expert (an MoE's fused experts, (E, out, in):
:mod:`~vitplasticity.models.architectures.hf_moe`): each expert's matrix is scored as a 2-D
weight, its row named ``parameter[e]``, as it is stored (Mixtral's ``gate_up_proj`` holds an
expert's gate and up rows as one matrix).

Signal = 0 (every singular value below the threshold) is a true SNR of 0 and is kept. Both
criteria are computed in float64 on the CPU (an SVD per matrix; ViT-B has 48, a second).
A configuration's value is the unweighted mean over the 2-D weights of its components, every
block's (:func:`vitplasticity.recommend.criteria.pooled_estimate`); a configuration of norms
alone has none: n/a, as has one whose every matrix is n/a (the demo's FC1 and FC2 for
Spectrum: no noise).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.streamed import StreamedModel, loaded_blocks

IQR_TO_SIGMA = 1.349
"""The interquartile range of a standard normal: IQR / 1.349 estimates its sigma."""

MATRIX_SCHEMA: dict[str, pl.DataType] = {
    "component": pl.String(),
    "parameter": pl.String(),
    "spectrum_snr": pl.Float64(),
    "spectrum_snr_reason": pl.String(),
    "kappa": pl.Float64(),
    "kappa_reason": pl.String(),
}
"""Columns of :func:`matrix_statistics`: one row per parameter tensor of the five components
(per expert of a 3-D one: ``parameter[e]``)."""

NOT_A_MATRIX = "a 1-D tensor (norm weight or bias) has one singular value: Spectrum scores it 1.0"
NO_NOISE = (
    "no singular value at or below the Marchenko-Pastur threshold: Spectrum divides by 1, so "
    "the value would be sum(s)/s_max, not a signal-to-noise ratio"
)
ZERO_NOISE = (
    "every singular value at or below the Marchenko-Pastur threshold is 0: Spectrum divides "
    "by a noise sum of 0 (infinity)"
)
ZERO_MATRIX = "a zero matrix has no singular spectrum"
SINGULAR = "a singular matrix (s_min = 0) has an infinite condition number"


def singular_values(weight: np.ndarray) -> np.ndarray:
    """The singular values of a 2-D ``weight`` in float64, largest first."""
    return np.linalg.svd(np.asarray(weight, dtype=np.float64), compute_uv=False)


def spectrum_snr(weight: np.ndarray) -> tuple[float, str | None]:
    """Spectrum's SNR of ``weight`` and None, or NaN and why it is n/a (module docstring)."""
    weight = np.asarray(weight, dtype=np.float64)
    if weight.ndim != 2:
        return math.nan, NOT_A_MATRIX
    s = singular_values(weight)
    if s[0] == 0:
        return math.nan, ZERO_MATRIX
    q25, q75 = np.quantile(s, [0.25, 0.75])
    sigma = (q75 - q25) / IQR_TO_SIGMA
    n, m = weight.shape
    beta = min(n, m) / max(n, m)
    threshold = sigma * (1 + math.sqrt(beta))
    signal = s > threshold
    if signal.all():
        return math.nan, NO_NOISE
    noise = s[~signal].sum()
    if noise == 0:
        return math.nan, ZERO_NOISE
    return float(s[signal].sum() / noise / s[0]), None


def condition_number(weight: np.ndarray) -> tuple[float, str | None]:
    """KappaTune's kappa = s_max / s_min of ``weight`` and None, or NaN and why it is n/a."""
    weight = np.asarray(weight, dtype=np.float64)
    if weight.ndim != 2:
        return math.nan, "a 1-D tensor (norm weight or bias) is not a matrix: KappaTune skips it"
    s = singular_values(weight)
    if s[0] == 0:
        return math.nan, ZERO_MATRIX
    if s[-1] == 0:
        return math.nan, SINGULAR
    return float(s[0] / s[-1]), None


def matrix_statistics(model: nn.Module | StreamedModel) -> pl.DataFrame:
    """Spectrum's SNR and kappa of every parameter tensor of the five components (of each
    expert's matrix of a 3-D one), every block's, in ``named_parameters`` order (the model's
    :class:`~vitplasticity.models.architectures.ParameterMap` says which component owns which);
    of a streamed model block by block from its checkpoint (the same rows).

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    from vitplasticity.models.architectures import architecture_for

    root = model.model if isinstance(model, StreamedModel) else model
    parameters = parameter_map(root)
    # Names, not identities: a streamed block's parameters are new objects once loaded.
    owner = {name: c for c in COMPONENTS for name in parameters.component_names(c)}
    order = {name: i for i, name in enumerate(owner)}  # component by component, as the map
    rows: dict[str, list[dict[str, object]]] = {}

    def score(held: set[int] | None) -> None:
        """Score the components' tensors in ``held`` (identities; None: every one left)."""
        for name, tensor in root.named_parameters():
            if name in owner and name not in rows and (held is None or id(tensor) in held):
                rows[name] = [_row(owner[name], *matrix) for matrix in _matrices(name, tensor)]

    for _, block in loaded_blocks(model, architecture_for(root).blocks(root)):
        score({id(p) for p in block.parameters()})
    if len(rows) < len(owner):
        # A component's tensor outside the blocks (DeBERTa's relative-position embeddings,
        # which every block's attention reads): loaded with the embedding.
        if isinstance(model, StreamedModel):
            model.load_outside_blocks()
        score(None)
    ordered = sorted(rows.items(), key=lambda item: order[item[0]])
    return pl.DataFrame([row for _, found in ordered for row in found], schema=MATRIX_SCHEMA)


def _row(component: str, parameter: str, weight: np.ndarray) -> dict[str, object]:
    """The :data:`MATRIX_SCHEMA` row of one matrix (``parameter``) of ``component``."""
    snr, snr_reason = spectrum_snr(weight)
    kappa, kappa_reason = condition_number(weight)
    return {
        "component": component,
        "parameter": parameter,
        "spectrum_snr": snr,
        "spectrum_snr_reason": snr_reason,
        "kappa": kappa,
        "kappa_reason": kappa_reason,
    }


def _matrices(name: str, tensor: torch.Tensor) -> list[tuple[str, np.ndarray]]:
    """The tensor ``name`` as the rows :func:`matrix_statistics` scores: itself, or each
    expert's matrix of a 3-D stack (``name[e]``), in float64."""
    values = tensor.detach().cpu().double().numpy()
    if values.ndim != 3:
        return [(name, values)]
    return [(f"{name}[{expert}]", matrix) for expert, matrix in enumerate(values)]
