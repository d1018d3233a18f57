"""The bounds beyond the paper's timm ViT: each family's components come from the architecture
registry; where the paper's bound is not defined (MHA with rotary positions, with normalised
queries and keys, with a relative position bias) the component is refused by name, and the
bounds that are defined still hold.

The stage tests (``bounds`` CLI on tiny DINOv3, EVA-02, rope ViT and qk-norm ViT specs) failed
before the registry: the Eva models crashed with ``TypeError: 'NoneType' object is not
callable`` and the qk-norm ViT got an MHA bound for attention the bound does not cover.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from torch import nn

from tests.helpers.images import write_reference
from tests.helpers.tiny_models import TINY_MODELS, perturbed
from vitplasticity.models.architectures import architecture_for

TINY = {"embed_dim": 48, "depth": 2, "num_heads": 3}

STAGE_CASES = {
    # name: (timm id, kwargs, what the MHA refusal says)
    "dinov3": ("vit_small_patch16_dinov3", {"img_size": 32, **TINY}, "rotary position"),
    "eva02": ("eva02_tiny_patch14_224", {"img_size": 28, **TINY}, "rotary position"),
    "rope_vit": ("vit_base_patch16_rope_reg1_gap_256", {"img_size": 32, **TINY}, "rotary position"),
    "vit_qk_norm": (
        "vit_tiny_patch16_224",
        {"img_size": 32, "patch_size": 8, "qk_norm": True, **TINY},
        "q_norm is LayerNorm",
    ),
}


def _first_block_inputs(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """What the model's own forward pass feeds its first block (the embedding output)."""
    seen: list[torch.Tensor] = []
    handle = model.blocks[0].register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    try:
        with torch.no_grad():
            model(images)
    finally:
        handle.remove()
    return seen[0]


def _fc_weights(block: nn.Module) -> dict[str, np.ndarray]:
    """FC1 (gate and up stacked along rows for a SwiGLU) and FC2 weights, read by name."""
    mlp = block.mlp
    if hasattr(mlp, "fc1_g"):
        fc1 = torch.cat([mlp.fc1_g.weight, mlp.fc1_x.weight])
    else:
        fc1 = mlp.fc1.weight
    return {"fc1": fc1.detach().double().numpy(), "fc2": mlp.fc2.weight.detach().double().numpy()}


def _direct_ln_fc_bounds(model: nn.Module, tokens: np.ndarray) -> dict[tuple[int, str], float]:
    """(block, component) -> LayerNorm and linear bound, in numpy float64."""
    variance = tokens.reshape(-1, tokens.shape[-1]).var(axis=1).min()
    found = {}
    for b, block in enumerate(model.blocks):
        for component, norm in (("ln1", block.norm1), ("ln2", block.norm2)):
            gamma = norm.weight.detach().double().numpy()
            found[(b, component)] = np.abs(gamma).max() / np.sqrt(variance + norm.eps)
        for component, weight in _fc_weights(block).items():
            found[(b, component)] = np.linalg.norm(weight, ord=2)
    return found


@pytest.mark.parametrize("case", list(STAGE_CASES))
def test_bounds_stage_refuses_mha_by_name(case: str, tmp_path: Path, caplog) -> None:
    from vitplasticity.cli import main
    from vitplasticity.data.transforms import eval_batches
    from vitplasticity.models.build import build_model, preprocessing
    from vitplasticity.models.spec import ModelSpec
    from vitplasticity.utils.io import read_parquet_metadata

    timm_id, kwargs, reason = STAGE_CASES[case]
    reference = tmp_path / "reference.parquet"
    write_reference(reference, 12, seed=5)
    spec = {"timm_id": timm_id, "weights": "random", "kwargs": kwargs}
    out, prefix = tmp_path / "bounds" / f"{case}.parquet", tmp_path / f"bounds_{case}"
    argv = ["bounds", "--model", case, "--model-spec", json.dumps(spec)]
    argv += ["--reference", str(reference), "--n-images", "10", "--batch-size", "4"]
    argv += ["--device", "cpu", "--out", str(out), "--figure-prefix", str(prefix)]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0

    table = pl.read_parquet(out)
    assert set(table["component"]) == {"ln1", "ln2", "fc1", "fc2"}  # no MHA rows
    assert table.height == TINY["depth"] * 4
    undefined = read_parquet_metadata(out)["undefined"]
    assert list(undefined) == ["mha"] and reason in undefined["mha"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and reason in r.message]
    assert len(warnings) == 1, "the refusal is logged once, not per block"
    assert any(reason in r.message and r.levelno == logging.INFO for r in caplog.records)

    # The LN and FC bounds equal a direct computation on the embedding outputs that the
    # model's own forward pass feeds its first block (same spec: the same random init).
    model_spec = ModelSpec.from_config(spec)
    model = build_model(model_spec, num_classes=0).eval().double()
    images = pl.read_parquet(reference)["image"].to_list()[:10]
    batch = torch.cat(list(eval_batches(images, preprocessing(model, model_spec), 64)))
    expected = _direct_ln_fc_bounds(model, _first_block_inputs(model, batch.double()).numpy())
    for row in table.iter_rows(named=True):
        assert row["bound"] == pytest.approx(expected[(row["block"], row["component"])], rel=1e-10)

    # The figure command the workflow runs draws the four panels and says why MHA has none.
    svg = tmp_path / f"bounds_{case}.svg"
    assert main(["figure", "--kind", "bounds", "--inputs", str(out), "--out", str(svg)]) == 0
    text = svg.read_text()
    assert "No bound for MHA:" in text
    assert reason.split()[0] in text
    for name in ("LN1", "LN2", "FC1", "FC2"):
        assert name in text
    for suffix in ("pdf", "png"):  # the bounds command's own figure
        assert Path(f"{prefix}.{suffix}").stat().st_size > 1000


def test_refused_before_any_image_is_decoded(tmp_path: Path, monkeypatch) -> None:
    """A family that refuses the stage, and a model no family knows, are named before the
    reference images are decoded (the images here cannot be decoded at all)."""
    from vitplasticity.models.architectures import registry
    from vitplasticity.models.architectures.base import UndefinedStage, UnsupportedModel
    from vitplasticity.models.architectures.timm_vit import TimmVisionTransformer
    from vitplasticity.plasticity.bounds import model_bounds
    from vitplasticity.plasticity.settings import BoundsSettings

    class NoBounds(TimmVisionTransformer):
        name, title = "no_bounds", "a family without bounds"

        def refusal(self, stage: str, model: nn.Module) -> str | None:
            return "no bounds in this family" if stage == "bounds" else None

    reference = tmp_path / "reference.parquet"
    write_reference(reference, 3, seed=5, broken=True)
    vit = {"timm_id": "vit_tiny_patch16_224", "weights": "random"}
    vit["kwargs"] = {"img_size": 32, "patch_size": 8, **TINY}
    monkeypatch.setattr(
        registry, "ARCHITECTURES", {"no_bounds": NoBounds(), **registry.ARCHITECTURES}
    )
    with pytest.raises(
        UndefinedStage, match=r"VisionTransformer \(a family without bounds\).*no bounds"
    ):
        model_bounds("vit", vit, reference, BoundsSettings(n_images=3, device="cpu"))
    monkeypatch.undo()
    convnext = {"timm_id": "convnext_atto", "weights": "random", "kwargs": {"depths": (1, 1, 1, 1)}}
    with pytest.raises(UnsupportedModel, match="ConvNeXt"):
        model_bounds("convnext", convnext, reference, BoundsSettings(n_images=3, device="cpu"))


# ---------------------------------------------------------------------------------------------
# The weight statistic of recommend, per component through the registry


def _tiny(model_id: str) -> nn.Module:
    (tiny,) = [t for t in TINY_MODELS if t.id == model_id]
    return perturbed(tiny.build())


def _head_norms_sum(qkv: np.ndarray, proj: np.ndarray, heads: int) -> float:
    """sum_h ||O^h||_2 ||V^h||_2 of a fused qkv weight (q, k, v along rows), in numpy."""
    d_h = qkv.shape[0] // (3 * heads)
    value = qkv[2 * heads * d_h :]
    return sum(
        np.linalg.norm(proj[:, h * d_h : (h + 1) * d_h], ord=2)
        * np.linalg.norm(value[h * d_h : (h + 1) * d_h], ord=2)
        for h in range(heads)
    )


@pytest.mark.parametrize("model_id", ["vit_small_plus_patch16_dinov3", "eva02_tiny_patch14_224"])
def test_weight_statistic_of_gated_rope_models(model_id: str) -> None:
    """FC1 of a gated MLP is the stacked [W_gate; W_up] (SwiGLU) or the packed fc1 (GluMlp);
    MHA keeps its value-output factor under rotary positions (they act on q and k only)."""
    from vitplasticity.recommend.criteria import weight_statistics

    model = _tiny(model_id)
    weights = weight_statistics(model)
    assert weights.height == len(model.blocks) * 5
    for row in weights.iter_rows(named=True):
        block = model.blocks[row["block"]]
        component = row["component"]
        if component in ("ln1", "ln2"):
            norm = block.norm1 if component == "ln1" else block.norm2
            expected = norm.weight.detach().abs().max().item()
        elif component in ("fc1", "fc2"):
            expected = np.linalg.norm(_fc_weights(block)[component], ord=2)
        else:
            qkv = block.attn.qkv.weight.detach().numpy()
            expected = _head_norms_sum(qkv, block.attn.proj.weight.detach().numpy(), 3)
        assert row["weight_spectral"] == pytest.approx(expected, rel=1e-12), row


def test_weight_statistic_refuses_normalised_attention(caplog) -> None:
    """MHA with q/k norms: NaN rows, one warning naming why, and every configuration that
    contains MHA is n/a rather than the mean of its other components."""
    import timm

    from vitplasticity.recommend.criteria import pooled_estimate, weight_statistics

    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=32, patch_size=8, qk_norm=True, num_classes=0, **TINY
    )
    model = perturbed(model)
    with caplog.at_level(logging.WARNING):
        weights = weight_statistics(model)
    mha = weights.filter(pl.col("component") == "mha")["weight_spectral"].to_numpy()
    assert mha.shape == (2,) and np.isnan(mha).all()
    others = weights.filter(pl.col("component") != "mha")["weight_spectral"].to_numpy()
    assert np.isfinite(others).all()
    assert [r.message for r in caplog.records if "q_norm" in r.message].__len__() == 1
    assert math.isnan(pooled_estimate("weight_spectral", weights, ("mha", "fc1")).value)
    assert math.isfinite(pooled_estimate("weight_spectral", weights, ("fc1",)).value)


# ---------------------------------------------------------------------------------------------
# The bounds hold where they are defined


def _zero_query_bias(model: nn.Module) -> None:
    """The paper's attention bound is for bias-free attention; of the biases only the query's
    does not cancel (vitplasticity.plasticity.upper_bounds), so it is zeroed where the bound is checked."""
    with torch.no_grad():
        for block in model.blocks:
            attention = block.attn
            if getattr(attention, "q_bias", None) is not None:
                attention.q_bias.zero_()
            elif getattr(attention.qkv, "bias", None) is not None:
                attention.qkv.bias[: attention.qkv.out_features // 3] = 0.0


def _measured_worst(model: nn.Module, ref: torch.Tensor, down: torch.Tensor) -> pl.DataFrame:
    """Largest embedding-protocol ratio ||f(x) - f(y)||_F / ||x - y||_F per (block, component)
    (the components' outputs from the architecture, their parts concatenated), and the
    embedding tokens of both image sets."""
    architecture = architecture_for(model)
    with torch.no_grad():
        x, y = architecture.embed(model, ref), architecture.embed(model, down)
        difference = (x.tokens - y.tokens).flatten(1).norm(dim=1)
        rows = []
        for index, block in enumerate(architecture.blocks(model)):
            outputs = zip(
                architecture.embedding_outputs(block, index, x),
                architecture.embedding_outputs(block, index, y),
                strict=True,
            )
            for component, (fx, fy) in zip(architecture.components(block), outputs, strict=True):
                change = torch.cat([(a - b).flatten(1) for a, b in zip(fx, fy, strict=True)], 1)
                worst = (change.norm(dim=1) / difference).max().item()
                rows.append({"block": index, "component": component, "worst": worst})
    return pl.DataFrame(rows), torch.cat([x.tokens, y.tokens])


BOUND_HOLDS = [
    # model id, the components whose bound is refused
    ("vit_small_patch16_dinov3", {"mha"}),
    ("vit_small_plus_patch16_dinov3", {"mha"}),  # SwiGLU: FC1 = [W_gate; W_up]
    ("eva02_tiny_patch14_224", {"mha"}),  # packed GluMlp; FC2 on zero-padded tokens
    ("vit_base_patch16_rope_reg1_gap_256", {"mha"}),
    ("deit3_small_patch16_224", set()),  # LayerScale
    ("vit_small_patch14_reg4_dinov2", set()),  # LayerScale, register tokens
    ("vit_base_patch16_siglip_224", set()),  # attention-pooling head
    ("beit_base_patch16_224", {"mha"}),  # relative position bias
]


@pytest.mark.parametrize(("model_id", "refused"), BOUND_HOLDS)
def test_measured_plasticity_below_bounds(model_id: str, refused: set[str]) -> None:
    from vitplasticity.plasticity.upper_bounds import undefined_bounds, upper_bounds

    (tiny,) = [t for t in TINY_MODELS if t.id == model_id]
    model = perturbed(tiny.build())
    _zero_query_bias(model)
    assert set(undefined_bounds(model)) == refused
    ref, down = tiny.inputs(6).double(), tiny.inputs(7)[1:].double()
    near = ref + 1e-3 * tiny.inputs(8)[2:].double()  # close pairs probe the local slope
    for other in (down, near):
        measured, tokens = _measured_worst(model, ref, other)
        bounds = upper_bounds(model, tokens)  # both images of every pair are in the set
        assert set(bounds["component"]) == {"ln1", "mha", "ln2", "fc1", "fc2"} - refused
        joined = measured.join(bounds, on=["block", "component"])
        assert joined.height == bounds.height == len(model.blocks) * (5 - len(refused))
        violations = joined.filter(pl.col("worst") > pl.col("bound"))
        assert violations.height == 0, violations
        mha = joined.filter(pl.col("component") == "mha")
        assert (mha["worst"] <= mha["bound_energy"]).all(), mha


# ---------------------------------------------------------------------------------------------
# The workflow with a DINOv3 model in plasticity.models

DINOV3_CONFIG = """\
models:
  demo_dinov3:
    family: timm
    timm_id: vit_small_patch16_dinov3
    weights: random
    normalize: pretrained
    kwargs: {img_size: 32, embed_dim: 48, depth: 2, num_heads: 3}
plasticity:
  models: [demo_vit, demo_dinov3]
"""


@pytest.mark.slow
def test_workflow_bounds_of_a_dinov3_model(tmp_path: Path) -> None:
    """The bounds job and its figure on the mini preset with a DINOv3 model (the bounds job
    crashed with a TypeError before): LN and FC rows beside the measured plasticity, the MHA
    refusal in the footer and the figure."""
    from tests.helpers.workflow import snakemake
    from vitplasticity.utils.io import read_parquet_metadata

    extra = tmp_path / "dinov3.yaml"
    # SVG: the figure's text can be read back.
    extra.write_text(DINOV3_CONFIG + "report:\n  figures:\n    formats: [png, svg]\n")
    workdir = tmp_path / "run"
    results = workdir / "results/demo"
    targets = ["bounds/demo_dinov3.parquet", "figures/bounds_demo_dinov3.svg"]
    result = snakemake(workdir, *(f"results/demo/{t}" for t in targets), extra_configfiles=(extra,))
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]

    table = pl.read_parquet(results / targets[0])
    assert set(table["component"]) == {"ln1", "ln2", "fc1", "fc2"}
    assert table.height == 2 * 4 and table["measured_mean"].is_not_null().all()
    assert (table["measured_max"] <= table["bound"]).all()
    assert "rotary position" in read_parquet_metadata(results / targets[0])["undefined"]["mha"]
    svg = (results / targets[1]).read_text()
    assert "No bound for MHA:" in svg and "Eva rotates" in svg
