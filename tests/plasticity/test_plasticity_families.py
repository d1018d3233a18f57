"""Plasticity of the timm DINOv3 (Eva) and transformers GPT2 families against direct float64
computations written here from the weights (tiny random-init models, nothing downloaded)."""

from __future__ import annotations

import sys

import numpy as np
import polars as pl
import pytest
import timm
import torch
from scipy.special import erf, expit

from tests.helpers.numpy_reference import (
    check_against,
    embedding_protocol,
    layer_norm,
    norm_ratio,
    softmax_rows,
)
from tests.helpers.text_entries import gpt2_entry
from vitplasticity.models.architectures import UnsupportedModel, architecture_for
from vitplasticity.models.build import build_model
from vitplasticity.plasticity.measure import measure

transformers = pytest.importorskip("transformers")

RTOL = 1e-6  # float64 model against float64 numpy: measured agreement ~1e-14


def _weights(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}


def _perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """float64, with norms, layer scales and attention weights far from their init, so that a
    wrong gamma, head slice, softmax scale or rotation shows in the numbers."""
    model = model.double()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if ("norm" in name or "ln_" in name or "gamma" in name) and name.endswith(
                ("weight", "gamma_1", "gamma_2")
            ):
                parameter.copy_(1.0 + 0.5 * noise)
            elif "qkv.weight" in name or "c_attn.weight" in name:
                parameter.copy_(0.3 * noise)
            else:
                parameter.add_(0.05 * noise)
    return model.eval()


# ---------------------------------------------------------------------------------------------
# DINOv3 (timm Eva): rotary positions, register tokens, plain or gated MLP, layer scale

DINO_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 3}
DINO_IDS = {
    "gated": "vit_small_plus_patch16_dinov3",  # SwiGLU fc1_g / fc1_x, no qkv bias
    "plain": "vit_small_patch16_dinov3_qkvb",  # fc1 -> GELU -> fc2, q and v biases
}


@pytest.fixture(params=sorted(DINO_IDS))
def dino64(request: pytest.FixtureRequest) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(DINO_IDS[request.param], num_classes=0, **DINO_KWARGS)
    return _perturb(model, seed=11)


def dino_embedding(w: dict, image: np.ndarray, patch: int) -> np.ndarray:
    """Patches by hand (row-major), then cls and the register tokens before them."""
    kernel = w["patch_embed.proj.weight"]
    d = kernel.shape[0]
    _, height, width = image.shape
    rows = [
        kernel.reshape(d, -1) @ image[:, i : i + patch, j : j + patch].ravel()
        + w["patch_embed.proj.bias"]
        for i in range(0, height, patch)
        for j in range(0, width, patch)
    ]
    return np.vstack([w["cls_token"][0], w["reg_token"][0], np.array(rows)])


def rotate(t: np.ndarray, rope: np.ndarray) -> np.ndarray:
    """Rotary embedding, 'rotate half' layout: t cos + [-t2, t1] sin (rope = [sin, cos])."""
    sin, cos = np.split(rope, 2, axis=-1)
    t1, t2 = np.split(t, 2, axis=-1)
    return t * cos + np.concatenate([-t2, t1], axis=-1) * sin


def dino_attention(w: dict, b: str, x: np.ndarray, heads: int, rope: np.ndarray, prefix: int):
    d = x.shape[1]
    d_h = d // heads
    qkv_w = w[f"{b}.attn.qkv.weight"]
    bias = {
        part: w.get(f"{b}.attn.{part}_bias", np.zeros(d)) for part in ("q", "k", "v")
    }  # k_bias is a zero buffer when present
    outputs = []
    for h in range(heads):
        rows = slice(h * d_h, (h + 1) * d_h)
        q = x @ qkv_w[:d][rows].T + bias["q"][rows]
        k = x @ qkv_w[d : 2 * d][rows].T + bias["k"][rows]
        v = x @ qkv_w[2 * d :][rows].T + bias["v"][rows]
        # Prefix tokens (cls + registers) carry no position: only the patches are rotated.
        q = np.vstack([q[:prefix], rotate(q[prefix:], rope)])
        k = np.vstack([k[:prefix], rotate(k[prefix:], rope)])
        outputs.append(softmax_rows(q @ k.T / np.sqrt(d_h)) @ v)
    return np.hstack(outputs) @ w[f"{b}.attn.proj.weight"].T + w[f"{b}.attn.proj.bias"]


def dino_direct(
    model: torch.nn.Module, reference, downstream, protocol: str, fc1_mode: str = "stage"
) -> dict:
    w = _weights(model)
    heads, eps = model.blocks[0].attn.num_heads, model.blocks[0].norm1.eps
    prefix, patch = model.num_prefix_tokens, model.patch_embed.patch_size[0]
    # The rotary table of the patch grid is the model's; everything done with it is ours.
    _, rope = model._pos_embed(model.patch_embed(reference[:1]))
    rope = rope.detach().double().numpy()
    gated = "blocks.0.mlp.fc1_g.weight" in w
    found = {}
    for pair in range(len(reference)):
        x = dino_embedding(w, reference[pair].numpy(), patch)
        y = dino_embedding(w, downstream[pair % len(downstream)].numpy(), patch)
        for block in range(len(model.blocks)):
            b = f"blocks.{block}"

            def ln(name, t, b=b):
                return layer_norm(t, w[f"{b}.{name}.weight"], w[f"{b}.{name}.bias"], eps)

            def lin(name, t, b=b):
                return t @ w[f"{b}.{name}.weight"].T + w[f"{b}.{name}.bias"]

            def attn(t, b=b):
                return dino_attention(w, b, t, heads, rope, prefix)

            def fc1(t):  # the gated MLP's first linear stage: [fc1_g(t), fc1_x(t)]
                if gated and fc1_mode == "up":  # the reference code's ablation: up alone
                    return lin("mlp.fc1_x", t)
                if gated:
                    return np.hstack([lin("mlp.fc1_g", t), lin("mlp.fc1_x", t)])
                return lin("mlp.fc1", t)

            def hidden(t):  # what reaches fc2
                if gated:
                    g = lin("mlp.fc1_g", t)
                    return g * expit(g) * lin("mlp.fc1_x", t)  # silu(g) * x
                u = lin("mlp.fc1", t)
                return 0.5 * u * (1.0 + erf(u / np.sqrt(2.0)))

            if protocol == "embedding":
                parts = embedding_protocol(
                    x,
                    y,
                    ln1=lambda t: ln("norm1", t),
                    mha=attn,
                    ln2=lambda t: ln("norm2", t),
                    fc1=fc1,
                    fc2=lambda t: lin("mlp.fc2", t),
                    fc2_width=w[f"{b}.mlp.fc2.weight"].shape[1],
                )
            else:
                parts = {"ln1": norm_ratio(lambda t: ln("norm1", t), x, y)}
                ux, uy = ln("norm1", x), ln("norm1", y)
                parts["mha"] = norm_ratio(attn, ux, uy)
                rx, ry = x + w[f"{b}.gamma_1"] * attn(ux), y + w[f"{b}.gamma_1"] * attn(uy)
                parts["ln2"] = norm_ratio(lambda t: ln("norm2", t), rx, ry)
                vx, vy = ln("norm2", rx), ln("norm2", ry)
                parts["fc1"] = norm_ratio(fc1, vx, vy)
                hx, hy = hidden(vx), hidden(vy)
                parts["fc2"] = norm_ratio(lambda t: lin("mlp.fc2", t), hx, hy)
                x = rx + w[f"{b}.gamma_2"] * lin("mlp.fc2", hx)
                y = ry + w[f"{b}.gamma_2"] * lin("mlp.fc2", hy)
            for component, value in parts.items():
                found[(block, component, pair)] = value
    return found


def _images(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((n, 3, 32, 32), generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
def test_dinov3_matches_direct_float64(dino64: torch.nn.Module, protocol: str) -> None:
    assert architecture_for(dino64).name == "timm_eva"
    assert dino64.pos_embed is None and dino64.rope is not None  # positions only through rope
    reference, downstream = _images(3, seed=1), _images(2, seed=2)  # downstream cycles
    frame = measure(dino64, reference, downstream, protocol=protocol, batch_size=2)
    check_against(frame, dino_direct(dino64, reference, downstream, protocol), RTOL)


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
def test_dinov3_fc1_up_mode_matches_direct_float64(protocol: str) -> None:
    """plasticity.fc1: up measures the SwiGLU's up projection alone (the reference code's
    DINOv3 ablation); every other component is unchanged."""
    torch.manual_seed(0)
    model = timm.create_model(DINO_IDS["gated"], num_classes=0, **DINO_KWARGS)
    model = _perturb(model, seed=11)
    reference, downstream = _images(3, seed=1), _images(2, seed=2)
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2, fc1="up")
    check_against(frame, dino_direct(model, reference, downstream, protocol, fc1_mode="up"), RTOL)
    stage = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    assert not np.allclose(
        frame.filter(pl.col("component") == "fc1")["ratio"].to_numpy(),
        stage.filter(pl.col("component") == "fc1")["ratio"].to_numpy(),
    )


def test_fc1_up_mode_is_refused_for_a_packed_gated_mlp() -> None:
    model = timm.create_model(
        "eva02_tiny_patch14_224", num_classes=0, img_size=28, embed_dim=48, depth=2, num_heads=3
    ).eval()
    images = torch.randn(2, 3, 28, 28)
    with pytest.raises(UnsupportedModel, match="GluMlp packs both in one Linear"):
        measure(model, images, images, fc1="up")


def test_dinov3_mha_sees_positions(dino64: torch.nn.Module) -> None:
    """Swapping two patches changes MHA's output beyond the swap (the rope ties tokens to
    positions); without rope attention would be permutation-equivariant."""
    architecture = architecture_for(dino64)
    images = _images(1, seed=3)
    embedded = architecture.embed(dino64, images)
    block = dino64.blocks[0]
    prefix = dino64.num_prefix_tokens
    order = torch.arange(embedded.tokens.shape[1])
    order[[prefix, prefix + 1]] = order[[prefix + 1, prefix]]
    with torch.no_grad():
        out = architecture.embedding_outputs(block, 0, embedded)[1][0]
        swapped = architecture.embedding_outputs(
            block, 0, type(embedded)(embedded.tokens[:, order], embedded.context)
        )[1][0]
    assert not torch.allclose(swapped, out[:, order], rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------------------------------------
# GPT2 (transformers GPT2Model): token ids, causal attention, Conv1D (in, out) weights

GPT2_CONFIG = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 100, "n_positions": 16}


def tiny_gpt2(attn_implementation: str = "eager") -> torch.nn.Module:
    torch.manual_seed(0)
    entry = gpt2_entry("random", config={**GPT2_CONFIG, "attn_implementation": attn_implementation})
    return _perturb(build_model(entry), seed=5)


def gpt2_direct(model: torch.nn.Module, reference, downstream, protocol: str) -> dict:
    w = _weights(model)
    heads, eps = model.config.n_head, model.config.layer_norm_epsilon
    found = {}
    for pair in range(len(reference)):
        ids_x, ids_y = reference[pair].numpy(), downstream[pair % len(downstream)].numpy()
        length = len(ids_x)
        x = w["wte.weight"][ids_x] + w["wpe.weight"][:length]
        y = w["wte.weight"][ids_y] + w["wpe.weight"][:length]
        future = np.triu(np.ones((length, length), dtype=bool), 1)
        for block in range(model.config.n_layer):
            b = f"h.{block}"

            def ln(name, t, b=b):
                return layer_norm(t, w[f"{b}.{name}.weight"], w[f"{b}.{name}.bias"], eps)

            def conv1d(name, t, b=b):  # Conv1D: t @ W + b, W (in, out)
                return t @ w[f"{b}.{name}.weight"] + w[f"{b}.{name}.bias"]

            def attn(t, b=b, future=future):
                d = t.shape[1]
                d_h = d // heads
                qkv = conv1d("attn.c_attn", t)  # (L, 3d): q | k | v columns
                outputs = []
                for h in range(heads):
                    cols = slice(h * d_h, (h + 1) * d_h)
                    q, k, v = (
                        qkv[:, :d][:, cols],
                        qkv[:, d : 2 * d][:, cols],
                        qkv[:, 2 * d :][:, cols],
                    )
                    logits = np.where(future, -np.inf, q @ k.T / np.sqrt(d_h))
                    outputs.append(softmax_rows(logits) @ v)
                return conv1d("attn.c_proj", np.hstack(outputs))

            def gelu_new(u):
                return 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))

            if protocol == "embedding":
                parts = embedding_protocol(
                    x,
                    y,
                    ln1=lambda t: ln("ln_1", t),
                    mha=attn,
                    ln2=lambda t: ln("ln_2", t),
                    fc1=lambda t: conv1d("mlp.c_fc", t),
                    fc2=lambda t: conv1d("mlp.c_proj", t),
                    fc2_width=w[f"{b}.mlp.c_proj.weight"].shape[0],  # Conv1D: (in, out)
                )
            else:
                parts = {"ln1": norm_ratio(lambda t: ln("ln_1", t), x, y)}
                ux, uy = ln("ln_1", x), ln("ln_1", y)
                parts["mha"] = norm_ratio(attn, ux, uy)
                rx, ry = x + attn(ux), y + attn(uy)
                parts["ln2"] = norm_ratio(lambda t: ln("ln_2", t), rx, ry)
                vx, vy = ln("ln_2", rx), ln("ln_2", ry)
                parts["fc1"] = norm_ratio(lambda t: conv1d("mlp.c_fc", t), vx, vy)
                hx, hy = gelu_new(conv1d("mlp.c_fc", vx)), gelu_new(conv1d("mlp.c_fc", vy))
                parts["fc2"] = norm_ratio(lambda t: conv1d("mlp.c_proj", t), hx, hy)
                x, y = rx + conv1d("mlp.c_proj", hx), ry + conv1d("mlp.c_proj", hy)
            for component, value in parts.items():
                found[(block, component, pair)] = value
    return found


def _token_ids(n: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, GPT2_CONFIG["vocab_size"], (n, length), generator=generator)


@pytest.mark.parametrize(
    ("protocol", "attn_implementation"),
    [("embedding", "eager"), ("embedding", "sdpa"), ("in_situ", "eager"), ("in_situ", "sdpa")],
)
def test_gpt2_matches_direct_float64(protocol: str, attn_implementation: str) -> None:
    model = tiny_gpt2(attn_implementation)
    assert architecture_for(model).name == "hf_gpt2"
    reference, downstream = _token_ids(3, 8, seed=1), _token_ids(2, 8, seed=2)
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    check_against(frame, gpt2_direct(model, reference, downstream, protocol), RTOL)


def test_gpt2_mha_is_causal() -> None:
    """Changing the last token leaves every earlier token's attention output unchanged."""
    model = tiny_gpt2()
    architecture = architecture_for(model)
    ids = _token_ids(1, 8, seed=3)
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % GPT2_CONFIG["vocab_size"]
    with torch.no_grad():
        a = architecture.embedding_outputs(model.h[0], 0, architecture.embed(model, ids))[1][0]
        b = architecture.embedding_outputs(model.h[0], 0, architecture.embed(model, changed))[1][0]
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=0)
    assert not torch.allclose(a[:, -1], b[:, -1])


# ---------------------------------------------------------------------------------------------
# Dispatch and errors


def test_timm_vit_is_its_family(tiny_vit: torch.nn.Module) -> None:
    assert architecture_for(tiny_vit).name == "timm_vit"


def test_unknown_model_names_its_class_and_the_families() -> None:
    with pytest.raises(UnsupportedModel, match=r"Linear .*known families: timm_vit .*hf_gpt2"):
        measure(torch.nn.Linear(3, 3).eval(), _images(2, 0), _images(2, 1))


def test_gpt2_rejects_images_and_long_sequences() -> None:
    model = tiny_gpt2()
    with pytest.raises(ValueError, match=r"reference: expected token-id batches \(N, L\)"):
        measure(model, _images(2, 0), _images(2, 1))
    too_long = _token_ids(2, GPT2_CONFIG["n_positions"] + 1, seed=0)
    with pytest.raises(ValueError, match="exceed the model's 16 positions"):
        measure(model, too_long, too_long)


def test_gpt2_entry_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"unknown model keys \['timm_id'\]"):
        build_model({**gpt2_entry(), "timm_id": "x"})
    with pytest.raises(FileNotFoundError, match="no/such/folder"):
        build_model(gpt2_entry("no/such/folder"))
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ImportError, match=r"vitplasticity\[extras\]"):
        build_model(gpt2_entry("random"))
