"""The transformers ViT-like towers beyond ViT itself (DeiT, BEiT) against a float64
computation written here from the state dict: patches by hand, the cls (and distillation)
token, positions where the model has them, per-head softmax attention, exact GELU, BEiT's
layer scales (lambda_1, lambda_2); both protocols. And what only these families have: the
parameters of the distillation token and the layer scales, and DeiT's teacher class."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy.special import erf

from tests.helpers.contract import (
    TOLERANCE,
    check_composition,
    check_contract,
    check_hooks,
    check_partition,
)
from tests.helpers.numpy_reference import (
    check_against,
    embedding_protocol,
    layer_norm,
    norm_ratio,
    softmax_rows,
)
from tests.helpers.tiny_models import HF_VISION_TINY_CONFIG, TINY_MODELS, TinyModel, perturbed
from vitplasticity.models.architectures import ParameterMap, architecture_for
from vitplasticity.plasticity.measure import measure

transformers = pytest.importorskip("transformers")

RTOL = 1e-6  # float64 model against float64 numpy


def _case(case_id: str) -> TinyModel:
    return next(case for case in TINY_MODELS if case.id == case_id)


def _images(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((n, 3, 32, 32), generator=generator, dtype=torch.float64)


def embedding(w: dict, image: np.ndarray, patch: int, tokens: tuple[str, ...]) -> np.ndarray:
    """Patches by hand (row-major), the ``tokens`` (cls, distillation) before them, the
    position embedding added where there is one."""
    kernel = w["embeddings.patch_embeddings.projection.weight"]
    d = kernel.shape[0]
    _, height, width = image.shape
    rows = [
        kernel.reshape(d, -1) @ image[:, i : i + patch, j : j + patch].ravel()
        + w["embeddings.patch_embeddings.projection.bias"]
        for i in range(0, height, patch)
        for j in range(0, width, patch)
    ]
    x = np.vstack([*(w[f"embeddings.{token}"][0] for token in tokens), np.array(rows)])
    return x + w.get("embeddings.position_embeddings", np.zeros((1, 1, d)))[0]


def relative_bias(table: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """BEiT's relative position bias (heads, 1 + n, 1 + n) of a ``grid`` of n patches, from its
    table: patch a to patch b reads row (dy + g0 - 1) (2 g1 - 1) + (dx + g1 - 1) of the
    offset (dy, dx) = a - b; the last three rows are cls to patch, patch to cls, cls to cls."""
    rows, cols = grid
    cells = [(i, j) for i in range(rows) for j in range(cols)]
    last = len(table) - 1
    index = np.empty((len(cells) + 1, len(cells) + 1), dtype=int)
    index[0, :], index[:, 0], index[0, 0] = last - 2, last - 1, last
    for a, (ia, ja) in enumerate(cells):
        for b, (ib, jb) in enumerate(cells):
            index[1 + a, 1 + b] = (ia - ib + rows - 1) * (2 * cols - 1) + (ja - jb + cols - 1)
    return table[index].transpose(2, 0, 1)


@dataclass(frozen=True)
class Layout:
    """Where a bare tower's state dict holds each block's weights."""

    blocks: str
    q: str
    k: str
    v: str
    o: str
    fc1: str
    fc2: str
    relative: str  # a block's relative position bias table
    shared: str  # the model-wide one
    tokens: tuple[str, ...]  # before the patches


VIT_NAMES = {
    "q": "attention.q_proj",
    "k": "attention.k_proj",
    "v": "attention.v_proj",
    "o": "attention.o_proj",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
    "relative": "relative_position_bias.relative_position_bias_table",
    "shared": "shared_position_bias.relative_position_bias_table",
}
DEIT = Layout("layers", **VIT_NAMES, tokens=("cls_token", "distillation_token"))
BEIT = Layout("layers", **VIT_NAMES, tokens=("cls_token",))
DATA2VEC = Layout(
    "encoder.layer",
    q="attention.attention.query",
    k="attention.attention.key",
    v="attention.attention.value",
    o="attention.output.dense",
    fc1="intermediate.dense",
    fc2="output.dense",
    relative="attention.attention.relative_position_bias.relative_position_bias_table",
    shared="encoder.relative_position_bias.relative_position_bias_table",
    tokens=("cls_token",),
)


def vit_like_direct(
    model: torch.nn.Module, reference, downstream, protocol: str, layout: Layout
) -> dict:
    """Numerators and denominators per (block, component, pair), from the state dict of a
    bare tower whose blocks hold their weights where ``layout`` says."""
    w = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    config = model.config
    heads, eps, patch = config.num_attention_heads, config.layer_norm_eps, config.patch_size
    grid = (config.image_size // patch, config.image_size // patch)
    shared = w.get(layout.shared)
    found = {}
    for pair in range(len(reference)):
        x = embedding(w, reference[pair].numpy(), patch, layout.tokens)
        y = embedding(w, downstream[pair % len(downstream)].numpy(), patch, layout.tokens)
        for block in range(config.num_hidden_layers):
            b = f"{layout.blocks}.{block}"

            def ln(name, t, b=b):
                return layer_norm(t, w[f"{b}.{name}.weight"], w[f"{b}.{name}.bias"], eps)

            def lin(name, t, b=b):
                bias = w.get(f"{b}.{name}.bias", 0.0)  # BEiT's k_proj has none
                return t @ w[f"{b}.{name}.weight"].T + bias

            bias = sum(
                relative_bias(t, grid)
                for t in (shared, w.get(f"{b}.{layout.relative}"))
                if t is not None
            )  # 0 without relative position bias

            def attn(t, bias=bias):
                d_h = t.shape[1] // heads
                q, k, v = (lin(name, t) for name in (layout.q, layout.k, layout.v))
                outputs = []
                for h in range(heads):
                    cols = slice(h * d_h, (h + 1) * d_h)
                    logits = q[:, cols] @ k[:, cols].T / np.sqrt(d_h)
                    outputs.append(
                        softmax_rows(logits + bias[h] if np.ndim(bias) else logits) @ v[:, cols]
                    )
                return lin(layout.o, np.hstack(outputs))

            def hidden(t):  # what reaches FC2
                u = lin(layout.fc1, t)
                return 0.5 * u * (1.0 + erf(u / np.sqrt(2.0)))  # exact GELU

            if protocol == "embedding":
                parts = embedding_protocol(
                    x,
                    y,
                    ln1=lambda t: ln("layernorm_before", t),
                    mha=attn,
                    ln2=lambda t: ln("layernorm_after", t),
                    fc1=lambda t: lin(layout.fc1, t),
                    fc2=lambda t: lin(layout.fc2, t),
                    fc2_width=w[f"{b}.{layout.fc2}.weight"].shape[1],
                )
            else:
                scale1, scale2 = w.get(f"{b}.lambda_1", 1.0), w.get(f"{b}.lambda_2", 1.0)
                parts = {"ln1": norm_ratio(lambda t: ln("layernorm_before", t), x, y)}
                ux, uy = ln("layernorm_before", x), ln("layernorm_before", y)
                parts["mha"] = norm_ratio(attn, ux, uy)
                rx, ry = x + scale1 * attn(ux), y + scale1 * attn(uy)
                parts["ln2"] = norm_ratio(lambda t: ln("layernorm_after", t), rx, ry)
                vx, vy = ln("layernorm_after", rx), ln("layernorm_after", ry)
                parts["fc1"] = norm_ratio(lambda t: lin(layout.fc1, t), vx, vy)
                hx, hy = hidden(vx), hidden(vy)
                parts["fc2"] = norm_ratio(lambda t: lin(layout.fc2, t), hx, hy)
                x = rx + scale2 * lin(layout.fc2, hx)
                y = ry + scale2 * lin(layout.fc2, hy)
            for component, value in parts.items():
                found[(block, component, pair)] = value
    return found


MAE = Layout("layers", **VIT_NAMES, tokens=("cls_token",))  # every patch, none masked

REFERENCE_CASES = {
    # tiny model id: (family, its layout)
    "hf_deit": ("hf_deit", DEIT),
    "hf_beit": ("hf_beit", BEIT),  # absolute positions, layer scale
    "hf_beit_relative": ("hf_beit", BEIT),  # block and model-wide relative biases
    "hf_data2vec_vision": ("hf_data2vec_vision", DATA2VEC),  # all of them
    "vit_mae": ("hf_vit_mae", MAE),  # mask_ratio 0.75: ignored
}


def _vit_mae(model_class: str = "ViTMAEModel", **config) -> torch.nn.Module:
    torch.manual_seed(0)
    settings = {**HF_VISION_TINY_CONFIG, "intermediate_size": 96, **config}
    return getattr(transformers, model_class)(transformers.ViTMAEConfig(**settings))


def _reference_model(case_id: str) -> torch.nn.Module:
    return _vit_mae() if case_id == "vit_mae" else _case(case_id).build()


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
@pytest.mark.parametrize("case_id", sorted(REFERENCE_CASES))
def test_plasticity_matches_direct_float64(case_id: str, protocol: str) -> None:
    family, layout = REFERENCE_CASES[case_id]
    model = perturbed(_reference_model(case_id))
    assert architecture_for(model).name == family
    reference, downstream = _images(3, seed=1), _images(2, seed=2)  # downstream cycles
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    check_against(frame, vit_like_direct(model, reference, downstream, protocol, layout), RTOL)


# --- parameters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case_id", "expected"),
    [
        (
            "hf_deit_classifier",
            {
                "deit.embeddings.cls_token": "emb",
                "deit.embeddings.distillation_token": "emb",
                "deit.embeddings.position_embeddings": "emb",
                "deit.layers.1.attention.o_proj.weight": "mha",
                "deit.layers.1.layernorm_after.bias": "ln2",
                "deit.layers.0.mlp.fc1.weight": "fc1",
                "deit.layernorm.weight": "head",
                "classifier.weight": "head",
            },
        ),
        (
            "hf_beit_relative",
            {
                "embeddings.cls_token": "emb",
                "layers.0.lambda_1": "mha",
                "layers.0.lambda_2": "fc2",
                "layers.1.relative_position_bias.relative_position_bias_table": "mha",
                "shared_position_bias.relative_position_bias_table": "mha",
                "layers.1.attention.k_proj.weight": "mha",
                "layers.1.mlp.fc2.bias": "fc2",
                "pooler.layernorm.weight": "head",
            },
        ),
        (
            "hf_beit_classifier",
            {
                "beit.layers.1.lambda_1": "mha",
                "beit.layers.1.layernorm_before.weight": "ln1",
                "beit.pooler.layernorm.bias": "head",
                "classifier.weight": "head",
            },
        ),
        (
            "hf_data2vec_vision",
            {
                "embeddings.position_embeddings": "emb",
                "encoder.layer.0.lambda_1": "mha",
                "encoder.layer.0.lambda_2": "fc2",
                "encoder.layer.0.attention.attention.key.weight": "mha",
                "encoder.layer.0.attention.attention.relative_position_bias"
                ".relative_position_bias_table": "mha",
                "encoder.relative_position_bias.relative_position_bias_table": "mha",
                "encoder.layer.0.attention.output.dense.bias": "mha",
                "encoder.layer.1.layernorm_after.weight": "ln2",
                "encoder.layer.1.intermediate.dense.weight": "fc1",
                "encoder.layer.1.output.dense.weight": "fc2",
            },
        ),
        (
            "hf_data2vec_vision_classifier",
            {
                "data2vec_vision.pooler.layernorm.weight": "head",
                "data2vec_vision.encoder.layer.1.layernorm_before.bias": "ln1",
                "classifier.bias": "head",
            },
        ),
    ],
)
def test_parameters_are_trained_by_their_configuration(case_id: str, expected: dict) -> None:
    model = _case(case_id).build()
    owners = ParameterMap(architecture_for(model), model).owners
    assert {name: owners[name].trained_by for name in expected} == expected


def test_deit_with_teacher_is_measured_but_not_finetuned() -> None:
    """Its logits average a cls-token and a distillation-token head: both are the head; the
    stages that train one classifier refuse it by name."""
    torch.manual_seed(0)
    config = transformers.DeiTConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    model = transformers.DeiTForImageClassificationWithTeacher(config)
    architecture = architecture_for(model)
    owners = ParameterMap(architecture, model).owners
    assert owners["cls_classifier.weight"].group == "head"
    assert owners["distillation_classifier.bias"].group == "head"
    for stage in ("finetune", "recommend"):
        assert "averages two heads" in architecture.refusal(stage, model)
    for stage in ("plasticity", "bounds", "lora"):
        assert architecture.refusal(stage, model) is None


@pytest.mark.parametrize(
    ("case_id", "relative"),
    [
        ("hf_beit", False),
        ("hf_beit_relative", True),
        ("hf_data2vec_vision_classifier", False),
        ("hf_data2vec_vision", True),
    ],
)
def test_mha_bound_is_refused_with_a_relative_position_bias(case_id: str, relative: bool) -> None:
    model = _case(case_id).build()
    refusal = architecture_for(model).mha_bound_refusal(model)
    if relative:
        assert "adds a learned relative position bias to the attention logits" in refusal
    else:
        assert refusal is None


def test_beit_without_layer_scale_has_nothing_to_declare_for_it() -> None:
    torch.manual_seed(0)
    config = transformers.BeitConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        intermediate_size=96,
        image_size=32,
        patch_size=8,
        layer_scale_init_value=0.0,
        attn_implementation="eager",
    )
    model = perturbed(transformers.BeitModel(config))
    architecture = architecture_for(model)
    check_contract(architecture, model, _images(3, seed=4))
    owners = ParameterMap(architecture, model).owners
    assert not any(owner.group.startswith("layer_scale") for owner in owners.values())


# --- ViTMAE: every patch, in order -------------------------------------------------------------


@pytest.mark.parametrize("model_class", ["ViTMAEModel", "ViTMAEForPreTraining"])
def test_vit_mae_contract_is_its_forward_with_no_patch_masked_or_moved(model_class: str) -> None:
    """The stages' tokens are what the model's own forward feeds its blocks with mask_ratio 0
    and noise that keeps the patches' order (its default forward masks and shuffles at random:
    the shared contract's forward check cannot run it)."""
    model = perturbed(_vit_mae(model_class, mask_ratio=0.0))
    architecture = architecture_for(model)
    assert architecture.name == "hf_vit_mae"
    inputs = _images(3, seed=4)
    check_partition(architecture, model)
    check_hooks(architecture, model, inputs)
    check_composition(architecture, model, inputs)
    blocks = architecture.blocks(model)
    seen = {}
    first = blocks[0].register_forward_hook(lambda m, args, out: seen.update(input=args[0]))
    last = blocks[-1].register_forward_hook(lambda m, args, out: seen.update(output=out))
    ordered = torch.arange(16, dtype=torch.float64).expand(3, -1)  # argsort: the identity
    try:
        with torch.no_grad():
            model(inputs, noise=ordered)
    finally:
        first.remove()
        last.remove()
    with torch.no_grad():
        embedded = architecture.embed(model, inputs)
        tokens = embedded.tokens
        for index, block in enumerate(blocks):
            tokens = architecture.run_block(block, index, tokens, embedded)
    assert embedded.tokens.shape == (3, 17, 48)
    torch.testing.assert_close(embedded.tokens, seen["input"], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(tokens, seen["output"], rtol=0, atol=TOLERANCE)


def test_vit_mae_stages_take_every_patch_whatever_the_mask_ratio() -> None:
    masked = _vit_mae(mask_ratio=0.75)
    whole = _vit_mae(mask_ratio=0.0)
    architecture = architecture_for(masked)
    inputs = _images(2, seed=3).float()
    with torch.no_grad():
        torch.testing.assert_close(
            architecture.embed(masked, inputs).tokens,
            architecture.embed(whole, inputs).tokens,
            rtol=0,
            atol=0,
        )
        assert masked(inputs).last_hidden_state.shape[1] == 1 + 4  # its own forward keeps 4


def test_vit_mae_classifier_pools_the_patches_mean_after_the_final_norm() -> None:
    model = perturbed(_case("hf_vit_mae_classifier").build())
    architecture = architecture_for(model)
    assert type(model).__name__ == "ViTMAEClassifier"
    assert model.vit.config.mask_ratio == 0.75  # ignored: every patch is classified
    inputs = _images(3, seed=5)
    with torch.no_grad():
        logits = architecture.logits(model, inputs)
        embedded = architecture.embed(model, inputs)
        tokens = embedded.tokens
        for index, block in enumerate(architecture.blocks(model)):
            tokens = architecture.run_block(block, index, tokens, embedded)
        pooled = model.vit.layernorm(tokens)[:, 1:].mean(dim=1)
    expected = pooled @ model.classifier.weight.T + model.classifier.bias
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)
    assert architecture.refusal("finetune", model) is None
    pretraining = _vit_mae("ViTMAEForPreTraining")
    assert "has no classification head" in architecture.refusal("finetune", pretraining)
