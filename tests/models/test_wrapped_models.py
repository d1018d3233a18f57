"""Wrapped models: every transformers family takes its task classes (``GPT2LMHeadModel``,
``XForCausalLM``, ``XForSequenceClassification``, ``...ForImageClassification``...) where it
takes the bare model, and names their parameters as the task class does.

Against the bare model the class holds (an independent copy of it, measured on its own): the
contract holds on the task class; ``select`` trains the bare model's parameters under the
task class's prefix, and the head is the bare model's plus what the task class adds; the
export's PEFT configs, applied by peft to the task class, adapt and train exactly those; the
plasticity is the bare model's. A saved task class's folder loads as its class from its
config.json, strictly; a class no family measures is refused, naming the folder and class.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from polars.testing import assert_frame_equal
from torch import nn

import vitplasticity
from tests.helpers.contract import check_contract
from tests.helpers.tiny_models import (
    ENCODER_TINY_CONFIG,
    GPT2_TINY_CONFIG,
    HF_PARALLEL_TINY_CONFIG,
    HF_SWIN_TINY_CONFIG,
    HF_TEXT_TINY_CONFIG,
    HF_VISION_TINY_CONFIG,
    TINY_MODELS,
    perturbed,
)
from vitplasticity.models.architectures import architecture_for, parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.models.lora import check_adapters_used
from vitplasticity.models.spec import TRANSFORMERS_MODEL_CLASSES
from vitplasticity.plasticity.measure import measure_protocols
from vitplasticity.recommend.export import build_export

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VISION = {k: v for k, v in HF_VISION_TINY_CONFIG.items() if k != "attn_implementation"}
MOE = {"pad_token_id": 0, "num_experts_per_tok": 2, "experts_implementation": "eager"}
TEXT_CONFIGS = {
    # family prefix: (config class, settings); pad_token_id lets a sequence classifier take
    # batches of more than one sequence.
    "GPT2": ("GPT2Config", {**GPT2_TINY_CONFIG, "pad_token_id": 0}),
    "Llama": ("LlamaConfig", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0}),
    "Mistral": ("MistralConfig", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0, "sliding_window": 4}),
    "Qwen2": ("Qwen2Config", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0}),
    "Qwen3": ("Qwen3Config", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0}),
    "Gemma": ("GemmaConfig", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0}),
    "Gemma2": ("Gemma2Config", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0, "sliding_window": 4}),
    "Gemma3": ("Gemma3TextConfig", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0}),
    "Phi3": (
        "Phi3Config",
        {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    ),
    "Mixtral": ("MixtralConfig", {**HF_TEXT_TINY_CONFIG, **MOE, "num_local_experts": 4}),
    "Qwen2Moe": (
        "Qwen2MoeConfig",
        {
            **{**HF_TEXT_TINY_CONFIG, **MOE, "num_experts": 4, "moe_intermediate_size": 16},
            "shared_expert_intermediate_size": 24,
        },
    ),
    "GPTNeoX": (
        "GPTNeoXConfig",
        {**HF_PARALLEL_TINY_CONFIG, "intermediate_size": 96, "pad_token_id": 0},
    ),
    "Falcon": (
        "FalconConfig",
        {
            **HF_PARALLEL_TINY_CONFIG,
            "new_decoder_architecture": True,
            "ffn_hidden_size": 96,
            "pad_token_id": 0,
        },
    ),
    "Olmo2": ("Olmo2Config", {**HF_TEXT_TINY_CONFIG, "pad_token_id": 0, "eos_token_id": 2}),
    "Bert": ("BertConfig", ENCODER_TINY_CONFIG),
    "Roberta": ("RobertaConfig", ENCODER_TINY_CONFIG),
    # relative attention with separate position projections, as the tiny hf_deberta_v2 LM
    "DebertaV2": (
        "DebertaV2Config",
        {**ENCODER_TINY_CONFIG, "relative_attention": True, "pos_att_type": ["c2p", "p2c"]},
    ),
}
MOE_FAMILIES = ("Mixtral", "Qwen2Moe")


@dataclass(frozen=True)
class Wrapped:
    """A task class around a bare model of a family, tiny and random."""

    name: str
    """The task class."""
    bare: str
    """The bare model's class, which the task class holds."""
    build: Callable[[], nn.Module]
    tokens: bool


def _text(name: str, family: str, bare: str) -> Wrapped:
    config_class, settings = TEXT_CONFIGS[family]

    def build() -> nn.Module:
        torch.manual_seed(0)
        config = getattr(transformers, config_class)(**settings)
        return getattr(transformers, name)(config)

    return Wrapped(name, bare, build, tokens=True)


def _vision(name: str, bare: str, config: Callable[[], object]) -> Wrapped:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return getattr(transformers, name)(config())

    return Wrapped(name, bare, build, tokens=False)


def _dual(config_class: str) -> Callable[[], object]:
    vision = {**VISION, "intermediate_size": 96}
    return lambda: getattr(transformers, config_class)(
        vision_config=vision, num_labels=5, attn_implementation="eager"
    )


def _tower(config_class: str, **settings: object) -> Callable[[], object]:
    return lambda: getattr(transformers, config_class)(
        **VISION, **settings, attn_implementation="eager"
    )


def _swin() -> object:
    return transformers.SwinConfig(**HF_SWIN_TINY_CONFIG, num_labels=5)


TASKS = ("ForCausalLM", "ForSequenceClassification", "ForTokenClassification")
ENCODER_TASKS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)
WRAPPED: list[Wrapped] = [
    *(
        _text(f"GPT2{task}", "GPT2", "GPT2Model")
        for task in (
            "LMHeadModel",
            "DoubleHeadsModel",
            "ForSequenceClassification",
            "ForTokenClassification",
            "ForQuestionAnswering",
        )
    ),
    *(
        _text(f"{family}{task}", family, f"{family}Model")
        for family in ("Llama", "Mistral", "Qwen2", "Qwen3")
        for task in (*TASKS, "ForQuestionAnswering")
    ),
    *(_text(f"Gemma{task}", "Gemma", "GemmaModel") for task in TASKS),
    *(_text(f"Gemma2{task}", "Gemma2", "Gemma2Model") for task in TASKS),
    _text("Gemma3ForCausalLM", "Gemma3", "Gemma3TextModel"),
    _text("Gemma3TextForSequenceClassification", "Gemma3", "Gemma3TextModel"),
    *(_text(f"Phi3{task}", "Phi3", "Phi3Model") for task in TASKS),
    *(_text(f"Olmo2{task}", "Olmo2", "Olmo2Model") for task in TASKS[:2]),
    *(
        _text(f"{family}{task}", family, f"{family}Model")
        for family in (*MOE_FAMILIES, "GPTNeoX", "Falcon")
        for task in (*TASKS, "ForQuestionAnswering")
    ),
    *(
        _text(f"{family}{task}", family, f"{family}Model")
        for family in ("Bert", "Roberta", "DebertaV2")
        for task in ENCODER_TASKS
    ),
    _vision("ViTForImageClassification", "ViTModel", _tower("ViTConfig", intermediate_size=96)),
    _vision("ViTForMaskedImageModeling", "ViTModel", _tower("ViTConfig", intermediate_size=96)),
    *(
        _vision(f"DeiT{task}", "DeiTModel", _tower("DeiTConfig", intermediate_size=96))
        for task in (
            "ForImageClassification",
            "ForImageClassificationWithTeacher",
            "ForMaskedImageModeling",
        )
    ),
    *(
        _vision(
            f"Beit{task}",
            "BeitModel",
            _tower("BeitConfig", intermediate_size=96, use_relative_position_bias=True),
        )
        for task in ("ForImageClassification", "ForMaskedImageModeling")
    ),
    _vision(
        "Data2VecVisionForImageClassification",
        "Data2VecVisionModel",
        _tower("Data2VecVisionConfig", intermediate_size=96, use_relative_position_bias=True),
    ),
    _vision("ViTMAEForPreTraining", "ViTMAEModel", _tower("ViTMAEConfig", intermediate_size=96)),
    _vision("Dinov2ForImageClassification", "Dinov2Model", _tower("Dinov2Config", mlp_ratio=2)),
    _vision(
        "Dinov2WithRegistersForImageClassification",
        "Dinov2WithRegistersModel",
        _tower("Dinov2WithRegistersConfig", mlp_ratio=2, num_register_tokens=2),
    ),
    _vision("CLIPForImageClassification", "CLIPVisionModel", _dual("CLIPConfig")),
    _vision(
        "CLIPVisionModelWithProjection",
        "CLIPVisionModel",
        _tower("CLIPVisionConfig", intermediate_size=96, projection_dim=24),
    ),
    _vision("SiglipForImageClassification", "SiglipVisionModel", _dual("SiglipConfig")),
    *(
        _vision(f"Swin{task}", "SwinModel", _swin)
        for task in ("ForImageClassification", "ForMaskedImageModeling")
    ),
]
CASES = {case.name: case for case in WRAPPED}


def _inputs(case: Wrapped, n: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(n)
    if case.tokens:
        return torch.randint(1, 64, (n, 12), generator=generator)
    return torch.randn(n, 3, 32, 32, generator=generator)


def _bare(model: nn.Module, case: Wrapped) -> tuple[str, nn.Module]:
    """Where the task class holds its bare model (found by class, not by the code under test)
    and an independent copy of that bare model."""
    (where,) = (n for n, child in model.named_children() if type(child).__name__ == case.bare)
    return where, copy.deepcopy(getattr(model, where))


def _prefixed(where: str, names: list[str]) -> list[str]:
    return [f"{where}.{name}" for name in names]


def _added(model: nn.Module, where: str) -> list[str]:
    """The parameters the task class holds beside its bare model."""
    return [n for n, _ in model.named_parameters() if not n.startswith(f"{where}.")]


def _head(model: nn.Module, where: str, bare: nn.Module) -> set[str]:
    """The head of the task class: the bare model's, and every parameter it adds."""
    return set(_prefixed(where, vitplasticity.select(bare, "head"))) | set(_added(model, where))


def test_every_task_class_a_model_class_may_name_is_tested_here() -> None:
    bare = {case.bare for case in WRAPPED} | {"DINOv3ViTModel"}
    assert TRANSFORMERS_MODEL_CLASSES - bare == set(CASES)


# ViTMAEForPreTraining's forward masks and shuffles the patches at random: its contract, with
# patches kept in order, is checked in tests/models/test_hf_vit_like.py.
@pytest.mark.parametrize("name", [name for name in CASES if name != "ViTMAEForPreTraining"])
def test_the_contract_holds_on_the_task_class(name: str) -> None:
    case = CASES[name]
    model = perturbed(case.build())
    inputs = _inputs(case, 3)
    inputs = inputs if case.tokens else inputs.double()
    architecture = architecture_for(model)
    _, bare = _bare(model, case)
    assert architecture is architecture_for(bare)
    check_contract(architecture, model, inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_select_trains_the_bare_models_parameters_under_the_prefix(name: str) -> None:
    case = CASES[name]
    model = case.build()
    where, bare = _bare(model, case)
    for configuration in ("mha+fc1", "ln1+ln2", "fc2", "emb"):
        trained = vitplasticity.select(model, configuration, train_head=False)
        expected = _prefixed(where, vitplasticity.select(bare, configuration, train_head=False))
        assert trained == expected, configuration
        assert {n for n, p in model.named_parameters() if p.requires_grad} == set(trained)
    head = _head(model, where, bare)
    assert set(vitplasticity.select(model, "head")) == head
    with_head = set(vitplasticity.select(model, "mha"))
    assert with_head == head | set(vitplasticity.select(model, "mha", train_head=False))
    lm_head = getattr(model, "lm_head", None)
    # BEiT's masked-image lm_head predicts visual tokens: its input embedding is the patches'.
    # RoBERTa's lm_head holds its (tied) decoder inside: no weight of its own.
    lm_weight = getattr(lm_head, "weight", None)
    if lm_weight is not None and lm_weight is getattr(model.get_input_embeddings(), "weight", None):
        assert not any(n.startswith("lm_head.") for n in head)  # tied: the embedding's
    else:
        assert set(_added(model, where)) <= head and _added(model, where)


def _output_loss(output: object) -> torch.Tensor:
    """Every float tensor of a transformers output (logits, start and end logits, the
    reconstruction, the hidden states...), squared and averaged: each head is on the path."""
    tensors = [t for t in output.values() if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return sum(t.square().mean() for t in tensors)


def _strip(name: str) -> str:
    return name.removeprefix("base_model.model.")


@pytest.fixture
def _quiet() -> None:
    # peft warns about every norm LNTuning copies and every Conv1D it flips.
    warnings.filterwarnings("ignore", category=UserWarning, module="peft")


def _saved_head(name: str, export: dict, head: set[str]) -> set[str]:
    """What peft's modules_to_save copies and trains: the head; but an MLM head holds its
    output bias outside a module, beside a decoder whose weight is the word embedding's
    (``emb``): copying that decoder would train a copy of the embedding, so the export gives
    the head no form and says why, and nothing is copied."""
    if not name.endswith("ForMaskedLM"):
        return head
    held = "lm_head.bias" if name.startswith("Roberta") else "cls.predictions.bias"
    assert export["peft"]["forms"]["head"] == {
        "form": None,
        "reason": f"parameters held outside a module ({held})",
    }
    return set()


@pytest.mark.usefixtures("_quiet")
@pytest.mark.parametrize("name", [name for name in CASES if not name.startswith(MOE_FAMILIES)])
def test_the_export_applied_by_peft_trains_exactly_the_configuration(name: str) -> None:
    case = CASES[name]
    model = case.build()
    where, bare = _bare(model, case)
    owners = parameter_map(bare).owners
    head = _head(model, where, bare)

    export = build_export(model, "mha+fc1", model_name=name, model_entry={})
    names = {n for n, _ in model.named_parameters()}
    chosen = export["parameters"]["components"]
    for component in ("mha", "fc1"):
        assert chosen[component] == _prefixed(where, parameter_map(bare).component_names(component))
    assert set(export["parameters"]["always_trained"]) == head
    assert set(chosen["mha"]) | set(chosen["fc1"]) | head <= names
    linears = {
        f"{where}.{module_name}"
        for module_name, module in bare.named_modules()
        if (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D")
        and owners[f"{module_name}.weight"].trained_by in ("mha", "fc1")
    }
    lora = peft.get_peft_model(case.build(), peft.LoraConfig(**export["peft"]["lora"]["config"]))
    from peft.tuners.lora import LoraLayer

    assert {_strip(n) for n, m in lora.named_modules() if isinstance(m, LoraLayer)} == linears
    trainable = {_strip(n) for n, p in lora.named_parameters() if p.requires_grad}
    adapters = {n for n in trainable if ".lora_" in n}
    assert adapters == {f"{m}.lora_{ab}.default.weight" for m in linears for ab in "AB"}
    copies = {n.replace(".modules_to_save.default", "") for n in trainable - adapters}
    assert copies == _saved_head(name, export, head)
    inputs = _inputs(case, 2)
    check_adapters_used(lora, inputs)
    _output_loss(lora(inputs)).backward()
    for parameter_name, parameter in lora.named_parameters():
        if not parameter.requires_grad or ".lora_" in parameter_name:
            assert (parameter.grad is not None) == parameter.requires_grad, parameter_name

    export = build_export(model, "ln1+ln2", model_name=name, model_entry={})
    norms = {f"{where}.{n}" for n, owner in owners.items() if owner.trained_by in ("ln1", "ln2")}
    tuned = peft.inject_adapter_in_model(
        peft.LNTuningConfig(**export["peft"]["ln_tuning"]["config"]), case.build()
    )
    trainable = {n for n, p in tuned.named_parameters() if p.requires_grad}
    layers = {n for n in trainable if ".ln_tuning_layers.default." in n}
    assert {n.replace(".ln_tuning_layers.default", "") for n in layers} == norms
    copies = {n.replace(".modules_to_save.default", "") for n in trainable - layers}
    assert copies == _saved_head(name, export, head)


@pytest.mark.usefixtures("_quiet")
@pytest.mark.parametrize("name", [name for name in CASES if name.startswith(MOE_FAMILIES)])
def test_an_moe_export_adapts_its_fused_experts_expert_by_expert(name: str) -> None:
    """FC1 and FC2 of every expert are slices of one module's two 3-D parameters: the export
    names them as PEFT ``target_parameters``, and a shared expert's linears as
    ``target_modules``. Applied by peft, exactly those are adapted, by as many adapter
    parameters as the export counts; merged, each expert's matrix moved by a rank-8 update
    (each expert its own) and no other parameter moved, and the merged model computes what
    the adapted one does (the update is applied in the orientation transformers stores)."""
    case = CASES[name]
    model = case.build()
    where, bare = _bare(model, case)
    export = build_export(model, "fc1+fc2", model_name=name, model_entry={})
    config = export["peft"]["lora"]["config"]
    layers = range(bare.config.num_hidden_layers)
    fused = {
        f"{where}.layers.{i}.mlp.experts.{p}" for i in layers for p in ("gate_up_proj", "down_proj")
    }
    shared = {
        f"{where}.layers.{i}.mlp.shared_expert.{p}"
        for i in layers
        for p in ("gate_proj", "up_proj", "down_proj")
        if hasattr(bare.layers[i].mlp, "shared_expert")
    }  # fmt: skip
    assert set(config["target_parameters"]) == fused and set(config["target_modules"]) == shared
    owned = set(
        export["parameters"]["components"]["fc1"] + export["parameters"]["components"]["fc2"]
    )
    assert fused | {f"{m}.weight" for m in shared} == owned

    base = case.build()
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    lora = peft.get_peft_model(base, peft.LoraConfig(**config))
    adapters = {n: p for n, p in lora.named_parameters() if p.requires_grad and ".lora_" in n}
    assert sum(p.numel() for p in adapters.values()) == export["counts"]["lora_adapters"]
    with torch.no_grad():
        for parameter in adapters.values():  # lora_B starts at zero: give every update a value
            parameter.normal_(std=0.05)
    inputs = _inputs(case, 2)
    check_adapters_used(lora, inputs)
    lora.eval()
    with torch.no_grad():
        adapted = _output_loss(lora(inputs))
    merged_model = lora.merge_and_unload()
    merged = dict(merged_model.named_parameters())
    assert set(merged) == set(before)
    for parameter_name, value in merged.items():
        change = (value - before[parameter_name]).detach()
        if parameter_name in fused:
            ranks = torch.linalg.matrix_rank(change.double(), rtol=1e-4)  # float32 rounding
            assert ranks.tolist() == [8] * len(change), parameter_name  # per expert: rank 8
        elif parameter_name.removesuffix(".weight") in shared:
            assert torch.linalg.matrix_rank(change.double(), rtol=1e-4) == 8, parameter_name
        else:
            assert not change.any(), parameter_name
    with torch.no_grad():
        assert torch.allclose(_output_loss(merged_model.eval()(inputs)), adapted, rtol=1e-5)


@pytest.mark.parametrize(
    "name",
    [
        "GPT2LMHeadModel",
        "GPT2ForSequenceClassification",
        "LlamaForCausalLM",
        "Qwen3ForSequenceClassification",
        "GemmaForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
        "GPTNeoXForCausalLM",
        "FalconForSequenceClassification",
        "Olmo2ForCausalLM",
        "MixtralForCausalLM",
        "Qwen2MoeForSequenceClassification",
        "BertForMaskedLM",
        "RobertaForSequenceClassification",
        "DebertaV2ForMaskedLM",
        "ViTForImageClassification",
        "DeiTForImageClassificationWithTeacher",
        "ViTMAEForPreTraining",
        "CLIPForImageClassification",
    ],
)
def test_plasticity_of_the_task_class_is_the_bare_models(name: str) -> None:
    case = CASES[name]
    model = case.build().eval()
    _, bare = _bare(model, case)
    reference, downstream = _inputs(case, 4), _inputs(case, 5)[1:]
    settings = {"protocols": ("embedding", "in_situ"), "batch_size": 2}
    assert_frame_equal(
        measure_protocols(model, reference, downstream, **settings),
        measure_protocols(bare.eval(), reference, downstream, **settings),
    )


def _entry(folder: Path) -> dict:
    entry = {"family": "transformers", "hf_id": "tiny/saved", "weights": str(folder)}
    return {**entry, "normalize": "imagenet"}


@pytest.mark.parametrize(
    "name",
    [
        "LlamaForCausalLM",
        "GPT2LMHeadModel",
        "Qwen2ForSequenceClassification",
        "Gemma2ForTokenClassification",
        "Phi3ForCausalLM",
        "GPTNeoXForCausalLM",
        "FalconForCausalLM",
        "MixtralForCausalLM",
        "Qwen2MoeForTokenClassification",
        "ViTForImageClassification",
        "DeiTForImageClassificationWithTeacher",
        "SwinForImageClassification",
    ],
)
def test_a_saved_task_class_loads_as_its_config_says(tmp_path: Path, name: str) -> None:
    """No model_class: the class is config.json's ``architectures``, loaded strictly (before,
    a LlamaForCausalLM folder stopped at "unexpected lm_head.weight")."""
    saved = perturbed(CASES[name].build(), 3).float()
    saved.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["architectures"] == [name]
    model = build_model(_entry(tmp_path / "saved"))
    assert type(model).__name__ == name
    loaded = model.state_dict()
    assert loaded.keys() == saved.state_dict().keys()
    for key, tensor in saved.state_dict().items():
        assert torch.equal(loaded[key], tensor), key


def _set_architectures(folder: Path, names: list[str]) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "architectures": names}))


def test_a_class_no_family_measures_is_refused_naming_the_folder(tmp_path: Path) -> None:
    torch.manual_seed(0)
    deberta = transformers.DebertaForMaskedLM(  # DeBERTa v1: no family measures it
        transformers.DebertaConfig(
            hidden_size=48, num_hidden_layers=1, num_attention_heads=3, intermediate_size=96
        )
    )
    deberta.save_pretrained(tmp_path / "deberta")
    folder = str(tmp_path / "deberta")
    with pytest.raises(ValueError, match=rf"{folder}.*the class 'DebertaForMaskedLM'"):
        build_model(_entry(tmp_path / "deberta"))
    CASES["LlamaForCausalLM"].build().save_pretrained(tmp_path / "llama")
    _set_architectures(tmp_path / "llama", ["LlamaForCausalLM", "LlamaModel"])
    with pytest.raises(ValueError, match=r"names the classes .*: name the one to build"):
        build_model(_entry(tmp_path / "llama"))


def test_a_folder_its_class_does_not_fit_is_still_an_error(tmp_path: Path) -> None:
    """Strict loading stays: a LlamaModel's weights under a config naming LlamaForCausalLM
    (untied head) miss lm_head; the error names the folder and the class."""
    case = CASES["LlamaForCausalLM"]
    model = case.build()
    model.model.save_pretrained(tmp_path / "bare")
    _set_architectures(tmp_path / "bare", ["LlamaForCausalLM"])
    folder = str(tmp_path / "bare")
    with pytest.raises(
        ValueError,
        match=rf"{folder}.*does not match LlamaForCausalLM: 1 missing weight\(s\): lm_head\.weight",
    ):
        build_model(_entry(tmp_path / "bare"))
    _set_architectures(tmp_path / "bare", [])  # none named: the bare model of its model_type
    assert type(build_model(_entry(tmp_path / "bare"))).__name__ == "LlamaModel"


def test_our_dinov3_classifier_is_the_tower_under_its_attribute() -> None:
    """DINOv3, which transformers gives no classification class, in ours."""
    (tiny,) = (t for t in TINY_MODELS if t.id == "hf_dinov3_classifier")
    model = tiny.build()
    assert set(vitplasticity.select(model, "head")) == set(
        _prefixed("dinov3", vitplasticity.select(model.dinov3, "head"))
    ) | {"classifier.weight", "classifier.bias"}
    assert vitplasticity.select(model, "mha", train_head=False) == _prefixed(
        "dinov3", vitplasticity.select(copy.deepcopy(model.dinov3), "mha", train_head=False)
    )


def test_a_text_classifier_is_ranked_as_its_base_model_in_the_causal_lm() -> None:
    """recommend --text's causal LM of a classifier: its base model (the same modules, the same
    names) in the causal-LM class, head tied; refused when the config unties the head."""
    from vitplasticity.models.architectures import UnsupportedModel
    from vitplasticity.models.text import causal_lm, untied_bare_model

    classifier = CASES["GPT2ForSequenceClassification"].build()
    lm = causal_lm(classifier)
    assert type(lm).__name__ == "GPT2LMHeadModel" and lm.transformer is classifier.transformer
    assert lm.lm_head.weight is classifier.transformer.wte.weight
    assert {n for n, _ in lm.named_parameters()} == {
        n for n, _ in classifier.named_parameters() if not n.startswith("score.")
    }
    untied = CASES["LlamaForSequenceClassification"].build()
    with pytest.raises(UnsupportedModel, match="LlamaForSequenceClassification has no LM head"):
        causal_lm(untied)
    entry = {"config": {"tie_word_embeddings": False}}
    assert untied_bare_model({**entry, "model_class": "LlamaForSequenceClassification"}) == (
        "LlamaForSequenceClassification"
    )
    assert untied_bare_model({**entry, "model_class": "LlamaForCausalLM"}) is None
