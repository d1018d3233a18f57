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

from collections import Counter

import pytest
import torch
from torch import nn

from tests.helpers.tiny_models import TINY_MODELS, TinyModel, perturbed
from vitplasticity import COMPONENTS
from vitplasticity.architectures import (
    ARCHITECTURES,
    Architecture,
    ParameterMap,
    UnsupportedModel,
    architecture_for,
)

TOLERANCE = 1e-5


def check_partition(architecture: Architecture, model: nn.Module) -> None:
    owners = ParameterMap(architecture, model).owners  # raises on an unclaimed parameter
    assert set(owners) == {name for name, _ in model.named_parameters()}
    blocks = architecture.blocks(model)
    for index, block in enumerate(blocks):
        seen: set[int] = set()
        for component, modules in architecture.components(block).items():
            ids = {id(p) for module in modules for p in module.parameters()}
            assert ids, f"block {index}: {component} owns no parameter"
            assert not ids & seen, f"block {index}: {component} shares parameters"
            seen |= ids
    counts = Counter(o.group for o in owners.values())
    for component in COMPONENTS:
        assert counts[component] > 0


def check_hooks(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> None:
    calls: Counter[tuple[int, str, int]] = Counter()
    handles = []
    for index, block in enumerate(architecture.blocks(model)):
        for component, modules in architecture.components(block).items():
            for position, module in enumerate(modules):
                key = (index, component, position)
                handles.append(
                    module.register_forward_hook(lambda *_, key=key: calls.update([key]))
                )
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    expected = {
        (index, component, position)
        for index, block in enumerate(architecture.blocks(model))
        for component, modules in architecture.components(block).items()
        for position in range(len(modules))
    }
    assert set(calls) == expected
    assert set(calls.values()) == {1}, "a component's module ran more or less than once"


def check_forward(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> None:
    """embed + run_block reproduce the tokens the model's own forward feeds its blocks."""
    blocks = architecture.blocks(model)
    seen: dict[str, torch.Tensor] = {}
    first = blocks[0].register_forward_hook(
        lambda module, args, output: seen.setdefault("input", args[0])
    )
    last = blocks[-1].register_forward_hook(
        lambda module, args, output: seen.setdefault("output", architecture.hook_output(output))
    )
    try:
        with torch.no_grad():
            model(inputs)
            embedded = architecture.embed(model, inputs)
            tokens = embedded.tokens
            for index, block in enumerate(blocks):
                tokens = architecture.run_block(block, index, tokens, embedded)
    finally:
        first.remove()
        last.remove()
    torch.testing.assert_close(embedded.tokens, seen["input"], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(tokens, seen["output"], rtol=0, atol=TOLERANCE)


def check_composition(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> None:
    """The mapped modules, composed by the family's structure, give block(x) on random x."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        embedded = architecture.embed(model, inputs)
        for index, block in enumerate(architecture.blocks(model)):
            x = torch.randn(embedded.tokens.shape, generator=generator, dtype=embedded.tokens.dtype)
            expected = architecture.run_block(block, index, x, embedded)
            composed = architecture.compose_block(
                block, architecture.components(block), x, embedded, index
            )
            torch.testing.assert_close(composed, expected, rtol=0, atol=TOLERANCE)


def check_contract(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> None:
    check_partition(architecture, model)
    check_hooks(architecture, model, inputs)
    check_forward(architecture, model, inputs)
    check_composition(architecture, model, inputs)


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


class _Swapped(Architecture):
    """The family of ``base`` with two components' modules exchanged."""

    def __init__(self, base: Architecture, first: str, second: str) -> None:
        self.base, self.first, self.second = base, first, second
        self.name, self.title = base.name, base.title

    def __getattr__(self, name: str):
        return getattr(self.base, name)

    def components(self, block, fc1="stage"):
        parts = dict(self.base.components(block, fc1))
        parts[self.first], parts[self.second] = parts[self.second], parts[self.first]
        return parts

    def compose_block(self, block, components, tokens, embedded, index):
        return self.base.compose_block(block, components, tokens, embedded, index)

    def block_list(self, model):
        return self.base.block_list(model)


@pytest.mark.parametrize("swap", [("ln1", "ln2"), ("fc1", "fc2")])
def test_a_swapped_mapping_fails_the_contract(swap: tuple[str, str]) -> None:
    model, inputs = _tiny(TINY_MODELS[0])
    broken = _Swapped(architecture_for(model), *swap)
    with pytest.raises((AssertionError, RuntimeError)):
        check_composition(broken, model, inputs)


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
