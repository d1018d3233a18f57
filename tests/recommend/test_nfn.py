"""PLoP's normalised feature norm (recommend/nfn.py): against a direct float64 computation on
a tiny timm ViT and a tiny gated DINOv3, reproducible, the model left as it was, refusals by
name; and the criterion through recommend (n/a for the norms, lowest first) and the
criteria-vs-accuracy table and figure."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.latex import compile_tables, needs_latex
from tests.helpers.tiny_models import TINY_MODELS, perturbed
from vitplasticity.components import COMPONENTS
from vitplasticity.criteria import RECOMMEND_CRITERIA, REGISTRY
from vitplasticity.models.architectures import UnsupportedModel, architecture_for
from vitplasticity.recommend.criteria import CRITERIA, Measurements, pooled_estimate
from vitplasticity.recommend.nfn import NFN_SCHEMA, ROUTED_VIEW, feature_norm_statistics
from vitplasticity.recommend.ranking import build_table, greedy_union, markdown, select
from vitplasticity.report import criteria as C
from vitplasticity.report.tables import criteria_csv, criteria_table

TINY = {model.id: model for model in TINY_MODELS}
SEED = 7


def _tiny(model_id: str) -> tuple[nn.Module, torch.Tensor]:
    """A tiny model of TINY_MODELS, float64 and moved far from its init, and 3 inputs."""
    tiny = TINY[model_id]
    return perturbed(tiny.build()), tiny.inputs(3).double()


# ---------------------------------------------------------------------------------------------
# The direct computation: the model's forward pass written out in float64, and NFN from the
# linear inputs it gives, with the documented random inputs.


def _layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + norm.eps) * norm.weight + norm.bias


def _heads(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, ...]:
    b, n, _ = qkv.shape
    return tuple(qkv.reshape(b, n, 3, num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_h)) v, heads merged back: (B, n, h d_h)."""
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    out = weights @ v
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1)


def _direct_nfn(maps: list[tuple[torch.Tensor, torch.Tensor]], seed: int) -> list[float]:
    """NFN of each (input (B, n, d), weight (out, d)) map, in order: numpy float64 norms, the
    random inputs drawn as documented (one CPU generator, one (tokens, d) draw per map)."""
    generator = torch.Generator().manual_seed(seed)
    values = []
    for inputs, weight in maps:
        z = inputs.detach().reshape(-1, inputs.shape[-1]).numpy()
        w = weight.detach().numpy()
        g = torch.randn(z.shape, generator=generator, dtype=torch.float64).numpy()
        r = g / np.linalg.norm(g, axis=1, keepdims=True) * np.linalg.norm(z, axis=1, keepdims=True)
        real = np.linalg.norm(z @ w.T, axis=1).mean()
        random = np.linalg.norm(r @ w.T, axis=1).mean()
        values.append(real / random)
    return values


def _vit_maps(model: nn.Module, images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, weight) of qkv, proj, fc1, fc2 of every block of a timm ViT, from a forward pass
    written here (checked against the model's blocks)."""
    x = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    expected = model.blocks(x)
    maps = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        h1 = _layer_norm(x, block.norm1)
        q, k, v = _heads(h1 @ attn.qkv.weight.T + attn.qkv.bias, attn.num_heads)
        merged = _attend(q, k, v)
        x = x + merged @ attn.proj.weight.T + attn.proj.bias
        h2 = _layer_norm(x, block.norm2)
        hidden = F.gelu(h2 @ mlp.fc1.weight.T + mlp.fc1.bias)  # exact erf GELU, as timm's
        x = x + hidden @ mlp.fc2.weight.T + mlp.fc2.bias
        maps += [
            (h1, attn.qkv.weight),
            (merged, attn.proj.weight),
            (h2, mlp.fc1.weight),
            (hidden, mlp.fc2.weight),
        ]
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-10)
    return maps


def test_nfn_equals_a_direct_float64_computation_on_a_tiny_vit() -> None:
    model, images = _tiny("vit_tiny_patch16_224")
    table = feature_norm_statistics(model, images, seed=SEED)
    assert table.schema == pl.Schema(NFN_SCHEMA)
    expected = _direct_nfn(_vit_maps(model, images), SEED)
    assert table["nfn"].to_list() == pytest.approx(expected, rel=1e-12)
    blocks = len(model.blocks)
    assert table["block"].to_list() == [b for b in range(blocks) for _ in range(4)]
    assert table["component"].to_list() == ["mha", "mha", "fc1", "fc2"] * blocks
    assert table["modules"].to_list()[:4] == [
        "blocks.0.attn.qkv",
        "blocks.0.attn.proj",
        "blocks.0.mlp.fc1",
        "blocks.0.mlp.fc2",
    ]
    assert set(table["n_tokens"]) == {3 * 17}  # 3 images x (16 patches + cls)
    ratio = table["real_norm"] / table["random_norm"]
    assert ratio.to_list() == pytest.approx(table["nfn"].to_list(), rel=1e-15)
    # Far from init the weights are not random: some map is aligned with its inputs, none is 1.
    assert not np.allclose(table["nfn"].to_numpy(), 1.0, atol=1e-3)


def _gated_maps(model: nn.Module, images: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, weight) of qkv, proj, the gated FC1 (gate and up stacked) and fc2 of every
    block of a timm DINOv3 with a SwiGLU MLP, the rotary attention written out."""
    from timm.layers import apply_rot_embed_cat

    tokens, rope = model._pos_embed(model.patch_embed(images))
    x = model.norm_pre(tokens)
    maps = []
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        assert attn.q_bias is None and attn.qkv.bias is None and isinstance(mlp.norm, nn.Identity)
        h1 = _layer_norm(x, block.norm1)
        q, k, v = _heads(h1 @ attn.qkv.weight.T, attn.num_heads)
        prefix, half = attn.num_prefix_tokens, getattr(attn, "rotate_half", False)
        q, k = (
            torch.cat([t[:, :, :prefix], apply_rot_embed_cat(t[:, :, prefix:], rope, half=half)], 2)
            for t in (q, k)
        )
        merged = _attend(q, k, v)
        expected = block(x, rope=rope)
        attended = merged @ attn.proj.weight.T + attn.proj.bias
        x = x + (attended if block.gamma_1 is None else block.gamma_1 * attended)
        h2 = _layer_norm(x, block.norm2)
        gate = h2 @ mlp.fc1_g.weight.T + mlp.fc1_g.bias
        up = h2 @ mlp.fc1_x.weight.T + mlp.fc1_x.bias
        hidden = F.silu(gate) * up
        out = hidden @ mlp.fc2.weight.T + mlp.fc2.bias
        x = x + (out if block.gamma_2 is None else block.gamma_2 * out)
        torch.testing.assert_close(x, expected, rtol=0, atol=1e-10)
        maps += [
            (h1, attn.qkv.weight),
            (merged, attn.proj.weight),
            (h2, torch.cat([mlp.fc1_g.weight, mlp.fc1_x.weight])),  # the stage's joint map
            (hidden, mlp.fc2.weight),
        ]
    return maps


def test_a_gated_fc1_is_one_map_gate_and_up_stacked() -> None:
    """DINOv3 S+ (SwiGLU): one FC1 row per block whose NFN is that of [W_gate; W_up]."""
    model, images = _tiny("vit_small_plus_patch16_dinov3")
    table = feature_norm_statistics(model, images, seed=SEED)
    expected = _direct_nfn(_gated_maps(model, images), SEED)
    assert table["nfn"].to_list() == pytest.approx(expected, rel=1e-12)
    fc1 = table.filter(pl.col("component") == "fc1")
    assert fc1["modules"].to_list() == [
        f"blocks.{b}.mlp.fc1_g+blocks.{b}.mlp.fc1_x" for b in range(len(model.blocks))
    ]
    # The joint value, not the mean of the two linears' own NFNs (same random inputs).
    h2, _ = _gated_maps(model, images)[2]
    mlp = model.blocks[0].mlp
    gate, up = _direct_nfn([(h2, mlp.fc1_g.weight)], 0), _direct_nfn([(h2, mlp.fc1_x.weight)], 0)
    joint = _direct_nfn([(h2, torch.cat([mlp.fc1_g.weight, mlp.fc1_x.weight]))], 0)
    assert joint[0] != pytest.approx((gate[0] + up[0]) / 2, rel=1e-6)


# ---------------------------------------------------------------------------------------------
# Reproducible, side-effect free, strict


def test_the_same_seed_gives_the_same_value_and_the_model_is_left_as_it_was() -> None:
    model, images = _tiny("vit_tiny_patch16_224")
    before = model(images)
    state = {name: value.clone() for name, value in model.state_dict().items()}
    first = feature_norm_statistics(model, images, seed=SEED)
    again = feature_norm_statistics(model, images, seed=SEED)
    other = feature_norm_statistics(model, images, seed=SEED + 1)
    assert first.equals(again)
    assert first["real_norm"].equals(other["real_norm"])  # the real inputs do not depend on it
    assert not first["nfn"].equals(other["nfn"])
    assert all(torch.equal(state[name], value) for name, value in model.state_dict().items())
    assert torch.equal(model(images), before)
    assert not any(layer._forward_hooks for layer in model.modules())


def test_eva_with_qv_biases_is_switched_to_call_qkv_and_back() -> None:
    """DINOv3 with q/v biases reads qkv's weight without calling it; the pass switches its
    attention to qkv(x) + bias, then restores it: the model computes as before."""
    model, images = _tiny("vit_small_patch16_dinov3_qkvb")
    assert model.blocks[0].attn.q_bias is not None
    flags = [block.attn.qkv_bias_separate for block in model.blocks]
    before = model(images)
    table = feature_norm_statistics(model, images, seed=SEED)
    assert table.filter(pl.col("component") == "mha")["modules"].to_list()[:2] == [
        "blocks.0.attn.qkv",
        "blocks.0.attn.proj",
    ]
    assert [block.attn.qkv_bias_separate for block in model.blocks] == flags == [False] * 2
    assert torch.equal(model(images), before)


def test_every_family_has_mha_fc1_fc2_maps_and_no_norm() -> None:
    for tiny in TINY_MODELS:
        if tiny.family == "hf_moe":  # FC1 and FC2 are routed views: below
            continue
        if tiny.id == "deberta_v2_tiny":  # its shared position keys: below
            continue
        model = tiny.build().eval()
        table = feature_norm_statistics(model, tiny.inputs(2))
        blocks = table["block"].n_unique()
        assert set(table["component"]) == {"mha", "fc1", "fc2"}, tiny.id
        for component in ("fc1", "fc2"):
            assert table.filter(pl.col("component") == component).height == blocks, tiny.id
        assert table["nfn"].is_finite().all(), tiny.id


@pytest.mark.parametrize("case", ["mixtral_tiny", "qwen2_moe_tiny"])
def test_an_moe_whose_fc1_and_fc2_are_views_has_their_nfn_na_with_the_reason(case: str) -> None:
    """No linear layer of a Mixtral is FC1 or FC2 (its experts are fused 3-D parameters, read
    through views): their rows are n/a with the reason, one per block, and the attention's
    maps are measured as any decoder's (a Qwen2-MoE's shared expert is inside the view too)."""
    (tiny,) = (t for t in TINY_MODELS if t.id == case)
    model = tiny.build().eval()
    table = feature_norm_statistics(model, tiny.inputs(2))
    blocks = len(architecture_for(model).blocks(model))
    routed = table.filter(pl.col("component").is_in(["fc1", "fc2"]))
    assert routed.height == 2 * blocks
    assert routed["nfn"].is_nan().all() and set(routed["reason"]) == {ROUTED_VIEW}
    attention = table.filter(pl.col("component") == "mha")
    assert set(attention["block"]) == set(range(blocks))
    assert attention["nfn"].is_finite().all() and attention["reason"].is_null().all()


def test_a_deberta_sharing_its_position_keys_is_refused_naming_the_projections() -> None:
    """DeBERTa-v3 (``share_att_key``) runs the relative embeddings through each layer's
    query_proj and key_proj too: two inputs per linear, so no one feature norm. NFN says so by
    name rather than average them (recommend --text, NFN's text user, refuses encoders anyway)."""
    (tiny,) = (t for t in TINY_MODELS if t.id == "deberta_v2_tiny")
    assert tiny.build().config.share_att_key
    with pytest.raises(UnsupportedModel, match=r"attention\.self\.query_proj was called 2 times"):
        feature_norm_statistics(tiny.build().eval(), tiny.inputs(2))


def test_a_linear_not_called_or_called_twice_is_refused_by_name() -> None:
    model, images = _tiny("vit_tiny_patch16_224")
    model.blocks[0].attn.unused = nn.Linear(48, 48).double()
    with pytest.raises(UnsupportedModel, match=r"blocks\.0\.attn\.unused was called 0 times"):
        feature_norm_statistics(model, images)
    del model.blocks[0].attn.unused
    model.blocks[1].mlp.fc2 = model.blocks[0].mlp.fc2  # one Linear in two blocks
    with pytest.raises(UnsupportedModel, match=r"blocks\.0\.mlp\.fc2 was called 2 times"):
        feature_norm_statistics(model, images)
    assert not any(layer._forward_hooks for layer in model.modules())


def test_training_mode_and_unknown_models_are_refused() -> None:
    model, images = _tiny("vit_tiny_patch16_224")
    with pytest.raises(ValueError, match=r"model\.eval\(\)"):
        feature_norm_statistics(model.train(), images)
    with pytest.raises(UnsupportedModel, match="Sequential"):
        feature_norm_statistics(nn.Sequential(nn.Linear(3, 3)).eval(), torch.zeros(1, 3))


# ---------------------------------------------------------------------------------------------
# In recommend: pooled per configuration, n/a for the norms, lowest first

PARAMETERS = {"ln1": 10, "mha": 100, "ln2": 10, "fc1": 50, "fc2": 50}


def _measurements(nfn: dict[str, list[float]]) -> Measurements:
    """Measurements whose NFN maps are ``nfn`` per component and whose other criteria are
    constant (they rank by parameter count alone)."""
    pairs = pl.DataFrame(
        [{"component": c, "block": 0, "pair": p, "ratio": 1.0} for c in COMPONENTS for p in (0, 1)]
    )
    tensors = pl.DataFrame(
        [{"component": c, "relative_gradient_norm": 1.0, "gradient_snr": 1.0} for c in COMPONENTS]
    )
    weights = pl.DataFrame([{"component": c, "weight_spectral": 1.0} for c in COMPONENTS])
    features = pl.DataFrame(
        [
            {"block": b, "component": c, "nfn": value}
            for c, values in nfn.items()
            for b, value in enumerate(values)
        ],
        schema={"block": pl.Int64, "component": pl.String, "nfn": pl.Float64},
    )
    return Measurements(pairs, tensors, weights, dict(PARAMETERS), 7, features=features)


NFN_VALUES = {"mha": [0.9, 1.1, 1.6], "fc1": [1.2, 1.4, 1.3], "fc2": [0.8, 1.0, 1.5]}


def test_nfn_pools_the_maps_and_norms_have_none() -> None:
    features = _measurements(NFN_VALUES).features
    for parts, maps in (
        (("mha",), NFN_VALUES["mha"]),
        (("mha", "fc1"), NFN_VALUES["mha"] + NFN_VALUES["fc1"]),
        (("ln2", "fc1"), NFN_VALUES["fc1"]),  # a norm adds no map
    ):
        estimate = pooled_estimate("nfn", features, parts)
        assert estimate.value == pytest.approx(np.mean(maps)) and estimate.n_items == len(maps)
        assert estimate.ci_low is None
    for norms in (("ln1",), ("ln2",), ("ln1", "ln2")):
        estimate = pooled_estimate("nfn", features, norms)
        assert math.isnan(estimate.value) and estimate.n_items == 0


def test_nfn_ranks_the_lowest_first_and_the_norms_last() -> None:
    assert "nfn" in CRITERIA
    configurations = ["ln1", "mha", "ln2", "fc1", "fc2", "mha+fc1", "ln1+ln2"]
    table = build_table(_measurements(NFN_VALUES), configurations, model="m", dataset="d")
    nfn = table.filter(pl.col("criterion") == "nfn").sort("rank")
    # fc2 1.1 < mha 1.2 < mha+fc1 1.25 < fc1 1.3, then the norms (NaN), fewer parameters first.
    assert nfn["configuration"].to_list() == [
        "fc2",
        "mha",
        "mha+fc1",
        "fc1",
        "ln1",
        "ln2",
        "ln1+ln2",
    ]
    assert nfn.filter(pl.col("configuration").str.starts_with("ln"))["value"].is_nan().all()
    assert select(table, "nfn", None).configuration == "fc2"
    assert select(table, "nfn", 10).configuration is None  # the norms fit, but have no NFN
    values = {c: _measurements(NFN_VALUES).estimates(c)["nfn"].value for c in COMPONENTS}
    union = greedy_union(values, PARAMETERS, 160, "nfn")
    assert union.configuration == "mha+fc2" and union.trainable_parameters == 150
    # The other criteria still rank the highest value first.
    assert select(table, "plasticity", None).configuration in ("ln1", "ln2")


def test_the_report_says_nfn_is_lowest_first_and_n_a_for_norms() -> None:
    table = build_table(
        _measurements(NFN_VALUES), ["ln1", "mha", "fc2", "ln1+ln2"], model="m", dataset="d"
    )
    text = markdown(
        table,
        select(table, "nfn", None),
        model="vit_x",
        dataset="pets",
        reference="r",
        always_trained=7,
    )
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| rank |"))
    nfn_column = [cell.strip() for cell in header.split("|")].index("NFN")
    rows = {
        line.split("|")[2].strip(): line.split("|")[nfn_column].strip()
        for line in lines
        if line.startswith("| ")
    }
    assert rows["LN1"] == "n/a (3)" and rows["LN1+LN2"] == "n/a (4)"
    assert rows["FC2"] == "1.1 (1)"
    assert "**Recommendation: finetune FC2**" in text
    assert "configuration of lowest NFN" in text and "PLoP's heuristic" in text
    assert "ranks its *lowest* value first" in text and "no NFN, Spectrum SNR or kappa (n/a" in text
    combined = markdown(
        table,
        greedy_union({"mha": 1.2, "fc2": 1.1, "ln1": math.nan}, PARAMETERS, 60, "nfn"),
        model="vit_x",
        dataset="pets",
        reference="r",
        always_trained=7,
    )
    assert "in increasing NFN" in combined


# ---------------------------------------------------------------------------------------------
# In the criteria-vs-accuracy table and figure


DATASETS = ["ds_a", "ds_b", "ds_c", "ds_d"]
LINEAR = ("mha", "fc1", "fc2")


def _recommend_nfn(datasets: list[str]) -> pl.DataFrame:
    """Recommend tables of NFN (random, lowest first, the norms NaN and last) and gradient SNR
    (constant) rows."""
    rng = np.random.default_rng(5)
    tables = []
    for dataset in datasets:
        values = rng.uniform(0.8, 1.6, 3)
        measurements = _measurements({c: [float(values[i])] for i, c in enumerate(LINEAR)})
        tables.append(
            build_table(measurements, list(COMPONENTS), model="vit", dataset=dataset).filter(
                pl.col("criterion").is_in(["nfn", "gradient_snr"])
            )
        )
    return pl.concat(tables)


def _selected(datasets: list[str]) -> pl.DataFrame:
    rng = np.random.default_rng(11)
    return pl.DataFrame(
        [
            {
                "experiment": "sgd",
                "model": "vit",
                "dataset": d,
                "configuration": c,
                "test_accuracy_mean": float(rng.uniform(0.5, 0.9)),
            }
            for d in datasets
            for c in COMPONENTS
        ]
    )


def test_the_criteria_table_has_nfn_over_the_linear_components_and_says_why() -> None:
    recommend = _recommend_nfn(DATASETS)
    criteria = C.recommend_criteria(recommend)
    nfn = criteria.filter(pl.col("criterion") == "nfn")
    assert set(nfn["configuration"]) == {"mha", "fc1", "fc2"}  # no score for the norms
    values = dict(
        recommend.filter((pl.col("criterion") == "nfn") & (pl.col("dataset") == "ds_a"))
        .select("configuration", "value")
        .rows()
    )
    scores = dict(nfn.filter(pl.col("dataset") == "ds_a").select("configuration", "score").rows())
    assert scores == {c: -values[c] for c in scores}  # lowest first: the score is -NFN
    result = C.analyse(criteria, _selected(DATASETS))
    rows = result.filter((pl.col("level") == "dataset") & (pl.col("criterion") == "nfn"))
    assert set(rows["configurations"]) == {"mha,fc1,fc2"} and set(rows["n"]) == {3}
    assert all("no score for ln1; no score for ln2; a norm holds" in n for n in rows["note"])
    assert C.unscored_configurations(result) == {("vit", "nfn"): ["ln1", "ln2"]}

    text = criteria_table(result)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("Dataset &"))
    columns = header.removesuffix(r" \\").split(" & ")
    na = next(line for line in lines if line.startswith("n/a &")).removesuffix(r" \\").split(" & ")
    assert len(na) == len(columns)
    assert na[columns.index("NFN")] == "LN1, LN2"
    assert all(cell == "" for i, cell in enumerate(na[1:], 1) if i != columns.index("NFN"))
    assert "n/a: the configurations a criterion has no value for" in text
    assert "NFN: a norm holds no linear map" in text
    csv = pl.read_csv(criteria_csv(result).encode(), infer_schema_length=0)
    na_row = csv.filter(pl.col("Row") == "n/a").row(0, named=True)
    assert na_row["NFN"] == "LN1, LN2" and na_row["Grad. SNR"] is None


def test_a_table_where_every_criterion_scores_every_configuration_has_no_n_a_row() -> None:
    criteria = C.recommend_criteria(_recommend_nfn(DATASETS))
    result = C.analyse(criteria, _selected(DATASETS), configurations=["mha", "fc1", "fc2"])
    assert set(result["criterion"]) == {"nfn", "gradient_snr"}
    assert C.unscored_configurations(result) == {}
    assert "n/a" not in criteria_table(result)


def test_the_criteria_figure_names_what_nfn_leaves_out(tmp_path: Path) -> None:
    from vitplasticity.report.criteria_figure import criteria_figure

    result = C.analyse(C.recommend_criteria(_recommend_nfn(DATASETS)), _selected(DATASETS))
    out = tmp_path / "criteria.svg"
    criteria_figure(result, [out])
    ticks = re.findall(r">([^<>]+)</text>", out.read_text())
    assert "NFN (no LN1, LN2)" in ticks
    assert any(tick.startswith("Grad. SNR") for tick in ticks)
    assert not any("no " in tick for tick in ticks if not tick.startswith("NFN"))


@needs_latex
def test_the_criteria_table_with_nfn_compiles(tmp_path: Path) -> None:
    result = C.analyse(C.recommend_criteria(_recommend_nfn(DATASETS)), _selected(DATASETS))
    compile_tables(tmp_path, {"criteria": criteria_table(result, demo=True)})


@pytest.mark.parametrize("criterion", RECOMMEND_CRITERIA)
def test_the_recommendation_rests_on_its_own_criterions_heuristic(criterion: str) -> None:
    """KappaTune's recommendation cites KappaTune, not PLoP (both rank their lowest first)."""
    table = build_table(
        _measurements(NFN_VALUES), ["ln1", "mha", "fc2", "ln1+ln2"], model="m", dataset="d"
    )
    text = markdown(
        table,
        select(table, criterion, None),
        model="vit_x",
        dataset="pets",
        reference="r",
        always_trained=7,
    )
    said = [entry.basis for entry in REGISTRY.values() if entry.basis and entry.basis in text]
    assert said == [REGISTRY[criterion].basis], said
