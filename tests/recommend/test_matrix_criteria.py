"""Spectrum's SNR and KappaTune's condition number against independent numpy computations
(planted-signal random matrices, ``numpy.linalg.cond``), their n/a cases with the reason, and
both criteria in the recommend table of a real model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.tiny_models import TINY_MODELS
from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import parameter_map
from vitplasticity.recommend.criteria import Measurements
from vitplasticity.recommend.matrix_criteria import (
    NO_NOISE,
    NOT_A_MATRIX,
    SINGULAR,
    ZERO_MATRIX,
    condition_number,
    matrix_statistics,
    spectrum_snr,
)
from vitplasticity.recommend.ranking import LOWER_FIRST

TINY_VIT = next(t for t in TINY_MODELS if t.id == "vit_tiny_patch16_224")


def _planted(n: int, m: int, spikes: list[float], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A noise matrix plus rank-len(spikes) signal of the given strengths, and the planted
    strengths. The noise's columns have scales from 0.05 to 1 (over sqrt(max(n, m))), so its
    singular values spread as trained weights' do: with i.i.d. noise of a rectangular shape
    they bunch so tightly that Spectrum's IQR threshold leaves no noise (see below)."""
    rng = np.random.default_rng(seed)
    scales = np.linspace(0.05, 1.0, m)
    noise = rng.standard_normal((n, m)) * scales / math.sqrt(max(n, m))
    u, _ = np.linalg.qr(rng.standard_normal((n, len(spikes))))
    v, _ = np.linalg.qr(rng.standard_normal((m, len(spikes))))
    return noise + u @ np.diag(spikes) @ v.T, np.asarray(spikes)


def _spectrum_reference(weight: np.ndarray) -> float:
    """Spectrum's SNR written independently: singular values from the eigenvalues of the Gram
    matrix, quartiles by explicit linear interpolation on the sorted values."""
    gram = weight @ weight.T if weight.shape[0] <= weight.shape[1] else weight.T @ weight
    s = np.sort(np.sqrt(np.clip(np.linalg.eigvalsh(gram), 0, None)))  # ascending

    def quantile(q: float) -> float:
        position = q * (len(s) - 1)
        low = math.floor(position)
        high = min(low + 1, len(s) - 1)
        return s[low] + (position - low) * (s[high] - s[low])

    sigma = (quantile(0.75) - quantile(0.25)) / 1.349
    n, m = weight.shape
    threshold = sigma * math.sqrt((1 + math.sqrt(min(n / m, m / n))) ** 2)
    signal = s[s > threshold].sum()
    noise = s[s <= threshold].sum()
    return signal / noise / s[-1]


@pytest.mark.parametrize(("n", "m", "seed"), [(64, 64, 0), (48, 192, 1), (192, 48, 2)])
def test_spectrum_snr_matches_an_independent_computation_on_planted_signal(
    n: int, m: int, seed: int
) -> None:
    weight, spikes = _planted(n, m, [12.0, 9.0, 7.0], seed)
    value, reason = spectrum_snr(weight)
    assert reason is None
    assert value == pytest.approx(_spectrum_reference(weight), rel=1e-9)
    # The planted spikes are on the signal side of Spectrum's threshold (the heuristic
    # sigma = IQR/1.349 of the singular values is not the noise's, so some noise values are
    # counted as signal too: Spectrum's estimate, kept as it is).
    s = np.linalg.svd(weight, compute_uv=False)
    sigma = (np.quantile(s, 0.75) - np.quantile(s, 0.25)) / 1.349
    threshold = sigma * (1 + math.sqrt(min(n, m) / max(n, m)))
    assert (s[: len(spikes)] > threshold).all()
    assert (s <= threshold).any()


def test_spectrum_snr_equals_spectrums_torch_formula() -> None:
    """The value Spectrum's own operations give (torch.linalg.svdvals, torch.quantile)."""
    weight, _ = _planted(40, 100, [5.0, 3.0], seed=3)
    s = torch.linalg.svdvals(torch.from_numpy(weight))
    sigma = (torch.quantile(s, 0.75) - torch.quantile(s, 0.25)) / 1.349
    threshold = sigma * np.sqrt((1 + np.sqrt(40 / 100)) ** 2)
    signal, noise = s[s > threshold].sum(), s[s <= threshold].sum()
    assert spectrum_snr(weight)[0] == pytest.approx(float(signal / noise / s[0]), rel=1e-12)


def test_iid_rectangular_noise_leaves_spectrum_no_noise() -> None:
    """Spectrum's threshold uses sigma = IQR(s)/1.349 of the singular values themselves: for
    i.i.d. noise of shape 48 x 192 they lie in a narrow band, the threshold falls below all of
    them, and Spectrum's value would be sum(s)/s_max: n/a here."""
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((48, 192)) / math.sqrt(192)
    s = np.linalg.svd(weight, compute_uv=False)
    sigma = (np.quantile(s, 0.75) - np.quantile(s, 0.25)) / 1.349
    assert (s > sigma * (1 + math.sqrt(48 / 192))).all()
    value, reason = spectrum_snr(weight)
    assert math.isnan(value) and reason == NO_NOISE


def test_no_signal_is_a_true_zero() -> None:
    """s = (1, 1, 0, 0): IQR 1, threshold 2/1.349 = 1.48 > s_max, nothing is signal: 0."""
    assert spectrum_snr(np.diag([1.0, 1.0, 0.0, 0.0])) == (0.0, None)


@pytest.mark.parametrize(
    ("weight", "reason"),
    [
        (np.ones(16), NOT_A_MATRIX),  # a norm's gamma: Spectrum would say 1.0
        (np.linspace(-1.0, 2.0, 16), NOT_A_MATRIX),  # any 1-D weights alike
        (np.eye(8) * 3.0, NO_NOISE),  # IQR 0: Spectrum's "no noise" (sum(s)/s_max = 8)
        (np.linalg.qr(np.random.default_rng(5).standard_normal((12, 12)))[0], NO_NOISE),
        (np.zeros((6, 4)), ZERO_MATRIX),
    ],
)
def test_spectrum_degenerate_cases_are_na_with_the_reason(weight: np.ndarray, reason: str) -> None:
    value, why = spectrum_snr(weight)
    assert math.isnan(value)
    assert why == reason


@pytest.mark.parametrize(("n", "m", "seed"), [(32, 32, 0), (24, 96, 1), (96, 24, 2)])
def test_kappa_is_numpy_cond(n: int, m: int, seed: int) -> None:
    weight, _ = _planted(n, m, [6.0, 2.0], seed)
    value, reason = condition_number(weight)
    assert reason is None
    assert value == pytest.approx(np.linalg.cond(weight), rel=1e-9)


def test_kappa_degenerate_cases_are_na_with_the_reason() -> None:
    value, reason = condition_number(np.ones(5))
    assert math.isnan(value) and "1-D" in str(reason)
    value, reason = condition_number(np.zeros((3, 3)))
    assert math.isnan(value) and reason == ZERO_MATRIX
    exact = np.array([[1.0, 2.0], [2.0, 4.0]])  # singular values 5 and exactly 0
    value, reason = condition_number(exact)
    if np.linalg.svd(exact, compute_uv=False)[-1] == 0:
        assert math.isnan(value) and reason == SINGULAR
    else:  # rounding left s_min tiny but not 0: a huge, finite kappa, as numpy's
        assert value == pytest.approx(np.linalg.cond(exact), rel=1e-6)


def test_a_real_model_scores_every_matrix_and_no_norm() -> None:
    model = TINY_VIT.build()
    table = matrix_statistics(model)
    parameters = parameter_map(model)
    tensors = dict(model.named_parameters())
    assert table["parameter"].to_list() == [
        n for c in COMPONENTS for n in parameters.component_names(c)
    ]
    for row in table.iter_rows(named=True):
        weight = tensors[row["parameter"]].detach().double().numpy()
        if weight.ndim == 2:
            assert row["kappa"] == pytest.approx(np.linalg.cond(weight), rel=1e-9)
            assert row["spectrum_snr_reason"] in (None, NO_NOISE)
            if row["spectrum_snr_reason"] is None:
                assert row["spectrum_snr"] == pytest.approx(_spectrum_reference(weight), rel=1e-9)
        else:
            assert math.isnan(row["spectrum_snr"]) and row["spectrum_snr_reason"] == NOT_A_MATRIX
            assert math.isnan(row["kappa"]) and row["kappa_reason"]
    assert table.filter(table["component"].is_in(["ln1", "ln2"]))["kappa"].is_nan().all()


def test_the_norms_are_na_and_kappa_ranks_lowest_first() -> None:
    model = TINY_VIT.build()
    matrices = matrix_statistics(model)
    measurements = Measurements(
        pairs=None,  # type: ignore[arg-type]  # only the matrix criteria are read below
        tensors=None,  # type: ignore[arg-type]
        weights=None,  # type: ignore[arg-type]
        component_parameters={c: 10 for c in COMPONENTS},
        always_trained=0,
        features=None,  # type: ignore[arg-type]
        matrices=matrices,
    )
    for criterion in ("spectrum_snr", "kappa"):
        means = {}
        for component in COMPONENTS:
            values = matrices.filter(matrices["component"] == component)[criterion].to_numpy()
            finite = values[np.isfinite(values)]
            means[component] = finite.mean() if len(finite) else math.nan
            estimate = measurements._matrix_estimate((component,), criterion)
            assert estimate.value == pytest.approx(means[component], nan_ok=True)
        assert math.isnan(means["ln1"]) and math.isnan(means["ln2"])
        both = measurements._matrix_estimate(("mha", "fc1"), criterion).value
        rows = matrices.filter(matrices["component"].is_in(["mha", "fc1"]))[criterion].to_numpy()
        assert both == pytest.approx(rows[np.isfinite(rows)].mean())
    assert "kappa" in LOWER_FIRST and "spectrum_snr" not in LOWER_FIRST
