"""``vitplasticity recommend``: each criterion against a direct computation, the ranking and
budget choice, the report, and the command end to end on data the tests make."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F
from mlflow.tracking import MlflowClient

from tests.helpers.images import image_folder, write_reference
from tests.helpers.tiny_vit import TINY_SPEC, TINY_VIT_KWARGS
from vitplasticity.cli import main
from vitplasticity.components import COMPONENTS
from vitplasticity.data.store import PreparedDatasetWriter, encode_png
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.plasticity.measure import measure
from vitplasticity.recommend.criteria import (
    CRITERIA,
    Measurements,
    always_trained_parameters,
    configuration_components,
    pooled_estimate,
    trainable_parameters,
    weight_statistics,
)
from vitplasticity.recommend.gradients import gradient_statistics, head_warmup
from vitplasticity.recommend.ranking import (
    TABLE_SCHEMA,
    Recommendation,
    build_table,
    greedy_union,
    markdown,
    select,
)
from vitplasticity.recommend.settings import parse_budget
from vitplasticity.recommend.verification import check_ranked_model
from vitplasticity.utils.io import read_parquet_metadata
from vitplasticity.utils.tracking import mlflow_uri

NUM_CLASSES = 4
# Block parameter names of each component, written out from timm's names (docs/protocol.md).
COMPONENT_PATTERNS = {
    "ln1": r"blocks\.\d+\.norm1\.",
    "mha": r"blocks\.\d+\.attn\.(qkv|proj)\.",
    "ln2": r"blocks\.\d+\.norm2\.",
    "fc1": r"blocks\.\d+\.mlp\.fc1\.",
    "fc2": r"blocks\.\d+\.mlp\.fc2\.",
}


@pytest.fixture
def vit64() -> torch.nn.Module:
    """The tiny ViT with a 4-class head, in float64, every weight and bias perturbed (so no
    tensor has norm 0 and the gammas differ), in eval mode."""
    torch.manual_seed(0)
    model = build_model(TINY_SPEC, num_classes=NUM_CLASSES).double()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if "norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.5 * noise)
            else:
                parameter.add_(0.05 * noise)
    return model.eval()


def _batches(n: int, size: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn((size, 3, 32, 32), generator=generator, dtype=torch.float64),
            torch.randint(0, NUM_CLASSES, (size,), generator=generator),
        )
        for _ in range(n)
    ]


def _block_names(model: torch.nn.Module) -> list[str]:
    return [n for c in COMPONENTS for n in parameter_map(model).component_names(c)]


# ---------------------------------------------------------------------------------------------
# Gradient criteria


def test_gradient_criteria_equal_numpy_over_autograd_gradients(vit64: torch.nn.Module) -> None:
    batches = _batches(3, 6, seed=1)
    names = _block_names(vit64)
    stats = gradient_statistics(vit64, batches, names)
    assert stats.schema == pl.Schema(
        {
            "parameter": pl.String(),
            "component": pl.String(),
            "block": pl.Int64(),
            "numel": pl.Int64(),
            "weight_norm": pl.Float64(),
            "relative_gradient_norm": pl.Float64(),
            "gradient_snr": pl.Float64(),
            "n_batches": pl.Int64(),
        }
    )
    # Direct: every batch's gradients from a plain autograd call, stacked in numpy.
    reference = copy.deepcopy(vit64)
    params = dict(reference.named_parameters())
    stacked = {name: [] for name in names}
    for images, labels in batches:
        loss = F.cross_entropy(reference(images), labels)
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        for name, grad in zip(names, grads, strict=True):
            stacked[name].append(grad.numpy().ravel())
    rows = {row["parameter"]: row for row in stats.iter_rows(named=True)}
    direct_rgn, direct_snr = {}, {}
    for name in names:
        g = np.stack(stacked[name])  # (B, numel)
        w = params[name].detach().numpy().ravel()
        direct_rgn[name] = np.mean(np.linalg.norm(g, axis=1)) / np.linalg.norm(w)
        mean = g.mean(axis=0)
        noise = np.mean(np.sum((g - mean) ** 2, axis=1))
        direct_snr[name] = np.linalg.norm(mean) / np.sqrt(noise)
        assert rows[name]["relative_gradient_norm"] == pytest.approx(direct_rgn[name], rel=1e-10)
        assert rows[name]["gradient_snr"] == pytest.approx(direct_snr[name], rel=1e-10)
        assert rows[name]["n_batches"] == 3
        assert rows[name]["block"] == int(name.split(".")[1])
    for configuration in ("mha", "ln1", "mha+fc1"):
        parts = configuration_components(configuration)
        members = [n for n in names if any(re.match(COMPONENT_PATTERNS[p], n) for p in parts)]
        for criterion, direct in (
            ("relative_gradient_norm", direct_rgn),
            ("gradient_snr", direct_snr),
        ):
            estimate = pooled_estimate(criterion, stats, parts)
            assert estimate.n_items == len(members)
            assert estimate.value == pytest.approx(np.mean([direct[n] for n in members]), 1e-10)


def test_gradients_are_those_of_the_mean_cross_entropy() -> None:
    """Independent of autograd: central finite differences of the loss, entry by entry, for
    a LayerNorm gamma and a bias; the RGN and SNR of those tensors from them. (An 8-wide,
    one-block ViT: two forward passes per entry.)"""
    spec = dataclasses.replace(
        TINY_SPEC,
        kwargs={"img_size": 32, "patch_size": 16, "embed_dim": 8, "depth": 1, "num_heads": 2},
    )
    torch.manual_seed(0)
    model = build_model(spec, num_classes=NUM_CLASSES).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    batches = _batches(2, 3, seed=2)
    names = ["blocks.0.norm1.weight", "blocks.0.mlp.fc2.bias"]
    stats = gradient_statistics(model, batches, names)
    params = dict(model.named_parameters())
    step = 1e-6
    for name in names:
        parameter = params[name]
        gradients = []
        for images, labels in batches:
            flat = parameter.data.view(-1)
            g = np.empty(flat.numel())
            with torch.no_grad():
                for i in range(flat.numel()):
                    original = flat[i].item()
                    flat[i] = original + step
                    up = F.cross_entropy(model(images), labels).item()
                    flat[i] = original - step
                    down = F.cross_entropy(model(images), labels).item()
                    flat[i] = original
                    g[i] = (up - down) / (2 * step)
            gradients.append(g)
        g = np.stack(gradients)
        w = parameter.detach().numpy().ravel()
        row = stats.filter(pl.col("parameter") == name).row(0, named=True)
        rgn = np.mean(np.linalg.norm(g, axis=1)) / np.linalg.norm(w)
        snr = np.linalg.norm(g.mean(0)) / np.sqrt(np.mean(np.sum((g - g.mean(0)) ** 2, axis=1)))
        assert row["relative_gradient_norm"] == pytest.approx(rgn, rel=1e-6)
        assert row["gradient_snr"] == pytest.approx(snr, rel=1e-6)


def test_gradient_statistics_leave_the_model_as_it_was(vit64: torch.nn.Module) -> None:
    for name, parameter in vit64.named_parameters():
        parameter.requires_grad_(name.startswith("head."))
    before = {k: v.clone() for k, v in vit64.state_dict().items()}
    gradient_statistics(vit64, _batches(2, 2, seed=3), _block_names(vit64))
    assert all(torch.equal(before[k], v) for k, v in vit64.state_dict().items())
    assert {n for n, p in vit64.named_parameters() if p.requires_grad} == {
        "head.weight",
        "head.bias",
    }
    assert all(p.grad is None for p in vit64.parameters())


def test_zero_weight_tensors_are_left_out_of_the_rgn(vit64: torch.nn.Module) -> None:
    with torch.no_grad():
        vit64.blocks[0].attn.qkv.bias.zero_()
    stats = gradient_statistics(vit64, _batches(2, 3, seed=4), _block_names(vit64))
    row = stats.filter(pl.col("parameter") == "blocks.0.attn.qkv.bias").row(0, named=True)
    assert math.isnan(row["relative_gradient_norm"])
    mha = stats.filter(pl.col("component") == "mha")
    finite = mha["relative_gradient_norm"].drop_nans()
    estimate = pooled_estimate("relative_gradient_norm", stats, ("mha",))
    assert estimate.n_items == mha.height - 1
    assert estimate.value == pytest.approx(float(finite.mean()), rel=1e-12)


def test_gradient_statistics_refuse_bad_input(vit64: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="at least 2 batches"):
        gradient_statistics(vit64, _batches(1, 2, seed=0), ["blocks.0.norm1.weight"])
    with pytest.raises(ValueError, match="unknown parameters"):
        gradient_statistics(vit64, _batches(2, 2, seed=0), ["blocks.9.norm1.weight"])
    vit64.train()
    with pytest.raises(ValueError, match="training mode"):
        gradient_statistics(vit64, _batches(2, 2, seed=0), ["blocks.0.norm1.weight"])


def test_head_warmup_moves_the_head_alone_by_sgd(vit64: torch.nn.Module) -> None:
    batches = _batches(3, 5, seed=6)
    lr = 0.1
    # Direct first step: plain SGD on the head (momentum has no effect on the first step)
    # from a full forward pass of a copy.
    reference = copy.deepcopy(vit64)
    images, labels = batches[0]
    loss = F.cross_entropy(reference(images), labels)
    grad_w, grad_b = torch.autograd.grad(loss, [reference.head.weight, reference.head.bias])
    expected_w = reference.head.weight.detach() - lr * grad_w
    expected_b = reference.head.bias.detach() - lr * grad_b

    backbone = {k: v.clone() for k, v in vit64.state_dict().items() if not k.startswith("head.")}
    losses = head_warmup(vit64, batches[:1], lr=lr)
    assert losses == [pytest.approx(loss.item(), rel=1e-12)]
    torch.testing.assert_close(vit64.head.weight.detach(), expected_w, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(vit64.head.bias.detach(), expected_b, rtol=1e-12, atol=1e-14)
    assert all(torch.equal(v, vit64.state_dict()[k]) for k, v in backbone.items())
    # A longer warm-up lowers the loss on batches it trains on.
    losses = head_warmup(vit64, batches * 4, lr=lr)
    assert losses[-1] < losses[0]


# ---------------------------------------------------------------------------------------------
# Weight statistic, plasticity, parameter counts


def test_weight_statistic_equals_numpy_svd(vit64: torch.nn.Module) -> None:
    weights = weight_statistics(vit64)
    w = {k: v.detach().numpy() for k, v in vit64.state_dict().items()}
    heads = vit64.blocks[0].attn.num_heads
    d = w["blocks.0.norm1.weight"].shape[0]
    d_h = d // heads
    direct = {}
    for b in range(len(vit64.blocks)):
        p = f"blocks.{b}"
        direct[(b, "ln1")] = np.abs(w[f"{p}.norm1.weight"]).max()
        direct[(b, "ln2")] = np.abs(w[f"{p}.norm2.weight"]).max()
        for c in ("fc1", "fc2"):
            direct[(b, c)] = np.linalg.svd(w[f"{p}.mlp.{c}.weight"], compute_uv=False)[0]
        qkv, proj = w[f"{p}.attn.qkv.weight"], w[f"{p}.attn.proj.weight"]
        total = 0.0
        for h in range(heads):
            value = qkv[2 * d + h * d_h : 2 * d + (h + 1) * d_h]  # (d_h, d): head h's V rows
            out = proj[:, h * d_h : (h + 1) * d_h]  # (d, d_h): head h's O columns
            total += (
                np.linalg.svd(out, compute_uv=False)[0] * np.linalg.svd(value, compute_uv=False)[0]
            )
        direct[(b, "mha")] = total
    assert weights.height == 3 * 5
    for row in weights.iter_rows(named=True):
        expected = direct[(row["block"], row["component"])]
        assert row["weight_spectral"] == pytest.approx(expected, rel=1e-12)
    estimate = pooled_estimate("weight_spectral", weights, ("ln1", "fc2"))
    pooled = [direct[(b, c)] for b in range(3) for c in ("ln1", "fc2")]
    assert estimate.value == pytest.approx(np.mean(pooled), rel=1e-12)
    assert estimate.ci_low is None and estimate.n_items == 6


def test_plasticity_estimate_equals_numpy_over_the_measured_ratios(
    vit64: torch.nn.Module,
) -> None:
    generator = torch.Generator().manual_seed(8)
    reference = torch.randn((10, 3, 32, 32), generator=generator, dtype=torch.float64)
    downstream = torch.randn((4, 3, 32, 32), generator=generator, dtype=torch.float64)
    pairs = measure(vit64, reference, downstream, n_pairs=10, batch_size=4)
    for configuration in ("mha", "ln2", "mha+fc1", "ln1+ln2+fc2"):
        parts = configuration_components(configuration)
        chosen = pairs.filter(pl.col("component").is_in(list(parts)))
        ratios = chosen["numerator"].to_numpy() / chosen["denominator"].to_numpy()
        assert len(ratios) == 10 * 3 * len(parts)  # pairs x blocks x parts
        mean = ratios.mean()
        half = 1.96 * ratios.std(ddof=1) / np.sqrt(len(ratios))
        estimate = pooled_estimate("plasticity", pairs, parts)
        assert estimate.value == pytest.approx(mean, rel=1e-12)
        assert estimate.ci_low == pytest.approx(mean - half, rel=1e-12)
        assert estimate.ci_high == pytest.approx(mean + half, rel=1e-12)
        assert estimate.n_items == len(ratios)
        # Pooled over equally many ratios per part: the mean of the parts' means.
        part_means = [pooled_estimate("plasticity", pairs, (p,)).value for p in parts]
        assert estimate.value == pytest.approx(np.mean(part_means), rel=1e-12)


def test_trainable_parameters_equal_a_sum_over_named_parameters(vit64: torch.nn.Module) -> None:
    named = dict(vit64.named_parameters())
    always = sum(p.numel() for n, p in named.items() if n.startswith(("head.", "norm.")))
    assert always_trained_parameters(vit64) == always == 48 * 2 + 48 * 4 + 4
    for configuration in ("ln1", "mha", "ln2", "fc1", "fc2", "mha+fc1", "ln1+ln2"):
        parts = configuration.split("+")
        direct = sum(
            p.numel()
            for n, p in named.items()
            if any(re.match(COMPONENT_PATTERNS[part], n) for part in parts)
        )
        assert trainable_parameters(vit64, configuration) == direct
    # By hand: 3 blocks of qkv (144 x 48 + 144) and proj (48 x 48 + 48).
    assert trainable_parameters(vit64, "mha") == 3 * (48 * 144 + 144 + 48 * 48 + 48)


def test_configuration_names_are_checked() -> None:
    assert configuration_components("mha+fc1") == ("mha", "fc1")
    with pytest.raises(ValueError, match="unknown finetuning configuration"):
        configuration_components("attn")
    with pytest.raises(ValueError, match="cannot be ranked"):
        configuration_components("full")
    with pytest.raises(ValueError, match="twice"):
        configuration_components("mha+mha")


# ---------------------------------------------------------------------------------------------
# Ranking, budget, report


def test_parse_budget() -> None:
    assert parse_budget("28K") == 28_000
    assert parse_budget("28k") == 28_000
    assert parse_budget("1.5M") == 1_500_000
    assert parse_budget("1.1M") == 1_100_000
    assert parse_budget("2G") == 2_000_000_000
    assert parse_budget(" 400000 ") == 400_000
    assert parse_budget(12) == 12
    assert parse_budget("0") == 0
    assert parse_budget(None) is None and parse_budget("none") is None
    for bad in ("lots", "-5", "1.2345K", "0.5", "5X", "1e6", "K"):
        with pytest.raises(ValueError, match="budget"):
            parse_budget(bad)
    with pytest.raises(ValueError, match=">= 0"):
        parse_budget(-1)


def _measurements(values: dict[str, float], parameters: dict[str, int]) -> Measurements:
    """Measurements whose plasticity of component c is exactly values[c] (one ratio per block
    and pair, constant), and equally simple other criteria."""
    pairs = pl.DataFrame(
        [
            {"component": c, "block": b, "pair": p, "ratio": values[c]}
            for c in COMPONENTS
            for b in range(2)
            for p in range(3)
        ]
    )
    tensors = pl.DataFrame(
        [
            {"component": c, "relative_gradient_norm": -values[c], "gradient_snr": 1.0}
            for c in COMPONENTS
        ]
    )
    weights = pl.DataFrame(
        [{"component": c, "weight_spectral": float(i)} for i, c in enumerate(COMPONENTS)]
    )
    features = pl.DataFrame(  # NFN: one map per linear component, none for the norms
        [{"component": c, "nfn": values[c]} for c in ("mha", "fc1", "fc2")]
    )
    return Measurements(
        pairs, tensors, weights, dict(parameters), always_trained=7, features=features
    )


PARAMETERS = {"ln1": 10, "mha": 100, "ln2": 10, "fc1": 50, "fc2": 50}


def test_table_ranks_each_criterion_and_has_the_fixed_schema() -> None:
    values = {"ln1": 1.0, "mha": 3.0, "ln2": 1.0, "fc1": 2.0, "fc2": float("nan")}
    configurations = ["fc2", "ln2", "ln1", "fc1", "mha", "mha+fc1"]
    table = build_table(_measurements(values, PARAMETERS), configurations, model="m", dataset="d")
    assert table.schema == pl.Schema(TABLE_SCHEMA)
    assert table.height == len(configurations) * len(CRITERIA)
    ranks = dict(
        table.filter(pl.col("criterion") == "plasticity").select("configuration", "rank").rows()
    )
    # mha 3 > mha+fc1 2.5 > fc1 2 > ln2 = ln1 = 1 (tie: same parameters, given order) > fc2 NaN.
    assert ranks == {"mha": 1, "mha+fc1": 2, "fc1": 3, "ln2": 4, "ln1": 5, "fc2": 6}
    row = table.filter(
        (pl.col("criterion") == "plasticity") & (pl.col("configuration") == "mha+fc1")
    ).row(0, named=True)
    assert row["trainable_parameters"] == 150 and row["value"] == pytest.approx(2.5)
    assert row["ci_low"] == pytest.approx(
        2.5 - 1.96 * np.std([3.0] * 6 + [2.0] * 6, ddof=1) / 12**0.5
    )
    rgn = table.filter(pl.col("criterion") == "relative_gradient_norm")
    assert rgn["ci_low"].is_null().all()
    snr = dict(
        table.filter(pl.col("criterion") == "gradient_snr").select("configuration", "rank").rows()
    )
    # Equal SNR everywhere: fewer trainable parameters first, then the given order.
    assert snr == {"ln2": 1, "ln1": 2, "fc2": 3, "fc1": 4, "mha": 5, "mha+fc1": 6}
    with pytest.raises(ValueError, match="twice"):
        build_table(_measurements(values, PARAMETERS), ["mha", "mha"], model="m", dataset="d")


def test_select_under_a_budget() -> None:
    values = {"ln1": 1.0, "mha": 3.0, "ln2": 0.5, "fc1": 2.0, "fc2": float("nan")}
    configurations = ["ln1", "mha", "ln2", "fc1", "fc2", "mha+fc1"]
    table = build_table(_measurements(values, PARAMETERS), configurations, model="m", dataset="d")
    assert select(table, "plasticity", None) == Recommendation("mha", "plasticity", None, 100)
    assert select(table, "plasticity", 100).configuration == "mha"
    assert select(table, "plasticity", 99).configuration == "fc1"
    assert select(table, "plasticity", 49).configuration == "ln1"
    assert select(table, "plasticity", 9) == Recommendation(None, "plasticity", 9, None)
    # Another criterion: the weight statistic grows with the component's index.
    assert select(table, "weight_spectral", 60).configuration == "fc2"
    with pytest.raises(ValueError, match="unknown criterion"):
        select(table, "loss", None)


def test_greedy_union() -> None:
    values = {"ln1": 1.0, "mha": 3.0, "ln2": 0.5, "fc1": 2.0, "fc2": float("nan")}
    # mha (100) does not fit 65; fc1 (50) does, then ln1 (10); ln2 would make 70; fc2 is NaN.
    union = greedy_union(values, PARAMETERS, 65, "plasticity")
    assert union == Recommendation("ln1+fc1", "plasticity", 65, 60, combined=True)
    assert greedy_union(values, PARAMETERS, 1000, "plasticity").configuration == "ln1+mha+ln2+fc1"
    assert greedy_union(values, PARAMETERS, 5, "plasticity").configuration is None


def test_markdown_holds_the_ranked_table_and_the_recommendation() -> None:
    values = {"ln1": 1.0, "mha": 3.0, "ln2": 0.5, "fc1": 2.0, "fc2": 0.1}
    table = build_table(
        _measurements(values, PARAMETERS), ["ln1", "mha", "fc1", "mha+fc1"], model="m", dataset="d"
    )
    recommendation = select(table, "plasticity", 60)
    text = markdown(
        table,
        recommendation,
        model="vit_x",
        dataset="pets",
        reference="`ref.parquet`",
        always_trained=7,
        demo=True,
        demo_note="DEMO: not a result",
    )
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| rank |"))
    assert "plasticity" in lines[header] and "gradient SNR" in lines[header]
    body = lines[header + 2 : header + 6]
    assert [line.split("|")[2].strip() for line in body] == ["MHA", "MHA+FC1", "FC1", "LN1"]
    assert body[0].startswith("| 1 | MHA | 100 | 3 [3, 3] (1) |")
    assert "**Recommendation: finetune FC1**" in text
    assert "DEMO: not a result" in text and "heuristic" in text and "vit_x on pets" in text
    none = markdown(
        table,
        select(table, "plasticity", 5),
        model="vit_x",
        dataset="pets",
        reference="r",
        always_trained=7,
    )
    assert "No configuration fits the budget of 5" in none and "DEMO" not in none


# ---------------------------------------------------------------------------------------------
# The command end to end


def _model_args() -> list[str]:
    return [
        "--timm-id",
        "vit_tiny_patch16_224",
        "--weights",
        "random",
        "--model-kwargs",
        json.dumps(TINY_VIT_KWARGS),
        "--model",
        "tiny",
    ]


FAST = ["--batch-size", "4", "--batches", "2", "--warmup-steps", "2", "--device", "cpu"]


def test_cli_on_an_image_folder(tmp_path: Path) -> None:
    folder = image_folder(tmp_path / "pets")
    prefix = tmp_path / "out" / "tiny" / "pets"
    argv = [
        "recommend",
        *_model_args(),
        "--image-folder",
        str(folder),
        "--reference-fallback",
        "synthetic",
        "--n-pairs",
        "8",
        *FAST,
        "--budget",
        "10K",
        "--demo",
        "--out-prefix",
        str(prefix),
    ]
    assert main(argv) == 0
    files = sorted(p.name for p in prefix.parent.iterdir())
    assert files == ["pets.json", "pets.md", "pets.parquet", "pets.pdf", "pets.png"]
    table = pl.read_parquet(f"{prefix}.parquet")
    assert table.schema == pl.Schema(TABLE_SCHEMA)
    assert table.height == 8 * len(CRITERIA)  # the default configurations x the criteria
    assert set(table["model"]) == {"tiny"} and set(table["dataset"]) == {"pets"}
    for criterion in CRITERIA:
        ranks = table.filter(pl.col("criterion") == criterion)["rank"].sort().to_list()
        assert ranks == list(range(1, 9))
    plasticity = table.filter(pl.col("criterion") == "plasticity")
    assert (plasticity["ci_low"] < plasticity["value"]).all()
    assert table.filter(pl.col("criterion") != "plasticity")["ci_low"].is_null().all()
    meta = read_parquet_metadata(f"{prefix}.parquet")
    assert meta["demo"] is True and "fallback `synthetic`" in meta["reference"]
    assert meta["provenance"]["settings"]["n_pairs"] == 8
    # The footer names the model ranked as recommend-verify reads it: this one, not another.
    spec = {"timm_id": "vit_tiny_patch16_224", "weights": "random", "kwargs": TINY_VIT_KWARGS}
    check_ranked_model(f"{prefix}.parquet", "tiny", spec)
    with pytest.raises(ValueError, match="--model-spec: not the model"):
        check_ranked_model(f"{prefix}.parquet", "tiny", {**spec, "init_seed": 1})
    chosen = meta["recommendation"]["configuration"]
    assert meta["recommendation"]["trainable_parameters"] <= 10_000
    text = (prefix.parent / "pets.md").read_text()
    assert "| rank | configuration |" in text and "DEMO" in text
    assert f"**Recommendation: finetune {chosen.upper()}**" in text
    assert not list(prefix.parent.glob(".*")), "no temporary file left behind"


def test_cli_on_a_prepared_dataset_with_a_reference_and_combine(
    tmp_path: Path, demo_dataset: Path
) -> None:
    reference = tmp_path / "reference.parquet"
    write_reference(reference, 6, seed=1, size=(32, 32), name_prefix="")
    prefix = tmp_path / "combined"
    argv = [
        "recommend",
        "--model-spec",
        json.dumps(dataclasses.asdict(TINY_SPEC)),
        "--dataset-dir",
        str(demo_dataset),
        "--reference",
        str(reference),
        "--n-pairs",
        "6",
        *FAST,
        "--configurations",
        "mha",
        "fc1",
        "--budget",
        "30000",
        "--combine",
        "--criterion",
        "weight_spectral",
        "--out-prefix",
        str(prefix),
        # The recommendation goes to a tracker too (docs/configuration.md).
        "--tracking-backend",
        "mlflow",
        "--tracking-mlflow-tracking-uri",
        str(tmp_path / "mlruns"),
    ]
    assert main(argv) == 0
    meta = read_parquet_metadata(f"{prefix}.parquet")
    recommendation = meta["recommendation"]
    client = MlflowClient(tracking_uri=mlflow_uri(str(tmp_path / "mlruns")))
    [tracked] = client.search_runs([client.get_experiment_by_name("vitplasticity").experiment_id])
    assert tracked.info.run_name == f"recommend/{meta['model']}/demo-stripes"
    logged = tracked.data.metrics
    assert (
        logged["summary/recommendation.trainable_parameters"]
        == (recommendation["trainable_parameters"])
    )
    for row in pl.read_parquet(f"{prefix}.parquet").iter_rows(named=True):
        # MLflow names take no "+": a union mha+fc1 is logged as mha_fc1.
        configuration = row["configuration"].replace("+", "_")
        key = f"summary/{configuration}/{row['criterion']}/value"
        if row["value"] is None or not math.isfinite(row["value"]):
            assert key not in logged, key  # MLflow takes finite numbers only
        else:
            assert logged[key] == row["value"], key
    assert recommendation["combined"] is True and recommendation["criterion"] == "weight_spectral"
    union = recommendation["configuration"]
    table = pl.read_parquet(f"{prefix}.parquet")
    # The union is added to the table when it is not one of --configurations.
    assert set(table["configuration"]) == {"mha", "fc1"} | {union}
    assert recommendation["trainable_parameters"] <= 30_000
    params = dict(
        table.filter(pl.col("criterion") == "plasticity")
        .select("configuration", "trainable_parameters")
        .rows()
    )
    assert params["mha"] == 3 * (48 * 144 + 144 + 48 * 48 + 48)
    assert meta["dataset"] == "demo-stripes" and meta["demo"] is False
    assert "DEMO" not in Path(f"{prefix}.md").read_text()


TINY_CONVNEXT = {"depths": [1, 1, 1, 1], "dims": [8, 16, 32, 64]}
"""A model no architecture knows: refused by name before any compute."""


def _empty_test_dataset(root: Path) -> Path:
    png = encode_png(np.zeros((32, 32, 3), dtype=np.uint8))
    with PreparedDatasetWriter(root) as writer:
        writer.add_split("pool", [png, png], [0, 1], ["a.png", "b.png"])
        writer.add_split("test", [], [], [])
        writer.finish({"name": "empty", "num_classes": 2})
    return root


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--configurations", "mha", "attn"], "--configurations: unknown finetuning"),
        (["--configurations", "full"], "cannot be ranked"),
        (["--configurations", "mha", "mha"], "named twice"),
        (["--budget", "lots"], "--budget (recommend.budget): budget 'lots'"),
        (["--combine"], "--combine needs --budget"),
        (["--batches", "1"], "--batches (recommend.batches): must be >= 2"),
        (["--n-pairs", "0"], "--n-pairs (recommend.n_pairs): must be >= 1"),
        (["--warmup-lr", "0"], "--warmup-lr (recommend.warmup_lr): must be > 0"),
        (["--reference", "missing.parquet"], "--reference / --reference-fallback: give exactly"),
        (["--dataset-dir", "EMPTY"], "split 'test' holds no images"),
        (["--n-pairs", "50"], "fewer than --n-pairs 50"),
        (
            ["--timm-id", "convnext_atto", "--model-kwargs", json.dumps(TINY_CONVNEXT)],
            "ConvNeXt (timm.models.convnext): no vitplasticity architecture knows this model "
            "class; known families: timm_vit",
        ),
    ],
)
def test_bad_input_is_refused_before_writing(
    tmp_path: Path, change: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = image_folder(tmp_path / "pets", per_class=3)
    argv = ["recommend", *_model_args(), "--reference-fallback", "pool", "--n-pairs", "4", *FAST]
    argv += ["--out-prefix", str(tmp_path / "out" / "x")]
    if "--dataset-dir" in change:
        change = ["--dataset-dir", str(_empty_test_dataset(tmp_path / "empty"))]
    else:
        argv += ["--image-folder", str(folder)]
    with caplog.at_level(logging.ERROR):
        assert main(argv + change) == 2
    assert message in caplog.text
    assert not (tmp_path / "out").exists()


def test_a_family_refusal_stops_recommend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A family that refuses the recommend stage is refused by name before any compute."""
    from vitplasticity.models.architectures import registry
    from vitplasticity.models.architectures.timm_vit import TimmVisionTransformer

    class RefusingViT(TimmVisionTransformer):
        name = "refusing_vit"

        def refusal(self, stage: str, model: torch.nn.Module) -> str | None:
            return "no ranking here, for the test" if stage == "recommend" else None

    families = {"refusing_vit": RefusingViT(), **registry.ARCHITECTURES}
    monkeypatch.setattr(registry, "ARCHITECTURES", families)
    folder = image_folder(tmp_path / "pets", per_class=3)
    argv = ["recommend", *_model_args(), "--reference-fallback", "pool", "--n-pairs", "4", *FAST]
    argv += ["--image-folder", str(folder), "--out-prefix", str(tmp_path / "out" / "x")]
    with caplog.at_level(logging.ERROR):
        assert main(argv) == 2
    assert "recommend vit_tiny_patch16_224: no ranking here, for the test" in caplog.text
    assert not (tmp_path / "out").exists()


def test_every_recommend_criterion_pools_a_column_of_a_measurements_field() -> None:
    """The registry names each criterion's items by the field of Measurements and the column
    they are measured in: both must exist (the schemas of what measures them)."""
    from vitplasticity.criteria import REGISTRY
    from vitplasticity.plasticity.measure import PAIR_SCHEMA
    from vitplasticity.recommend.criteria import WEIGHT_SCHEMA
    from vitplasticity.recommend.gradients import TENSOR_SCHEMA
    from vitplasticity.recommend.matrix_criteria import MATRIX_SCHEMA
    from vitplasticity.recommend.nfn import NFN_SCHEMA

    columns = {
        "pairs": PAIR_SCHEMA,
        "tensors": TENSOR_SCHEMA,
        "weights": WEIGHT_SCHEMA,
        "features": NFN_SCHEMA,
        "matrices": MATRIX_SCHEMA,
    }
    assert set(columns) == {f.name for f in dataclasses.fields(Measurements)} - {
        "component_parameters",
        "always_trained",
    }
    for criterion in CRITERIA:
        items = REGISTRY[criterion].items
        assert items is not None and items.column in columns[items.measured], criterion
