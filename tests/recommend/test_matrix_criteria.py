"""Spectrum's SNR and KappaTune's condition number against independent numpy computations
(planted-signal random matrices, ``numpy.linalg.cond``), their n/a cases with the reason, and
both criteria in the recommend table of a real model."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from tests.helpers.repo import REPO
from tests.helpers.tiny_models import TINY_MODELS
from vitplasticity.components import COMPONENTS
from vitplasticity.criteria import LOWER_FIRST, REGISTRY
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import ModelSpec
from vitplasticity.recommend.criteria import pooled_estimate
from vitplasticity.recommend.matrix_criteria import (
    NO_NOISE,
    NOT_A_MATRIX,
    SINGULAR,
    ZERO_MATRIX,
    ZERO_NOISE,
    condition_number,
    matrix_statistics,
    spectrum_snr,
)
from vitplasticity.recommend.trainer_exports import FUSED_EXPERTS, spectrum_scores
from vitplasticity.report import criteria as report_criteria
from vitplasticity.report.tables import criteria_table

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
        # IQR 0 and a zero singular value: the threshold 0 leaves the 0 as the only noise,
        # and Spectrum would divide by a noise sum of 0.
        (np.diag([1.0, 1.0, 1.0, 1.0, 1.0, 0.0]), ZERO_NOISE),
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


@pytest.mark.parametrize("case", ["mixtral_tiny", "qwen2_moe_tiny"])
def test_an_moes_fused_experts_are_scored_expert_by_expert(case: str) -> None:
    """A 3-D (E, out, in) parameter is E matrices: one row each, ``name[e]``, scored as that
    expert's 2-D weight; Spectrum's score file leaves the experts module out, with the reason
    (one module holds every expert's FC1 and FC2), and scores a shared expert's linears."""
    model = next(t for t in TINY_MODELS if t.id == case).build()
    table = matrix_statistics(model)
    tensors = dict(model.named_parameters())
    fused = [n for n in parameter_map(model).component_names("fc1") if tensors[n].ndim == 3]
    assert fused == ["layers.0.mlp.experts.gate_up_proj", "layers.1.mlp.experts.gate_up_proj"]
    for name in fused:
        stack = tensors[name].detach().double().numpy()
        rows = table.filter(pl.col("parameter").str.starts_with(f"{name}["))
        assert rows["parameter"].to_list() == [f"{name}[{e}]" for e in range(len(stack))]
        for expert, row in enumerate(rows.iter_rows(named=True)):
            assert row["kappa"] == pytest.approx(np.linalg.cond(stack[expert]), rel=1e-9)
            if row["spectrum_snr_reason"] is None:
                assert row["spectrum_snr"] == pytest.approx(
                    _spectrum_reference(stack[expert]), rel=1e-9
                )
    scores, left_out = spectrum_scores(model, table)
    assert left_out["layers.0.mlp.experts"] == FUSED_EXPERTS
    assert not any(".experts" in module for module in scores)
    shared = {m for m in scores if ".shared_expert." in m}
    assert shared == ({
        f"layers.{i}.mlp.shared_expert.{p}_proj" for i in (0, 1) for p in ("gate", "up", "down")
    } - set(left_out) if case == "qwen2_moe_tiny" else set())  # fmt: skip


def test_the_norms_are_na_and_kappa_ranks_lowest_first() -> None:
    model = TINY_VIT.build()
    matrices = matrix_statistics(model)
    for criterion in ("spectrum_snr", "kappa"):
        means = {}
        for component in COMPONENTS:
            values = matrices.filter(matrices["component"] == component)[criterion].to_numpy()
            finite = values[np.isfinite(values)]
            means[component] = finite.mean() if len(finite) else math.nan
            estimate = pooled_estimate(criterion, matrices, (component,))
            assert estimate.value == pytest.approx(means[component], nan_ok=True)
        assert math.isnan(means["ln1"]) and math.isnan(means["ln2"])
        both = pooled_estimate(criterion, matrices, ("mha", "fc1")).value
        rows = matrices.filter(matrices["component"].is_in(["mha", "fc1"]))[criterion].to_numpy()
        assert both == pytest.approx(rows[np.isfinite(rows)].mean())
    assert "kappa" in LOWER_FIRST and "spectrum_snr" not in LOWER_FIRST


def test_an_fc1_of_iid_noise_is_na_for_no_noise_and_the_benchmark_says_so() -> None:
    """FC1 weights of i.i.d. rectangular noise (as a random-init FC1's, e.g. the demo model's)
    leave Spectrum no noise: each matrix is n/a with that reason, FC1's configuration has no
    Spectrum SNR, and the selector benchmark's note and table give that reason for FC1,
    not the norms' (a norm holds no weight matrix)."""
    model = TINY_VIT.build()
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim != 2 or not name.startswith("blocks."):
                continue
            n, m = parameter.shape
            if ".mlp.fc1." in name:
                weight = rng.standard_normal((n, m)) / math.sqrt(max(n, m))
            else:
                weight, _ = _planted(n, m, [6.0, 4.0], seed=int(rng.integers(1000)))
            parameter.copy_(torch.from_numpy(weight))
    matrices = matrix_statistics(model)
    fc1 = matrices.filter(matrices["component"] == "fc1")
    weights = fc1.filter(fc1["parameter"].str.ends_with("weight"))
    assert weights.height and weights["spectrum_snr_reason"].to_list() == [NO_NOISE] * len(weights)
    values = {c: pooled_estimate("spectrum_snr", matrices, (c,)).value for c in COMPONENTS}
    assert [c for c, v in values.items() if math.isnan(v)] == ["ln1", "ln2", "fc1"]

    # Beside it a criterion every configuration has (the table names what one lacks against
    # the others): plasticity, made up.
    plasticity = {c: float(i) for i, c in enumerate(COMPONENTS)}
    datasets = ("d0", "d1", "d2")
    rows = []
    for criterion, value in (("spectrum_snr", values), ("plasticity", plasticity)):
        order = sorted(COMPONENTS, key=lambda c: (math.isnan(value[c]), -np.nan_to_num(value[c])))
        rows += [
            {"model": "vit", "dataset": d, "configuration": c, "criterion": criterion,
             "value": value[c], "rank": order.index(c) + 1}
            for d in datasets
            for c in COMPONENTS
        ]  # fmt: skip
    recommend = pl.DataFrame(rows)
    accuracy = pl.DataFrame(
        [
            {"configuration": c, "dataset": d, "accuracy": 0.5 + 0.1 * i + 0.01 * j}
            for j, d in enumerate(datasets)
            for i, c in enumerate(COMPONENTS)
        ]
    )
    criteria = report_criteria.recommend_criteria(recommend)
    result = report_criteria.score_selectors(criteria, accuracy, experiment="verify")
    spectrum = result.filter(
        (result["level"] == "dataset") & (result["criterion"] == "spectrum_snr")
    )
    for note in spectrum["note"]:
        assert "a norm holds no weight matrix, so it has no Spectrum SNR (ln1, ln2)" in note
        assert f"{REGISTRY['spectrum_snr'].linear_na} (fc1)" in note
    caption = " ".join(criteria_table(result).split())  # the caption's lines joined
    assert "a norm holds no weight matrix, so it has no Spectrum SNR (LN1, LN2);" in caption
    assert "no singular value at or below the Marchenko-Pastur threshold" in caption
    assert "or a zero matrix (recommend/matrix\\_criteria.py) (FC1)" in caption


def test_the_demo_grid_leaves_only_spectrum_snr_unscored_and_why() -> None:
    """The demo preset's SGD grid holds the five components, so each criterion the demo
    model defines for at least three of them is scored by the selector benchmark; Spectrum's
    SNR is defined for MHA alone (its random-init FC1 and FC2 leave no noise), so its rho is
    undefined, with that reason, rather than computed on fewer than three."""
    demo = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    assert set(COMPONENTS) <= set(demo["experiments"]["sgd"]["configurations"])
    entry = demo["models"]["demo_vit"]
    model = build_model(ModelSpec.from_config(entry), num_classes=4)
    matrices = matrix_statistics(model)
    defined = {
        criterion: [
            c for c in COMPONENTS if math.isfinite(pooled_estimate(criterion, matrices, (c,)).value)
        ]
        for criterion in ("spectrum_snr", "kappa")
    }
    assert defined == {"spectrum_snr": ["mha"], "kappa": ["mha", "fc1", "fc2"]}
    mlp = matrices.filter(
        matrices["component"].is_in(["fc1", "fc2"]) & matrices["parameter"].str.ends_with("weight")
    )
    assert set(mlp["spectrum_snr_reason"]) == {NO_NOISE}
