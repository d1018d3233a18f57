"""The architectures registry's contract, for every family on a tiny random model.

For each family: every component owns parameters in every block and the component sets are
disjoint; components, embedding, head and declared others partition ``named_parameters()``;
the in-situ hooks fire once per component per block in the model's own forward pass; the
embedding and ``run_block`` reproduce the model's own forward; and the decomposition
reproduces the block: the mapped modules, composed by the family's block structure, give
``block(x)`` on random float64 tokens. A wrong mapping cannot pass (the last tests break one
on purpose and see the contract fail).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.contract import (
    check_composition,
    check_contract,
)
from tests.helpers.tiny_models import TINY_MODELS, TinyModel, perturbed
from vitplasticity.models.architectures import (
    ARCHITECTURES,
    Architecture,
    ParameterMap,
    UnsupportedModel,
    architecture_for,
)


def _tiny(case: TinyModel) -> tuple[nn.Module, torch.Tensor]:
    model = perturbed(case.build())
    inputs = case.inputs(3)
    return model, (inputs.double() if inputs.is_floating_point() else inputs)


@pytest.mark.parametrize("case", TINY_MODELS, ids=lambda case: case.id)
def test_contract(case: TinyModel) -> None:
    model, inputs = _tiny(case)
    architecture = architecture_for(model)
    assert architecture.name == case.family
    check_contract(architecture, model, inputs)


def test_every_family_has_a_tiny_model() -> None:
    assert set(ARCHITECTURES) == {case.family for case in TINY_MODELS}


# --- a wrong mapping cannot pass -------------------------------------------------------------


def _swapped(base: Architecture, first: str, second: str) -> Architecture:
    """The family of ``base`` (all its methods) with two components' modules exchanged."""

    class Swapped(type(base)):
        def components(self, block, fc1="stage"):
            parts = dict(super().components(block, fc1))
            parts[first], parts[second] = parts[second], parts[first]
            return parts

    return Swapped()


def _first_of_each_family() -> list[TinyModel]:
    first: dict[str, TinyModel] = {}
    for case in TINY_MODELS:
        first.setdefault(case.family, case)
    return list(first.values())


@pytest.mark.parametrize("case", _first_of_each_family(), ids=lambda case: case.family)
@pytest.mark.parametrize("swap", [("ln1", "ln2"), ("fc1", "fc2")])
def test_a_swapped_mapping_fails_the_contract(case: TinyModel, swap: tuple[str, str]) -> None:
    model, inputs = _tiny(case)
    broken = _swapped(architecture_for(model), *swap)
    with pytest.raises((AssertionError, RuntimeError)) as failure:
        check_composition(broken, model, inputs)
    # NotImplementedError is a RuntimeError: a method the swap lost is not a failed contract.
    assert not isinstance(failure.value, NotImplementedError)


def test_a_component_missing_from_the_map_is_an_unaccounted_parameter() -> None:
    model, _ = _tiny(TINY_MODELS[1])  # DeiT3: layer scale declared with mha and fc2
    architecture = architecture_for(model)

    class Undeclared(type(architecture)):
        def declared(self, model):
            return []

    with pytest.raises(UnsupportedModel, match=r"does not account for: blocks\.0\.ls1\.gamma"):
        ParameterMap(Undeclared(), model)


def test_unknown_model_class_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedModel, match=r"Sequential .*known families: timm_vit"):
        architecture_for(nn.Sequential(nn.Linear(2, 2)))


# --- family specifics ------------------------------------------------------------------------


def _case(case_id: str) -> TinyModel:
    return next(case for case in TINY_MODELS if case.id == case_id)


def test_gated_fc1_is_the_stage_or_the_up_projection() -> None:
    model = _case("vit_small_plus_patch16_dinov3").build()
    architecture = architecture_for(model)
    mlp = model.blocks[0].mlp
    assert architecture.components(model.blocks[0])["fc1"] == (mlp.fc1_g, mlp.fc1_x)
    assert architecture.components(model.blocks[0], fc1="up")["fc1"] == (mlp.fc1_x,)
    owners = ParameterMap(architecture, model).owners
    assert owners["blocks.0.mlp.fc1_g.weight"].group == "fc1"  # ownership: the whole stage
    packed = _case("eva02_tiny_patch14_224").build()  # GluMlp: gate and up in one Linear
    with pytest.raises(UnsupportedModel, match="packs both in one Linear"):
        architecture_for(packed).components(packed.blocks[0], fc1="up")


def test_attention_biases_and_layer_scale_are_declared_with_their_component() -> None:
    for case_id in ("vit_small_patch16_dinov3_qkvb", "beit_base_patch16_224"):
        model = _case(case_id).build()
        owners = ParameterMap(architecture_for(model), model).owners
        assert owners["blocks.1.attn.q_bias"].trained_by == "mha"
        assert owners["blocks.1.attn.v_bias"].trained_by == "mha"
        assert owners["blocks.1.gamma_1"].trained_by == "mha"
        assert owners["blocks.1.gamma_2"].trained_by == "fc2"
    dinov2 = _case("vit_small_patch14_reg4_dinov2").build()
    owners = ParameterMap(architecture_for(dinov2), dinov2).owners
    assert owners["blocks.0.ls1.gamma"].trained_by == "mha"
    assert owners["blocks.0.ls2.gamma"].trained_by == "fc2"
    assert owners["reg_token"].trained_by == "emb"


def test_post_norm_blocks_are_refused_by_name() -> None:
    import timm

    model = timm.create_model(
        "eva02_tiny_patch14_224",
        pretrained=False,
        img_size=28,
        embed_dim=48,
        depth=2,
        num_heads=3,
        use_post_norm=True,
    )
    with pytest.raises(UnsupportedModel, match="EvaBlockPostNorm, not a pre-norm EvaBlock"):
        architecture_for(model).blocks(model)


@pytest.mark.parametrize(
    ("case_id", "reason"),
    [
        ("vit_small_patch16_dinov3", "rotary position embedding"),
        ("vit_base_patch16_rope_reg1_gap_256", "rotary position embedding"),
        ("beit_base_patch16_224", "relative position bias"),
        ("vit_tiny_patch16_224", None),
    ],
)
def test_mha_bound_refusal_names_the_reason(case_id: str, reason: str | None) -> None:
    model = _case(case_id).build()
    refusal = architecture_for(model).mha_bound_refusal(model)
    assert refusal is None if reason is None else reason in refusal
