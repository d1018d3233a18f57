"""The hf_moe family (transformers Mixtral, Qwen2-MoE) beyond the shared contract and the float64
reference of tests/models/test_hf_text.py: FC1 and FC2 are routed views of the fused 3-D expert
parameters (and the shared expert's), the router is its own part trained by ``full`` alone, the
in-situ run is the layer's own forward, FC1 and FC2 as one linear map each are what the views
compute, and the stages not defined for an MoE are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.tiny_models import HF_TEXT_TINY_CONFIG, TINY_MODELS, perturbed
from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import (
    ParameterMap,
    UndefinedStage,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.models.architectures.hf_moe import route
from vitplasticity.models.lora import apply_lora, check_adapters_used
from vitplasticity.plasticity.measure import measure

transformers = pytest.importorskip("transformers")

CASES = {case.id: case for case in TINY_MODELS if case.family == "hf_moe"}
LAYERS = range(HF_TEXT_TINY_CONFIG["num_hidden_layers"])


def tiny(case_id: str) -> torch.nn.Module:
    return perturbed(CASES[case_id].build())


def ids(n: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, HF_TEXT_TINY_CONFIG["vocab_size"], (n, length), generator=generator)


def test_the_tiny_models_are_the_two_moe_classes() -> None:
    assert {type(tiny(case_id)).__name__ for case_id in CASES} == {"MixtralModel", "Qwen2MoeModel"}


def _groups(model: torch.nn.Module) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for name, owner in ParameterMap(architecture_for(model), model).owners.items():
        groups.setdefault(owner.group, set()).add(name)
    return groups


def _layers(*names: str) -> set[str]:
    return {f"layers.{i}.{name}" for i in LAYERS for name in names}


def test_fc1_and_fc2_own_every_experts_matrices_and_the_router_is_its_own_part() -> None:
    mixtral, qwen = _groups(tiny("mixtral_tiny")), _groups(tiny("qwen2_moe_tiny"))
    assert mixtral["fc1"] == _layers("mlp.experts.gate_up_proj")
    assert mixtral["fc2"] == _layers("mlp.experts.down_proj")
    assert mixtral["router"] == _layers("mlp.gate.weight")
    assert qwen["fc1"] == _layers(
        "mlp.experts.gate_up_proj",
        "mlp.shared_expert.gate_proj.weight",
        "mlp.shared_expert.up_proj.weight",
    )
    assert qwen["fc2"] == _layers("mlp.experts.down_proj", "mlp.shared_expert.down_proj.weight")
    assert qwen["router"] == _layers("mlp.gate.weight", "mlp.shared_expert_gate.weight")
    for groups in (mixtral, qwen):
        assert groups["ln1"] == _layers("input_layernorm.weight")
        assert groups["ln2"] == _layers("post_attention_layernorm.weight")
        assert groups["emb"] == {"embed_tokens.weight"} and groups["head"] == {"norm.weight"}


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_each_configuration_trains_exactly_its_parameters_and_only_full_the_router(
    case_id: str,
) -> None:
    model = tiny(case_id)
    parameters = ParameterMap(architecture_for(model), model)
    groups = _groups(model)
    router = groups["router"]
    assert {parameters.owners[n].trained_by for n in router} == {"full"}
    assert {parameters.group(n) for n in router} == {"other"}
    for configuration in (*COMPONENTS, "emb"):
        assert parameters.trained_names(configuration) == groups[configuration] | groups["head"]
    assert parameters.trained_names("full") == {n for n, _ in model.named_parameters()}
    assert not router & parameters.trained_names("+".join((*COMPONENTS, "emb")))


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_the_views_are_the_models_parameters_not_its_modules(case_id: str) -> None:
    model = tiny(case_id)
    architecture = architecture_for(model)
    held = {id(m) for m in model.modules()}
    block = model.layers[0]
    (fc1,), (fc2,) = (architecture.components(block)[c] for c in ("fc1", "fc2"))
    assert id(fc1) not in held and id(fc2) not in held
    assert architecture.components(block)["fc1"] == (fc1,)  # one view per MoE: hooks stay
    assert any(p is block.mlp.experts.gate_up_proj for p in fc1.parameters())
    assert any(p is block.mlp.experts.down_proj for p in fc2.parameters())
    replaced = torch.nn.Parameter(block.mlp.experts.down_proj.detach().clone())
    block.mlp.experts.down_proj = replaced
    (fc2,) = architecture.components(block)["fc2"]
    assert next(fc2.parameters()) is replaced  # a replaced parameter is held again


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_routed_fc1_runs_the_picked_experts_only(case_id: str) -> None:
    model = tiny(case_id)
    architecture = architecture_for(model)
    block = model.layers[1]
    v = torch.randn(2, 5, HF_TEXT_TINY_CONFIG["hidden_size"], dtype=torch.float64)
    with torch.no_grad():
        (fc1,) = architecture.components(block)["fc1"]
        out = fc1(v).reshape(10, -1)
        picked, weights = route(block.mlp, v)
    gate_up = block.mlp.experts.gate_up_proj  # (E, 2I, d)
    experts, rows = gate_up.shape[:2]
    routed = out[:, : experts * rows].reshape(10, experts, rows)
    k = model.config.num_experts_per_tok
    assert picked.sum(1).tolist() == [k] * 10
    assert (weights != 0).equal(picked)
    for token, expert in zip(*torch.nonzero(picked, as_tuple=True), strict=True):
        expected = gate_up[expert].detach() @ v.reshape(10, -1)[token]
        torch.testing.assert_close(routed[token, expert], expected)
    assert not routed[~picked].any()


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_the_in_situ_run_is_each_layers_own_forward(case_id: str) -> None:
    """in_situ_block goes through the mapped pieces (so the in-situ hooks see FC1 and FC2):
    layer by layer, on random tokens, it is the layer's own forward (eager experts), which
    run_block is."""
    model = tiny(case_id)
    architecture = architecture_for(model)
    embedded = architecture.embed(model, ids(2, 12, seed=0))
    context = embedded.context
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for index, block in enumerate(architecture.blocks(model)):
            x = torch.randn(embedded.tokens.shape, generator=generator, dtype=torch.float64)
            own = block(
                x,
                attention_mask=context.masks[index],
                position_embeddings=context.rotary[index],
                position_ids=context.positions,
            )
            mapped = architecture.in_situ_block(block, index, x, embedded)
            torch.testing.assert_close(mapped, own, rtol=0, atol=1e-10)
            ran = architecture.run_block(block, index, x, embedded)
            torch.testing.assert_close(ran, own, rtol=0, atol=0)


def test_the_embedding_protocols_fc2_needs_the_experts_to_cover_a_token() -> None:
    """x, zero-padded, fills the concatenated expert hiddens from expert 0 on: 2 experts of 8
    are 16 features, fewer than a token's 48: undefined, refused; the in-situ protocol runs."""
    config = transformers.MixtralConfig(
        **{**HF_TEXT_TINY_CONFIG, "intermediate_size": 8},
        num_local_experts=2,
        experts_implementation="eager",
    )
    model = perturbed(transformers.MixtralModel(config))
    reference, downstream = ids(2, 8, seed=1), ids(2, 8, seed=2)
    with pytest.raises(UnsupportedModel, match="fc2 takes 16 features, fewer than the 48"):
        measure(model, reference, downstream, protocol="embedding")
    frame = measure(model, reference, downstream, protocol="in_situ")
    assert np.isfinite(frame["ratio"].to_numpy()).all()


def test_fc1_up_mode_is_refused() -> None:
    model = tiny("mixtral_tiny")
    with pytest.raises(UnsupportedModel, match="fc1 mode 'up' needs separate gate and up"):
        measure(model, ids(2, 8, seed=1), ids(2, 8, seed=2), fc1="up")


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_stages_refused_by_name(case_id: str) -> None:
    model = tiny(case_id)
    architecture = architecture_for(model)
    for stage in ("plasticity", "finetune", "lora", "recommend", "export"):
        assert architecture.refusal(stage, model) is None, stage
    assert "RMSNorm does not centre" in architecture.refusal("bounds", model)
    with pytest.raises(UndefinedStage, match="RMSNorm does not centre"):
        architecture.attention_weights(model.layers[0].self_attn)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_the_views_as_one_linear_map_are_what_they_compute(case_id: str) -> None:
    """FC1's map with every expert picked, masked to the experts the router picks for a token,
    is FC1 of that token (so its spectral norm bounds every token's FC1, the weight factor
    recommend ranks by); FC2's map is FC2 on any input. Checked in float64 on one layer."""
    model = tiny(case_id).double()
    fc1, fc2 = (
        architecture_for(model).components(model.layers[1])["fc1"]
        + (architecture_for(model).components(model.layers[1])["fc2"])
    )
    v = torch.randn(10, HF_TEXT_TINY_CONFIG["hidden_size"], dtype=torch.float64)
    weight, bias = fc1.as_linear()
    full = v @ weight.T + (0 if bias is None else bias)
    picked, _ = route(model.layers[1].mlp, v)
    experts = model.layers[1].mlp.experts.gate_up_proj.shape
    kept = torch.ones_like(full, dtype=torch.bool)
    kept[:, : experts[0] * experts[1]] = picked.repeat_interleave(experts[1], dim=1)
    torch.testing.assert_close(fc1(v), torch.where(kept, full, 0.0), rtol=1e-12, atol=1e-12)
    assert torch.linalg.vector_norm(fc1(v), dim=1).max() <= (
        torch.linalg.matrix_norm(weight, ord=2) * torch.linalg.vector_norm(v, dim=1).max()
    )
    weight, bias = fc2.as_linear()
    hidden = torch.randn(10, weight.shape[1], dtype=torch.float64)
    expected = hidden @ weight.T + (0 if bias is None else bias)
    torch.testing.assert_close(fc2(hidden), expected, rtol=1e-12, atol=1e-12)


def test_lora_adapts_the_attention_linears() -> None:
    model = tiny("qwen2_moe_tiny")
    architecture = architecture_for(model)
    assert architecture.lora_targets(model) == [
        f"layers.{i}.self_attn.{p}_proj" for i in LAYERS for p in "qkvo"
    ]
    adapted = apply_lora(model, rank=2, alpha=4.0)
    check_adapters_used(adapted, ids(2, 6, seed=0))
    trained = ParameterMap(architecture_for(adapted), adapted).trained_names("lora")
    assert {n for n in trained if ".lora_" in n} == {
        f"layers.{i}.self_attn.{p}_proj.lora_{m}.default.weight"
        for i in LAYERS
        for p in "qkvo"
        for m in "AB"
    }


def test_a_dense_qwen2_moe_layer_is_refused() -> None:
    config = transformers.Qwen2MoeConfig(
        **HF_TEXT_TINY_CONFIG,
        num_experts=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        mlp_only_layers=[1],
    )
    model = transformers.Qwen2MoeModel(config)
    with pytest.raises(UnsupportedModel, match=r"layer 1 .*a dense MLP layer"):
        architecture_for(model).blocks(model)
