"""``vitplasticity.select``: exactly a configuration's parameters train, in a loop of one's own,
and ``import vitplasticity`` stays free of torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import vitplasticity
from tests.helpers.tiny_models import TINY_MODELS, perturbed
from vitplasticity.models.architectures import UnsupportedModel, parameter_map

MODELS = {
    tiny.id: tiny
    for tiny in TINY_MODELS
    if tiny.id
    in (
        "vit_tiny_patch16_224",
        "vit_small_plus_patch16_dinov3",
        "beitv2_base_patch16_224",
        "gpt2_tiny",
        "hf_dinov2_swiglu",
    )
}


def _loss(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    output = model(inputs)
    output = getattr(output, "last_hidden_state", output)
    if output.ndim == 2:  # class logits
        return F.cross_entropy(output, torch.arange(len(output)) % output.shape[1])
    return output.square().mean()


@pytest.mark.parametrize("configuration", ["mha+fc1", "ln1", "fc2", "ln1+ln2", "emb", "full"])
@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_exactly_the_configuration_and_the_head_train(tiny_id: str, configuration: str) -> None:
    model = MODELS[tiny_id].build()
    for parameter in list(model.parameters())[::2]:
        parameter.requires_grad_(False)  # whatever it was before does not matter
    trained = vitplasticity.select(model, configuration)
    expected = parameter_map(model).trained_names(configuration)
    assert trained == [n for n, _ in model.named_parameters() if n in expected]
    assert {n for n, p in model.named_parameters() if p.requires_grad} == expected


@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_train_head_false_freezes_the_head_too(tiny_id: str) -> None:
    model = MODELS[tiny_id].build()
    owners = parameter_map(model).owners
    trained = vitplasticity.select(model, "mha+fc1", train_head=False)
    assert set(trained) == {n for n, o in owners.items() if o.trained_by in ("mha", "fc1")}
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(trained)
    with pytest.raises(ValueError, match="'head' with train_head=False trains nothing"):
        vitplasticity.select(model, "head", train_head=False)


@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_an_optimizer_step_of_ones_own_changes_only_the_selected(tiny_id: str) -> None:
    """A user's loop: torch.optim over every parameter (AdamW with weight decay: a frozen
    parameter has no gradient, so it is skipped, decay included)."""
    tiny = MODELS[tiny_id]
    model = perturbed(tiny.build()).train()
    trained = set(vitplasticity.select(model, "mha+fc1"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    inputs = tiny.inputs(4)
    if inputs.is_floating_point():
        inputs = inputs.double()  # perturbed() made the model float64
    for _ in range(3):
        optimizer.zero_grad()
        _loss(model, inputs).backward()
        optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trained


def test_lora_adapters_and_the_head_train_after_injection() -> None:
    pytest.importorskip("peft")
    from vitplasticity.models.lora import apply_lora

    model = apply_lora(MODELS["vit_tiny_patch16_224"].build(), rank=2, alpha=4)
    trained = set(vitplasticity.select(model, "lora"))
    head = {n for n, o in parameter_map(model).owners.items() if o.trained_by == "head"}
    adapters = {n for n, _ in model.named_parameters() if ".lora_" in n}  # peft's naming
    assert trained == adapters | head


def test_a_model_no_architecture_knows_is_refused_by_name() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(UnsupportedModel, match=r"Sequential \(torch\.nn\.modules\.container\)"):
        vitplasticity.select(model, "mha")
    assert all(p.requires_grad for p in model.parameters()), "refused before any change"


def test_an_unknown_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown finetuning configuration 'attn'"):
        vitplasticity.select(MODELS["vit_tiny_patch16_224"].build(), "attn")


def test_import_vitplasticity_loads_no_torch_and_select_stays_the_function() -> None:
    code = (
        "import sys, vitplasticity\n"
        "assert 'torch' not in sys.modules, 'import vitplasticity loaded torch'\n"
        "import vitplasticity.models.selection\n"
        "assert vitplasticity.select is vitplasticity.models.selection.select\n"
        "try:\n"
        "    vitplasticity.no_such_name\n"
        "except AttributeError as error:\n"
        "    assert 'no_such_name' in str(error)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
