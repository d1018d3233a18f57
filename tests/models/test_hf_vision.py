"""The transformers vision families beyond the shared contract (tests/models/test_architectures.py):
plasticity on every tiny tower in both protocols, DINOv2 (plain and SwiGLU) against a float64
computation written here from the state dict, the parameter groups, the per-head attention
weights of the MHA bound, and the stages and models refused by name."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from scipy.special import erf, expit

from tests.helpers.contract import check_contract
from tests.helpers.numpy_reference import embedding_protocol, layer_norm, norm_ratio, softmax_rows
from tests.helpers.tiny_models import (
    HF_VISION_TINY_CONFIG,
    HF_VISION_TINY_MODELS,
    TinyModel,
    perturbed,
)
from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import (
    ParameterMap,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.plasticity.measure import measure

transformers = pytest.importorskip("transformers")

RTOL = 1e-6  # float64 model against float64 numpy


def _case(case_id: str) -> TinyModel:
    return next(case for case in HF_VISION_TINY_MODELS if case.id == case_id)


def _tiny(case_id: str) -> torch.nn.Module:
    return perturbed(_case(case_id).build())


def _images(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((n, 3, 32, 32), generator=generator, dtype=torch.float64)


def _config(config_class: str, **config) -> object:
    return getattr(transformers, config_class)(**{**HF_VISION_TINY_CONFIG, **config})


# --- plasticity on every family ----------------------------------------------------------------


@pytest.mark.parametrize("case", HF_VISION_TINY_MODELS, ids=lambda case: case.id)
def test_plasticity_runs_in_both_protocols(case: TinyModel) -> None:
    model = perturbed(case.build())
    reference, downstream = _images(3, seed=1), _images(2, seed=2)
    frames = {
        protocol: measure(model, reference, downstream, protocol=protocol, batch_size=2)
        for protocol in ("embedding", "in_situ")
    }
    for frame in frames.values():
        assert frame.height == 2 * len(COMPONENTS) * 3
        assert np.isfinite(frame["ratio"].to_numpy()).all()
        assert (frame["ratio"].to_numpy() > 0).all()
    # In situ, MHA is fed LN1's very output: its denominator is LN1's numerator. CLIP's and
    # SigLIP's blocks pass their attention the tokens by keyword: the hook must find them.
    in_situ = frames["in_situ"]
    ln1 = in_situ.filter(pl.col("component") == "ln1").sort("block", "pair")
    mha = in_situ.filter(pl.col("component") == "mha").sort("block", "pair")
    np.testing.assert_array_equal(mha["denominator"].to_numpy(), ln1["numerator"].to_numpy())


@pytest.mark.parametrize(
    ("model_class", "config_class", "config"),
    [
        (
            "CLIPForImageClassification",
            "CLIPConfig",
            {"vision_config": {**HF_VISION_TINY_CONFIG, "intermediate_size": 96}},
        ),
        (
            "SiglipForImageClassification",
            "SiglipConfig",
            {"vision_config": {**HF_VISION_TINY_CONFIG, "intermediate_size": 96}},
        ),
    ],
)
def test_classification_wrappers_keep_the_contract(
    model_class: str, config_class: str, config: dict
) -> None:
    torch.manual_seed(0)
    configuration = getattr(transformers, config_class)(num_labels=5, **config)
    model = perturbed(getattr(transformers, model_class)(configuration))
    architecture = architecture_for(model)
    check_contract(architecture, model, _images(3, seed=4))
    owners = ParameterMap(architecture, model).owners
    assert owners["classifier.weight"].group == "head"
    assert owners["vision_model.post_layernorm.weight"].group == "head"


# --- DINOv2 against float64 numpy --------------------------------------------------------------


def dinov2_embedding(w: dict, image: np.ndarray, patch: int) -> np.ndarray:
    """Patches by hand (row-major), the cls token before them, the position embedding added."""
    kernel = w["embeddings.patch_embeddings.projection.weight"]
    d = kernel.shape[0]
    _, height, width = image.shape
    rows = [
        kernel.reshape(d, -1) @ image[:, i : i + patch, j : j + patch].ravel()
        + w["embeddings.patch_embeddings.projection.bias"]
        for i in range(0, height, patch)
        for j in range(0, width, patch)
    ]
    tokens = np.vstack([w["embeddings.cls_token"][0], np.array(rows)])
    return tokens + w["embeddings.position_embeddings"][0]


def dinov2_direct(model: torch.nn.Module, reference, downstream, protocol: str) -> dict:
    """Numerators and denominators per (block, component, pair), from the state dict."""
    w = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    config = model.config
    heads, eps, patch = config.num_attention_heads, config.layer_norm_eps, config.patch_size
    gated = "encoder.layer.0.mlp.gate_proj.weight" in w
    fc2_name = "mlp.down_proj" if gated else "mlp.fc2"
    found = {}
    for pair in range(len(reference)):
        x = dinov2_embedding(w, reference[pair].numpy(), patch)
        y = dinov2_embedding(w, downstream[pair % len(downstream)].numpy(), patch)
        for block in range(config.num_hidden_layers):
            b = f"encoder.layer.{block}"

            def ln(name, t, b=b):
                return layer_norm(t, w[f"{b}.{name}.weight"], w[f"{b}.{name}.bias"], eps)

            def lin(name, t, b=b):
                return t @ w[f"{b}.{name}.weight"].T + w[f"{b}.{name}.bias"]

            def attn(t):
                d_h = t.shape[1] // heads
                q, k, v = (lin(f"attention.{p}_proj", t) for p in "qkv")
                outputs = []
                for h in range(heads):
                    cols = slice(h * d_h, (h + 1) * d_h)
                    logits = q[:, cols] @ k[:, cols].T / np.sqrt(d_h)
                    outputs.append(softmax_rows(logits) @ v[:, cols])
                return lin("attention.o_proj", np.hstack(outputs))

            def fc1(t):  # the first linear stage: [gate(t), up(t)] for the SwiGLU
                if gated:
                    return np.hstack([lin("mlp.gate_proj", t), lin("mlp.up_proj", t)])
                return lin("mlp.fc1", t)

            def hidden(t):  # what reaches FC2
                if gated:
                    g = lin("mlp.gate_proj", t)
                    return g * expit(g) * lin("mlp.up_proj", t)  # silu(gate) * up
                u = lin("mlp.fc1", t)
                return 0.5 * u * (1.0 + erf(u / np.sqrt(2.0)))  # exact GELU

            if protocol == "embedding":
                parts = embedding_protocol(
                    x,
                    y,
                    ln1=lambda t: ln("norm1", t),
                    mha=attn,
                    ln2=lambda t: ln("norm2", t),
                    fc1=fc1,
                    fc2=lambda t: lin(fc2_name, t),
                    fc2_width=w[f"{b}.{fc2_name}.weight"].shape[1],
                )
            else:
                scale1, scale2 = w[f"{b}.layer_scale1.lambda1"], w[f"{b}.layer_scale2.lambda1"]
                parts = {"ln1": norm_ratio(lambda t: ln("norm1", t), x, y)}
                ux, uy = ln("norm1", x), ln("norm1", y)
                parts["mha"] = norm_ratio(attn, ux, uy)
                rx, ry = x + scale1 * attn(ux), y + scale1 * attn(uy)
                parts["ln2"] = norm_ratio(lambda t: ln("norm2", t), rx, ry)
                vx, vy = ln("norm2", rx), ln("norm2", ry)
                parts["fc1"] = norm_ratio(fc1, vx, vy)
                hx, hy = hidden(vx), hidden(vy)
                parts["fc2"] = norm_ratio(lambda t: lin(fc2_name, t), hx, hy)
                x = rx + scale2 * lin(fc2_name, hx)
                y = ry + scale2 * lin(fc2_name, hy)
            for component, value in parts.items():
                found[(block, component, pair)] = value
    return found


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
@pytest.mark.parametrize("case_id", ["hf_dinov2", "hf_dinov2_swiglu"])
def test_dinov2_matches_direct_float64(case_id: str, protocol: str) -> None:
    model = _tiny(case_id)
    assert architecture_for(model).name == "hf_dinov2"
    reference, downstream = _images(3, seed=1), _images(2, seed=2)  # downstream cycles
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    expected = dinov2_direct(model, reference, downstream, protocol)
    got = {
        (r["block"], r["component"], r["pair"]): (r["numerator"], r["denominator"])
        for r in frame.iter_rows(named=True)
    }
    assert got.keys() == expected.keys()
    for key, (numerator, denominator) in expected.items():
        assert got[key][0] == pytest.approx(numerator, rel=RTOL), key
        assert got[key][1] == pytest.approx(denominator, rel=RTOL), key


# --- parameter groups --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case_id", "expected"),
    [
        (
            "hf_vit_classifier",
            {
                "vit.embeddings.cls_token": "emb",
                "vit.embeddings.position_embeddings": "emb",
                "vit.layers.1.attention.o_proj.weight": "mha",
                "vit.layers.1.layernorm_after.bias": "ln2",
                "vit.layernorm.weight": "head",
                "classifier.weight": "head",
            },
        ),
        ("hf_vit", {"pooler.dense.weight": "head"}),
        (
            "hf_dinov2",
            {
                "embeddings.mask_token": "emb",
                "encoder.layer.0.layer_scale1.lambda1": "mha",
                "encoder.layer.0.layer_scale2.lambda1": "fc2",
                "encoder.layer.0.mlp.fc1.weight": "fc1",
                "layernorm.bias": "head",
            },
        ),
        (
            "hf_dinov2_swiglu",
            {
                "encoder.layer.1.mlp.gate_proj.weight": "fc1",
                "encoder.layer.1.mlp.up_proj.bias": "fc1",
                "encoder.layer.1.mlp.down_proj.weight": "fc2",
            },
        ),
        (
            "hf_dinov2_registers_classifier",
            {"dinov2_with_registers.embeddings.register_tokens": "emb", "classifier.bias": "head"},
        ),
        (
            "hf_dinov3_gated",
            {
                "embeddings.register_tokens": "emb",
                "embeddings.patch_embeddings.weight": "emb",
                "model.layer.1.layer_scale1.lambda1": "mha",
                "model.layer.1.layer_scale2.lambda1": "fc2",
                "model.layer.1.mlp.gate_proj.weight": "fc1",
                "model.layer.1.mlp.down_proj.weight": "fc2",
                "norm.weight": "head",
            },
        ),
        (
            "hf_clip_vision_projection",
            {
                "vision_model.embeddings.class_embedding": "emb",
                "vision_model.pre_layrnorm.weight": "emb",
                "vision_model.encoder.layers.0.self_attn.out_proj.weight": "mha",
                "vision_model.encoder.layers.0.layer_norm1.weight": "ln1",
                "vision_model.post_layernorm.weight": "head",
                "visual_projection.weight": "head",
            },
        ),
        (
            "hf_siglip_vision",
            {
                "embeddings.position_embedding.weight": "emb",
                "head.probe": "head",
                "head.attention.in_proj_weight": "head",
                "head.mlp.fc1.weight": "head",
            },
        ),
    ],
)
def test_parameters_are_trained_by_their_configuration(case_id: str, expected: dict) -> None:
    model = _case(case_id).build()
    owners = ParameterMap(architecture_for(model), model).owners
    assert {name: owners[name].trained_by for name in expected} == expected


def test_gated_fc1_is_gate_and_up_or_up_alone() -> None:
    model = _case("hf_dinov3_gated").build()
    architecture = architecture_for(model)
    block = architecture.blocks(model)[0]
    assert architecture.components(block)["fc1"] == (block.mlp.gate_proj, block.mlp.up_proj)
    assert architecture.components(block, fc1="up")["fc1"] == (block.mlp.up_proj,)
    plain = _case("hf_dinov3").build()
    plain_block = architecture.blocks(plain)[0]
    assert architecture.components(plain_block, fc1="up")["fc1"] == (plain_block.mlp.up_proj,)


def test_siglip_without_its_pooling_head_is_accounted_for() -> None:
    torch.manual_seed(0)
    config = _config("SiglipVisionConfig", intermediate_size=96, vision_use_head=False)
    model = transformers.SiglipVisionModel(config)
    owners = ParameterMap(architecture_for(model), model).owners
    assert not any(name.startswith("head.") for name in owners)


# --- the MHA bound's weights -------------------------------------------------------------------


@pytest.mark.parametrize(
    "case_id", ["hf_vit", "hf_dinov2", "hf_clip_vision", "hf_siglip_vision", "hf_dinov3"]
)
def test_attention_weights_are_the_heads_of_the_attention(case_id: str) -> None:
    """softmax(x Q_h^T (x K_h^T)^T / sqrt(d_h)) x V_h^T per head, concatenated, through O:
    the attention's own output (biases read beside the weights) for the families without
    rotary positions; DINOv3 has the projections, and its bound is refused for its rotation."""
    model = _tiny(case_id)
    architecture = architecture_for(model)
    block = architecture.blocks(model)[1]
    attention = architecture.components(block)["mha"][0]
    weights = architecture.attention_weights(attention)
    if case_id == "hf_dinov3":
        assert "rotary position embedding" in architecture.mha_bound_refusal(model)
        assert weights.query.shape == weights.output.shape == (48, 48)
        return
    assert architecture.mha_bound_refusal(model) is None
    embedded = architecture.embed(model, _images(1, seed=5))
    x = embedded.tokens[0].detach().numpy()
    biases = {
        name: module.bias.detach().numpy()
        for name, module in attention.named_children()
        if name.endswith("proj")
    }
    q_bias, k_bias, v_bias, o_bias = (
        biases[name] for name in ("q_proj", "k_proj", "v_proj", architecture.output_projection)
    )
    query, key, value, output = (
        w.detach().numpy() for w in (weights.query, weights.key, weights.value, weights.output)
    )
    d_h = query.shape[0] // weights.num_heads
    heads = []
    for h in range(weights.num_heads):
        rows = slice(h * d_h, (h + 1) * d_h)
        q = x @ query[rows].T + q_bias[rows]
        k = x @ key[rows].T + k_bias[rows]
        v = x @ value[rows].T + v_bias[rows]
        heads.append(softmax_rows(q @ k.T / np.sqrt(d_h)) @ v)
    expected = np.hstack(heads) @ output.T + o_bias
    with torch.no_grad():
        found = architecture.attend(attention, embedded.tokens, embedded, 1)[0].numpy()
    # ViT's, CLIP's and SigLIP's eager attention take the softmax in float32 whatever the
    # dtype (DINOv2's in float64): ~1e-7 relative, where a wrong head slice or layout is O(1).
    np.testing.assert_allclose(found, expected, rtol=1e-5, atol=1e-5)


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", HF_VISION_TINY_MODELS, ids=lambda case: case.id)
def test_finetuning_stages_need_a_classification_class(case: TinyModel) -> None:
    """finetune and recommend take a tower in its classification class (a bare tower, or
    CLIP's with a projection, is refused by name); LoRA, plasticity and bounds any."""
    model = case.build()
    architecture = architecture_for(model)
    classifier = case.id.endswith("_classifier")
    for stage in ("finetune", "recommend"):
        refusal = architecture.refusal(stage, model)
        if classifier:
            assert refusal is None, stage
        else:
            assert f"{type(model).__name__} has no classification head" in refusal, stage
    for stage in ("lora", "plasticity", "bounds"):
        assert architecture.refusal(stage, model) is None, stage


@pytest.mark.parametrize(
    ("model_class", "config"),
    [
        ("CLIPTextModel", transformers.CLIPTextConfig(hidden_size=48, num_attention_heads=3)),
        ("DINOv3ViTBackbone", _config("DINOv3ViTConfig", intermediate_size=96)),
    ],
)
def test_other_transformers_classes_are_refused_by_name(model_class: str, config) -> None:
    model = getattr(transformers, model_class)(config)
    with pytest.raises(UnsupportedModel, match=f"{model_class} .*known families: .*hf_vit"):
        architecture_for(model)


def test_a_block_of_another_class_is_refused_by_name() -> None:
    model = _case("hf_dinov2").build()

    class PatchedLayer(type(model.encoder.layer[0])):
        pass

    model.encoder.layer[1].__class__ = PatchedLayer
    with pytest.raises(UnsupportedModel, match="block 1 of Dinov2Model is a PatchedLayer"):
        architecture_for(model).blocks(model)


def test_lora_targets_are_the_attention_projections_by_full_name() -> None:
    model = _case("hf_clip_vision_projection").build()
    targets = architecture_for(model).lora_targets(model)
    assert targets == [
        f"vision_model.encoder.layers.{block}.self_attn.{name}"
        for block in range(2)
        for name in ("k_proj", "v_proj", "q_proj", "out_proj")
    ]
