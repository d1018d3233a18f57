"""recommend's export (``PREFIX.json``): the parameter names are the ParameterMap's, and its
PEFT configs, applied by peft itself to a fresh model, adapt exactly the intended modules and
train exactly the intended parameters."""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from packaging.version import Version
from torch import nn

from tests.helpers.tiny_models import TINY_MODELS, TinyModel, _timm
from tests.helpers.tiny_vit import TINY_SPEC
from vitplasticity.cli import main
from vitplasticity.models.architectures import UnsupportedModel, parameter_map
from vitplasticity.models.lora import check_adapters_used
from vitplasticity.recommend.export import (
    build_export,
    modules_to_save_matches,
    target_matches,
)
from vitplasticity.recommend.ranking import configuration_label
from vitplasticity.utils.io import read_parquet_metadata, write_json

peft = pytest.importorskip("peft")

MODELS = {
    tiny.id: tiny
    for tiny in TINY_MODELS
    if tiny.id
    in (
        "vit_tiny_patch16_224",  # timm ViT
        "vit_small_plus_patch16_dinov3",  # timm Eva, SwiGLU (fc1 = fc1_g + fc1_x)
        "vit_small_patch16_dinov3_qkvb",  # timm Eva with q/v biases (attributes to set)
        "beitv2_base_patch16_224",  # timm Beit
        "gpt2_tiny",  # transformers GPT2 (Conv1D)
        "hf_dinov2_swiglu",  # transformers Dinov2Model, SwiGLU (fc1 = gate_proj + up_proj)
    )
}
CONFIGURATIONS = ("ln1", "mha", "fc1", "mha+fc1", "ln1+ln2", "ln2+fc2")
NORMS = ("ln1", "ln2")


@pytest.fixture(autouse=True)
def _quiet() -> None:
    # peft warns about every LayerNorm LNTuning copies and every Conv1D it flips.
    warnings.filterwarnings("ignore", category=UserWarning, module="peft")


def _export(tiny: TinyModel, configuration: str | None) -> dict:
    return build_export(tiny.build(), configuration, model_name=tiny.id, model_entry={})


def _parts(configuration: str) -> tuple[str, ...]:
    return tuple(configuration.split("+"))


def _output(model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    output = model(inputs)
    return getattr(output, "last_hidden_state", output)


def _intended_linears(model: nn.Module, components: tuple[str, ...]) -> set[str]:
    """The linear modules whose weight one of ``components`` owns, by the ParameterMap."""
    owners = parameter_map(model).owners
    return {
        name
        for name, module in model.named_modules()
        if (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D")
        and owners[f"{name}.weight"].trained_by in components
    }


def _names(model: nn.Module, trained_by: tuple[str, ...]) -> set[str]:
    return {n for n, o in parameter_map(model).owners.items() if o.trained_by in trained_by}


def _set_attributes(model: nn.Module, attributes: dict) -> None:
    for path, value in attributes.items():
        owner, _, attribute = path.rpartition(".")
        setattr(model.get_submodule(owner), attribute, value)


def _strip(name: str) -> str:
    return name.removeprefix("base_model.model.")


def _check_gradients(model: nn.Module, inputs: torch.Tensor) -> None:
    """Every trainable parameter is on the forward path (it gets a gradient); no frozen one
    gets any."""
    _output(model, inputs).square().mean().backward()
    for name, parameter in model.named_parameters():
        assert (parameter.grad is not None) == parameter.requires_grad, name


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_the_names_are_the_parameter_maps(tiny_id: str, configuration: str) -> None:
    tiny = MODELS[tiny_id]
    model = tiny.build()
    export = build_export(model, configuration, model_name=tiny_id, model_entry={"a": 1})
    parameters = parameter_map(model)
    order = [name for name, _ in model.named_parameters()]
    assert export["configuration"] == configuration
    assert export["components"] == list(_parts(configuration))
    chosen = export["parameters"]["components"]
    assert chosen == {c: parameters.component_names(c) for c in _parts(configuration)}
    always = export["parameters"]["always_trained"]
    assert always == [n for n in order if n in parameters.trained_names("head")]
    everything = [n for names in chosen.values() for n in names] + always
    assert len(everything) == len(set(everything))
    assert set(everything) == parameters.trained_names(configuration)
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    counts = export["counts"]
    assert counts["components"] == {c: sum(sizes[n] for n in chosen[c]) for c in chosen}
    assert counts["always_trained"] == sum(sizes[n] for n in always)
    assert counts["trained"] == sum(sizes[n] for n in everything)
    assert counts["model"] == sum(sizes.values())
    assert export["model"]["entry"] == {"a": 1}
    assert export["model"]["class"].endswith(type(model).__name__)


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_lora_config_applied_by_peft_adapts_exactly_the_linear_components(
    tiny_id: str, configuration: str
) -> None:
    tiny = MODELS[tiny_id]
    export = _export(tiny, configuration)
    linear = tuple(c for c in _parts(configuration) if c not in NORMS)
    lora = export["peft"]["lora"]
    if not linear:
        assert lora is None
        return
    model = tiny.build()
    intended = _intended_linears(model, linear)
    norms = _names(model, tuple(c for c in _parts(configuration) if c in NORMS))
    head = _names(model, ("head",))
    _set_attributes(model, lora["set_attributes"])
    model = peft.get_peft_model(model, peft.LoraConfig(**lora["config"]))

    from peft.tuners.lora import LoraLayer

    adapted = {_strip(n) for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    assert adapted == intended
    trainable = {_strip(n) for n, p in model.named_parameters() if p.requires_grad}
    adapters = {n for n in trainable if ".lora_" in n}
    assert adapters == {f"{m}.lora_{ab}.default.weight" for m in intended for ab in "AB"}
    copies = trainable - adapters
    assert all(".modules_to_save.default." in n for n in copies)
    assert {n.replace(".modules_to_save.default", "") for n in copies} == norms | head
    lora_size = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    assert export["counts"]["lora_adapters"] == lora_size
    for component in linear:
        form = export["peft"]["forms"][component]
        names = _names(tiny.build(), (component,))
        assert form["form"] == "lora" and set(form["adapted"]) <= names
        assert set(form["frozen"]) == names - set(form["adapted"])
    inputs = tiny.inputs(2)
    check_adapters_used(model, inputs)
    _check_gradients(model, inputs)


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_ln_tuning_config_applied_by_peft_trains_exactly_the_norms_and_head(
    tiny_id: str, configuration: str
) -> None:
    tiny = MODELS[tiny_id]
    export = _export(tiny, configuration)
    norms = tuple(c for c in _parts(configuration) if c in NORMS)
    ln_tuning = export["peft"]["ln_tuning"]
    if not norms:
        assert ln_tuning is None
        return
    model = tiny.build()
    intended = _names(model, norms)
    head = _names(model, ("head",))
    model = peft.inject_adapter_in_model(peft.LNTuningConfig(**ln_tuning["config"]), model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    tuned = {n for n in trainable if ".ln_tuning_layers.default." in n}
    assert {n.replace(".ln_tuning_layers.default", "") for n in tuned} == intended
    copies = trainable - tuned
    assert all(".modules_to_save.default." in n for n in copies)
    assert {n.replace(".modules_to_save.default", "") for n in copies} == head
    for component in norms:
        assert export["peft"]["forms"][component]["form"] == "ln_tuning"
        assert export["peft"]["forms"][component]["frozen"] == []
    _check_gradients(model, tiny.inputs(2))


def test_the_attributes_to_set_put_every_adapter_on_the_forward_path() -> None:
    """Eva with q/v biases reads qkv.weight itself unless qkv_bias_separate is set: the export
    names that attribute, and leaves the model it was built from as it was."""
    tiny = MODELS["vit_small_patch16_dinov3_qkvb"]
    model = tiny.build()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    export = build_export(model, "mha", model_name=tiny.id, model_entry={})
    attributes = export["peft"]["lora"]["set_attributes"]
    assert attributes == {f"blocks.{i}.attn.qkv_bias_separate": True for i in range(2)}
    assert not any(block.attn.qkv_bias_separate for block in model.blocks)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    config = peft.LoraConfig(**export["peft"]["lora"]["config"])
    bypassed = peft.get_peft_model(tiny.build(), config)
    with pytest.raises(UnsupportedModel, match="never calls the adapted"):
        check_adapters_used(bypassed, tiny.inputs(2))
    prepared = tiny.build()
    _set_attributes(prepared, attributes)
    check_adapters_used(peft.get_peft_model(prepared, config), tiny.inputs(2))


def test_a_head_peft_cannot_name_exactly_says_so() -> None:
    """With q/k norms, modules_to_save 'norm' (the final norm) would also train every
    block's attn.q_norm and attn.k_norm: the head gets no PEFT form, with the reason, and
    the LoRA config leaves it out rather than train the q/k norms."""
    tiny = _timm("vit_tiny_patch16_224", "timm_vit", patch_size=8, qk_norm=True)
    export = _export(tiny, "ln1+mha")
    head = export["peft"]["forms"]["head"]
    assert head["form"] is None and "blocks.0.attn.q_norm" in head["reason"]
    config = export["peft"]["lora"]["config"]
    assert config["modules_to_save"] == ["blocks.0.norm1", "blocks.1.norm1"]
    assert export["peft"]["ln_tuning"]["config"]["modules_to_save"] is None
    assert any("no form" in sentence for sentence in export["usage"])
    model = peft.get_peft_model(tiny.build(), peft.LoraConfig(**config))
    trainable = {_strip(n) for n, p in model.named_parameters() if p.requires_grad}
    assert not any("q_norm" in n or "k_norm" in n or n.startswith("head") for n in trainable)


def test_peft_matching_rules_are_peft_s() -> None:
    """The rules the export checks names under are the ones peft applies: target_modules' by
    equality or dotted suffix; modules_to_save's the installed peft's (a plain suffix before
    0.22, a dotted one from 0.22 on), which the export's plain-suffix check always covers."""

    def holder(names: list[str]) -> nn.Module:
        root = nn.Module()
        for name in names:
            owner = root
            *path, last = name.split(".")
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            owner.add_module(last, nn.LayerNorm(4))
        root.add_module("lin", nn.Linear(4, 4))
        return root

    names = ["norm", "fc_norm", "blocks.0.attn.q_norm", "blocks.0.norm1", "x.blocks.0.norm1"]
    module_names = [n for n, _ in holder(names).named_modules()]
    assert modules_to_save_matches(module_names, ["norm"]) == [
        "norm",
        "fc_norm",
        "blocks.0.attn.q_norm",
    ]
    assert target_matches(module_names, ["blocks.0.norm1"]) == [
        "blocks.0.norm1",
        "x.blocks.0.norm1",
    ]
    saved = peft.inject_adapter_in_model(
        peft.LoraConfig(target_modules=["lin"], modules_to_save=["norm"]), holder(names)
    )
    wrapped = [n for n, m in saved.named_modules() if type(m).__name__ == "ModulesToSaveWrapper"]
    dotted = Version(peft.__version__) >= Version("0.22")
    rule = target_matches if dotted else modules_to_save_matches
    assert wrapped == rule(module_names, ["norm"])
    assert set(wrapped) <= set(modules_to_save_matches(module_names, ["norm"]))
    tuned = peft.inject_adapter_in_model(
        peft.LNTuningConfig(target_modules=["blocks.0.norm1"]), holder(names)
    )
    layers = [n for n, m in tuned.named_modules() if type(m).__name__ == "LNTuningLayer"]
    assert layers == target_matches(module_names, ["blocks.0.norm1"])


def test_no_configuration_is_the_head_alone() -> None:
    tiny = MODELS["vit_tiny_patch16_224"]
    export = _export(tiny, None)
    model = tiny.build()
    assert export["configuration"] is None and export["components"] == []
    assert export["peft"]["lora"] is None and export["peft"]["ln_tuning"] is None
    assert set(export["parameters"]["always_trained"]) == _names(model, ("head",))
    assert export["counts"]["configuration"] == 0
    assert "No configuration fits" in export["usage"][0]


def test_head_is_the_linear_probe() -> None:
    """A verification's baseline ``head`` (it can win): the head and final norm alone."""
    export = _export(MODELS["vit_tiny_patch16_224"], "head")
    assert export["configuration"] == "head" and export["components"] == []
    assert export["counts"]["configuration"] == 0 and export["peft"]["lora"] is None
    assert export["usage"][0].startswith("Linear probing")


@pytest.mark.parametrize("configuration", ["full", "emb", "head+mha", "lora", "mha+attn"])
def test_a_configuration_not_made_of_components_is_refused(configuration: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(configuration))):
        _export(MODELS["vit_tiny_patch16_224"], configuration)


def test_a_model_no_architecture_knows_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedModel, match="Sequential"):
        build_export(nn.Sequential(nn.Linear(2, 2)), "mha", model_name="x", model_entry={})


def test_the_json_file_reads_back_the_same(tmp_path: Path) -> None:
    export = _export(MODELS["gpt2_tiny"], "ln1+mha")
    write_json(tmp_path / "x.json", export)
    assert json.loads((tmp_path / "x.json").read_text()) == export


FAST = ["--batch-size", "4", "--batches", "2", "--warmup-steps", "2", "--device", "cpu"]


@pytest.mark.parametrize(("budget", "combine"), [("30000", True), ("0", False)])
def test_the_recommend_stage_writes_the_export_of_its_recommendation(
    tmp_path: Path, demo_dataset: Path, budget: str, combine: bool
) -> None:
    prefix = tmp_path / "out" / "demo"
    argv = [
        "recommend",
        "--model-spec",
        json.dumps(dataclasses.asdict(TINY_SPEC)),
        "--model",
        "tiny",
        "--dataset-dir",
        str(demo_dataset),
        "--reference-fallback",
        "pool",
        "--n-pairs",
        "6",
        *FAST,
        "--budget",
        budget,
        *(["--combine"] if combine else []),
        "--out-prefix",
        str(prefix),
    ]
    assert main(argv) == 0
    export = json.loads(Path(f"{prefix}.json").read_text())
    text = Path(f"{prefix}.md").read_text()
    recommendation = read_parquet_metadata(f"{prefix}.parquet")["recommendation"]
    configuration = export["configuration"]
    assert configuration == recommendation["configuration"]
    assert export["recommendation"] == recommendation
    assert export["model"]["name"] == "tiny"
    assert export["model"]["entry"] == json.loads(json.dumps(dataclasses.asdict(TINY_SPEC)))
    if configuration is None:
        assert "**No configuration fits the budget of 0" in text
        assert export["counts"]["configuration"] == 0
        return
    assert f"**Recommendation: finetune {configuration_label(configuration)}**" in text
    assert export["counts"]["configuration"] == recommendation["trainable_parameters"]
    assert sorted(p.name for p in prefix.parent.iterdir()) == [
        f"demo.{ext}" for ext in ("json", "md", "parquet", "pdf", "png")
    ]
