"""The Swin families (timm ``SwinTransformer``) against a float64 computation written here from
the state dict: patches by hand, the stages' patch merging, each block's (shifted) window
attention with its relative position bias and shift mask, exact GELU; the in-situ protocol
(the embedding protocol is refused: the stages differ in width). And what only Swin has: the
patch merging parameters (trained by ``full`` alone), the refusals by name, and Swin V2, which
no family knows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from polars.testing import assert_frame_equal
from scipy.special import erf

from tests.helpers.contract import check_contract
from tests.helpers.numpy_reference import check_against, layer_norm, norm_ratio, softmax_rows
from tests.helpers.tiny_models import TINY_MODELS, TinyModel, perturbed
from vitplasticity.models.architectures import (
    ParameterMap,
    UndefinedStage,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.upper_bounds import undefined_bounds
from vitplasticity.recommend.criteria import weight_statistics

RTOL = 1e-6  # float64 model against float64 numpy


def _case(family: str) -> TinyModel:
    """The family's first tiny model (transformers' in its classification class)."""
    if family.startswith("hf_"):
        pytest.importorskip("transformers")  # an optional extra
    return next(case for case in TINY_MODELS if case.family == family)


def _images(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((n, 3, 32, 32), generator=generator, dtype=torch.float64)


@dataclass(frozen=True)
class Layout:
    """Where a Swin's state dict holds its weights (``{s}`` a stage, ``{j}`` a block in it)."""

    patch: str  # the patch projection (a conv)
    patch_norm: str
    block: str
    merge: str  # the patch merging before stage s (its norm and reduction), {p} = s - 1
    ln1: str
    ln2: str
    qkv: tuple[str, ...]  # one fused (q; k; v) linear, or three
    proj: str
    table: str  # the relative position bias table
    fc1: str
    fc2: str


TIMM = Layout(
    patch="patch_embed.proj",
    patch_norm="patch_embed.norm",
    block="layers.{s}.blocks.{j}",
    merge="layers.{s}.downsample",  # at the start of stage s
    ln1="norm1",
    ln2="norm2",
    qkv=("attn.qkv",),
    proj="attn.proj",
    table="attn.relative_position_bias_table",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
)


@dataclass(frozen=True)
class Shape:
    """What the reference needs of the model's configuration."""

    patch: int
    depths: tuple[int, ...]
    heads: tuple[int, ...]
    window: int
    eps: float


def patches(w: dict, layout: Layout, image: np.ndarray, patch: int, eps: float) -> np.ndarray:
    """The patch grid (H, W, C) by hand, then the patch norm."""
    kernel = w[f"{layout.patch}.weight"]
    c = kernel.shape[0]
    _, height, width = image.shape
    grid = np.array(
        [
            [
                kernel.reshape(c, -1) @ image[:, i : i + patch, j : j + patch].ravel()
                + w[f"{layout.patch}.bias"]
                for j in range(0, width, patch)
            ]
            for i in range(0, height, patch)
        ]
    )
    return layer_norm(grid, w[f"{layout.patch_norm}.weight"], w[f"{layout.patch_norm}.bias"], eps)


def patch_merging(w: dict, name: str, x: np.ndarray, eps: float) -> np.ndarray:
    """Each 2 x 2 group [x(2i, 2j), x(2i+1, 2j), x(2i, 2j+1), x(2i+1, 2j+1)] normed and
    reduced (no bias): (H/2, W/2, 2C)."""
    grouped = np.concatenate([x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2]], axis=-1)
    normed = layer_norm(grouped, w[f"{name}.norm.weight"], w[f"{name}.norm.bias"], eps)
    return normed @ w[f"{name}.reduction.weight"].T


def window_attention(
    t: np.ndarray, w: dict, b: str, layout: Layout, heads: int, window: int, shift: int
) -> np.ndarray:
    """Swin's attention on a grid (H, W, C) of normed tokens, every token attending to those
    of its window, on the grid rolled by -shift: a learned bias per head and relative offset
    (dy, dx) in the window (table row (dy + w - 1)(2w - 1) + dx + w - 1), and -100 between
    two tokens the roll brought from different regions (a region: before H - w, between
    H - w and H - shift, after, along each axis)."""
    h, wd, c = t.shape
    if len(layout.qkv) == 1:  # fused: q, k, v stacked along rows
        q, k, v = np.split(
            t.reshape(-1, c) @ w[f"{b}.{layout.qkv[0]}.weight"].T + w[f"{b}.{layout.qkv[0]}.bias"],
            3,
            axis=-1,
        )
    else:
        q, k, v = (
            t.reshape(-1, c) @ w[f"{b}.{n}.weight"].T + w[f"{b}.{n}.bias"] for n in layout.qkv
        )
    table = w[f"{b}.{layout.table}"]
    d_h = q.shape[1] // heads
    out = np.zeros((h * wd, c))
    cells = [(i, j) for i in range(h) for j in range(wd)]
    rolled = {cell: ((cell[0] - shift) % h, (cell[1] - shift) % wd) for cell in cells}

    def region(position: int, side: int) -> int:
        return 0 if position < side - window else (1 if position < side - shift else 2)

    windows: dict[tuple[int, int], list[int]] = {}
    for index, cell in enumerate(cells):
        ri, rj = rolled[cell]
        windows.setdefault((ri // window, rj // window), []).append(index)
    for members in windows.values():
        spots = [rolled[cells[m]] for m in members]
        bias = np.zeros((heads, len(members), len(members)))
        for a, (ia, ja) in enumerate(spots):
            for z, (iz, jz) in enumerate(spots):
                row = (ia - iz + window - 1) * (2 * window - 1) + (ja - jz + window - 1)
                bias[:, a, z] = table[row]
                if shift and (region(ia, h), region(ja, wd)) != (region(iz, h), region(jz, wd)):
                    bias[:, a, z] -= 100.0
        heads_out = []
        for head in range(heads):
            cols = slice(head * d_h, (head + 1) * d_h)
            logits = q[members, cols] @ k[members, cols].T / np.sqrt(d_h) + bias[head]
            heads_out.append(softmax_rows(logits) @ v[members, cols])
        out[members] = np.hstack(heads_out)
    out = out @ w[f"{b}.{layout.proj}.weight"].T + w[f"{b}.{layout.proj}.bias"]
    return out.reshape(h, wd, c)


def swin_in_situ(model: torch.nn.Module, reference, downstream, layout: Layout, shape: Shape):
    """Numerators and denominators per (block, component, pair) of the in-situ protocol."""
    w = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    eps = shape.eps
    found = {}
    for pair in range(len(reference)):
        x = patches(w, layout, reference[pair].numpy(), shape.patch, eps)
        y = patches(w, layout, downstream[pair % len(downstream)].numpy(), shape.patch, eps)
        index = 0
        for s, depth in enumerate(shape.depths):
            if s > 0:
                merge = layout.merge.format(s=s, p=s - 1)
                x, y = patch_merging(w, merge, x, eps), patch_merging(w, merge, y, eps)
            side = x.shape[0]
            window = min(shape.window, side)
            for j in range(depth):
                b = layout.block.format(s=s, j=j)
                shift = window // 2 if j % 2 and side > shape.window else 0

                def ln(name, t, b=b):
                    return layer_norm(t, w[f"{b}.{name}.weight"], w[f"{b}.{name}.bias"], eps)

                def lin(name, t, b=b):
                    return t @ w[f"{b}.{name}.weight"].T + w[f"{b}.{name}.bias"]

                def attn(t, b=b, shift=shift, window=window, heads=shape.heads[s]):
                    return window_attention(t, w, b, layout, heads, window, shift)

                parts = {"ln1": norm_ratio(lambda t: ln(layout.ln1, t), x, y)}
                ux, uy = ln(layout.ln1, x), ln(layout.ln1, y)
                parts["mha"] = norm_ratio(attn, ux, uy)
                rx, ry = x + attn(ux), y + attn(uy)
                parts["ln2"] = norm_ratio(lambda t: ln(layout.ln2, t), rx, ry)
                vx, vy = ln(layout.ln2, rx), ln(layout.ln2, ry)
                parts["fc1"] = norm_ratio(lambda t: lin(layout.fc1, t), vx, vy)
                gx, gy = lin(layout.fc1, vx), lin(layout.fc1, vy)
                hx, hy = (0.5 * g * (1.0 + erf(g / np.sqrt(2.0))) for g in (gx, gy))  # GELU
                parts["fc2"] = norm_ratio(lambda t: lin(layout.fc2, t), hx, hy)
                x, y = rx + lin(layout.fc2, hx), ry + lin(layout.fc2, hy)
                for component, value in parts.items():
                    found[(index, component, pair)] = value
                index += 1
    return found


def _timm_shape(model: torch.nn.Module) -> Shape:
    kwargs = _case("timm_swin").kwargs
    return Shape(
        patch=model.patch_embed.patch_size[0],
        depths=tuple(kwargs["depths"]),
        heads=tuple(kwargs["num_heads"]),
        window=kwargs["window_size"],
        eps=model.norm.eps,
    )


HF = Layout(
    patch="embeddings.patch_embeddings.projection",
    patch_norm="embeddings.norm",
    block="encoder.layers.{s}.blocks.{j}",
    merge="encoder.layers.{p}.downsample",  # at the end of the stage before
    ln1="layernorm_before",
    ln2="layernorm_after",
    qkv=("attention.q_proj", "attention.k_proj", "attention.v_proj"),
    proj="attention.o_proj",
    table="attention.relative_position_bias.relative_position_bias_table",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
)


def _hf_shape(model: torch.nn.Module) -> Shape:
    config = model.config
    return Shape(
        patch=config.patch_size,
        depths=tuple(config.depths),
        heads=tuple(config.num_heads),
        window=config.window_size,
        eps=config.layer_norm_eps,
    )


REFERENCE = {"timm_swin": (TIMM, _timm_shape), "hf_swin": (HF, _hf_shape)}
"""Per family: where its bare model's state dict holds each weight, and its configuration."""


def _bare(family: str) -> TinyModel:
    """The family's bare model (a timm model is one; transformers' SwinModel)."""
    _case(family)  # skipped without transformers
    return next(
        case for case in TINY_MODELS if case.family == family and case.id != "hf_swin_classifier"
    )


@pytest.mark.parametrize("family", sorted(REFERENCE))
def test_in_situ_plasticity_matches_direct_float64(family: str) -> None:
    layout, shape_of = REFERENCE[family]
    model = perturbed(_bare(family).build())
    assert architecture_for(model).name == family
    reference, downstream = _images(3, seed=1), _images(2, seed=2)  # downstream cycles
    frame = measure(model, reference, downstream, protocol="in_situ", batch_size=2)
    expected = swin_in_situ(model, reference, downstream, layout, shape_of(model))
    check_against(frame, expected, RTOL)


@pytest.mark.parametrize("family", sorted(REFERENCE))
def test_contract_with_shifted_windows_in_every_stage(family: str) -> None:
    case = _case(family)
    model = perturbed(case.build())
    check_contract(architecture_for(model), model, case.inputs(3).double())


# --- parameters --------------------------------------------------------------------------------


def test_timm_parameters_are_trained_by_their_configuration() -> None:
    model = _case("timm_swin").build()
    owners = ParameterMap(architecture_for(model), model).owners
    expected = {
        "patch_embed.proj.weight": ("emb", "emb", None),
        "patch_embed.norm.weight": ("emb", "emb", None),
        "layers.0.blocks.0.norm1.weight": ("ln1", "ln1", 0),
        "layers.0.blocks.1.attn.relative_position_bias_table": ("mha", "mha", 1),
        "layers.1.blocks.0.attn.qkv.weight": ("mha", "mha", 2),  # numbered across stages
        "layers.1.blocks.1.attn.proj.bias": ("mha", "mha", 3),
        "layers.1.blocks.1.norm2.bias": ("ln2", "ln2", 3),
        "layers.1.blocks.0.mlp.fc1.weight": ("fc1", "fc1", 2),
        "layers.1.blocks.0.mlp.fc2.weight": ("fc2", "fc2", 2),
        "layers.1.downsample.norm.weight": ("patch_merging", "full", None),
        "layers.1.downsample.reduction.weight": ("patch_merging", "full", None),
        "norm.weight": ("head", "head", None),
        "head.fc.weight": ("head", "head", None),
    }
    for name, (group, trained_by, block) in expected.items():
        owner = owners[name]
        assert (owner.group, owner.trained_by, owner.block) == (group, trained_by, block), name
    parameters = ParameterMap(architecture_for(model), model)
    assert "layers.1.downsample.reduction.weight" in parameters.trained_names("full")
    for configuration in ("emb", "ln1", "mha", "ln2", "fc1", "fc2", "head"):
        assert "layers.1.downsample.reduction.weight" not in parameters.trained_names(configuration)
    assert parameters.group("layers.1.downsample.reduction.weight") == "other"


def test_hf_parameters_are_trained_by_their_configuration() -> None:
    model = _case("hf_swin").build()
    assert type(model).__name__ == "SwinForImageClassification"
    owners = ParameterMap(architecture_for(model), model).owners
    block = "swin.encoder.layers.1.blocks.1"
    expected = {
        "swin.embeddings.patch_embeddings.projection.weight": ("emb", "emb", None),
        "swin.embeddings.norm.weight": ("emb", "emb", None),
        "swin.encoder.layers.0.blocks.0.layernorm_before.weight": ("ln1", "ln1", 0),
        f"{block}.attention.relative_position_bias.relative_position_bias_table": (
            "mha",
            "mha",
            3,
        ),
        f"{block}.attention.q_proj.weight": ("mha", "mha", 3),
        f"{block}.attention.o_proj.bias": ("mha", "mha", 3),
        f"{block}.layernorm_after.weight": ("ln2", "ln2", 3),
        f"{block}.mlp.fc1.weight": ("fc1", "fc1", 3),
        f"{block}.mlp.fc2.bias": ("fc2", "fc2", 3),
        # at the end of stage 0, before block 2
        "swin.encoder.layers.0.downsample.reduction.weight": ("patch_merging", "full", None),
        "swin.encoder.layers.0.downsample.norm.bias": ("patch_merging", "full", None),
        "swin.layernorm.weight": ("head", "head", None),
        "classifier.weight": ("head", "head", None),
    }
    for name, (group, trained_by, index) in expected.items():
        owner = owners[name]
        assert (owner.group, owner.trained_by, owner.block) == (group, trained_by, index), name


def test_a_bare_hf_swin_is_not_finetuned() -> None:
    model = _bare("hf_swin").build()
    assert type(model).__name__ == "SwinModel"
    assert "has no classification head" in architecture_for(model).refusal("finetune", model)


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(REFERENCE))
def test_the_embedding_protocol_bounds_and_recommend_are_refused_by_name(family: str) -> None:
    case = _case(family)
    model = case.build().eval()
    inputs = case.inputs(2)
    with pytest.raises(UndefinedStage, match="stages have different widths"):
        measure(model, inputs, inputs.flip(0), protocol="embedding", batch_size=2)
    with pytest.raises(UndefinedStage, match="relative position bias to the logits"):
        undefined_bounds(model)
    with pytest.raises(UndefinedStage, match="ranks by the embedding protocol"):
        weight_statistics(model)
    architecture = architecture_for(model)
    for stage in ("plasticity in_situ", "finetune", "lora"):
        assert architecture.refusal(stage, model) is None, stage


def test_hf_swin_v2_is_known_to_no_family() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.Swinv2Config(
        image_size=32, patch_size=4, embed_dim=12, depths=[1, 1], num_heads=[1, 2], window_size=2
    )
    with pytest.raises(UnsupportedModel, match=r"Swinv2Model .*known families: .*hf_swin"):
        architecture_for(transformers.Swinv2Model(config))


def test_timm_swin_v2_is_known_to_no_family() -> None:
    import timm

    model = timm.create_model(
        "swinv2_tiny_window8_256",
        pretrained=False,
        img_size=32,
        embed_dim=12,
        depths=(1, 1),
        num_heads=(1, 2),
        window_size=4,
    )
    with pytest.raises(UnsupportedModel, match=r"SwinTransformerV2 .*known families: .*timm_swin"):
        architecture_for(model)


def test_in_situ_plasticity_of_the_classifier_is_the_bare_models() -> None:
    model = _case("hf_swin").build().eval()
    reference, downstream = _images(3, seed=1).float(), _images(2, seed=2).float()
    settings = {"protocol": "in_situ", "batch_size": 2}
    assert_frame_equal(
        measure(model, reference, downstream, **settings),
        measure(model.swin, reference, downstream, **settings),
    )


def _padded(family: str) -> torch.nn.Module:
    """A Swin of the family whose 10 x 10 and 5 x 5 grids are no whole number of 4 x 4 windows."""
    shape = {"embed_dim": 12, "depths": (2, 2), "num_heads": (2, 4), "window_size": 4}
    if family == "timm_swin":
        import timm

        return timm.create_model("swin_tiny_patch4_window7_224", img_size=40, **shape).eval()
    transformers = pytest.importorskip("transformers")
    config = transformers.SwinConfig(image_size=40, patch_size=4, **shape)
    return transformers.SwinModel(config).eval()


@pytest.mark.parametrize("family", sorted(REFERENCE))
def test_in_situ_is_refused_where_the_windows_are_padded(family: str) -> None:
    model = _padded(family)
    images = torch.randn(2, 3, 40, 40, generator=torch.Generator().manual_seed(0))
    with pytest.raises(UndefinedStage, match=r"block 0's 10 x 10 grid is not a whole number of 4"):
        measure(model, images, images.flip(0), protocol="in_situ", batch_size=1)
