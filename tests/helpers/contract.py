"""The architectures registry's contract, as checks any test module can run on a model of a
registered family (tests/models/test_architectures.py runs them on every tiny model)."""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import Architecture, ParameterMap

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
    """Every component module the model holds runs once in its forward. A view that the model
    does not hold (an MoE's routed FC1/FC2, hf_moe) never runs there: it is skipped, and the
    composition and forward checks cover it."""
    calls: Counter[tuple[int, str, int]] = Counter()
    handles = []
    held = {id(module) for module in model.modules()}
    for index, block in enumerate(architecture.blocks(model)):
        for component, modules in architecture.components(block).items():
            for position, module in enumerate(modules):
                if id(module) not in held:
                    continue
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
        for position, module in enumerate(modules)
        if id(module) in held
    }
    assert set(calls) == expected
    assert set(calls.values()) == {1}, "a component's module ran more or less than once"


def check_forward(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> None:
    """embed + run_block reproduce the tokens the model's own forward feeds its blocks."""
    blocks = architecture.blocks(model)
    seen: dict[str, torch.Tensor] = {}

    def remember(key: str, value: torch.Tensor) -> None:
        seen[key] = value  # returns None: a hook's return value would replace the block's output

    first = blocks[0].register_forward_hook(lambda module, args, output: remember("input", args[0]))
    last = blocks[-1].register_forward_hook(
        lambda module, args, output: remember("output", architecture.hook_output(output))
    )
    try:
        with torch.no_grad():
            model(inputs)
    finally:  # removed before run_block, which must not meet them
        first.remove()
        last.remove()
    with torch.no_grad():
        embedded = architecture.embed(model, inputs)
        tokens = embedded.tokens
        for index, block in enumerate(blocks):
            tokens = architecture.run_block(block, index, tokens, embedded)
    torch.testing.assert_close(embedded.tokens, seen["input"], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(tokens, seen["output"], rtol=0, atol=TOLERANCE)


def check_composition(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> None:
    """The mapped modules, composed by the family's structure, give block(x) on random x of
    the shape the block receives (a hierarchical model's widths change between stages)."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        embedded = architecture.embed(model, inputs)
        shape = embedded.tokens.shape
        for index, block in enumerate(architecture.blocks(model)):
            x = torch.randn(shape, generator=generator, dtype=embedded.tokens.dtype)
            expected = architecture.run_block(block, index, x, embedded)
            composed = architecture.compose_block(
                block, architecture.components(block), x, embedded, index
            )
            torch.testing.assert_close(composed, expected, rtol=0, atol=TOLERANCE)
            shape = expected.shape


def check_contract(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> None:
    check_partition(architecture, model)
    check_hooks(architecture, model, inputs)
    check_forward(architecture, model, inputs)
    check_composition(architecture, model, inputs)
