"""Building transformers models from a config entry (vitplasticity.models.hf_build), and finetuning
the transformers vision towers.

Every model is tiny and built offline: saved with save_pretrained into tmp_path, or drawn from
its config (weights: random). Strict loading is checked on real saved folders (another model
type, a missing or an extra tensor: each an error naming the folder); the classification
wrappers' logits against the model's own classification class and a float64 pooling written
here; finetuning through build_run_model + training_step and the CLI (exactly the
configuration's parameters train, and only they change); preprocessing from a
preprocessor_config.json as the hub writes them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers.tiny_finetune import cli_args, first_batch, settings_for
from tests.helpers.tiny_models import perturbed
from vitplasticity.cli import main
from vitplasticity.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.step import training_step
from vitplasticity.models.architectures import architecture_for, declared, parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.models.build import preprocessing as model_preprocessing
from vitplasticity.models.hf_build import build_hf_model
from vitplasticity.models.hf_preprocessing import hf_preprocessing
from vitplasticity.models.spec import HF_MODEL_KEYS, HFModelSpec, ModelSpec
from vitplasticity.recommend.gradients import gradient_statistics, head_warmup

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

CPU = torch.device("cpu")
CLASSES = 4

TINY = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "image_size": 32,
    "patch_size": 8,
}
"""What every tiny tower shares: 2 blocks of width 48, 3 heads, 32 px images, 16 patches."""

TOWERS: dict[str, tuple[str, dict[str, Any]]] = {
    "vit": ("ViTModel", {"intermediate_size": 96}),
    "deit": ("DeiTModel", {"intermediate_size": 96}),
    "dinov2": ("Dinov2Model", {"mlp_ratio": 2}),
    "dinov2_with_registers": ("Dinov2WithRegistersModel", {"mlp_ratio": 2, "num_register_tokens": 2}),
    "dinov3_vit": (
        "DINOv3ViTModel",
        {"intermediate_size": 64, "num_register_tokens": 2, "use_gated_mlp": True, "hidden_act": "silu"},
    ),
    "clip_vision_model": ("CLIPVisionModel", {"intermediate_size": 96}),
    "siglip_vision_model": ("SiglipVisionModel", {"intermediate_size": 96}),
}  # fmt: skip
"""Per model_type: the tower class and its tiny config."""

MODEL_TYPES = sorted(TOWERS)


# One intra-op thread per module (conftest.py: tiny models run fastest so).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_config(model_type: str) -> dict[str, Any]:
    return {"model_type": model_type, **TINY, **TOWERS[model_type][1]}


def random_spec(model_type: str, **fields: Any) -> HFModelSpec:
    fields.setdefault("config", tiny_config(model_type))
    return HFModelSpec(hf_id=f"tiny/{model_type}", weights="random", **fields)


def tower_class(model_type: str) -> type:
    return getattr(transformers, TOWERS[model_type][0])


def saved_tower(model_type: str, folder: Path, seed: int = 7) -> nn.Module:
    """A tiny tower with every tensor perturbed (no zero bias, no unit norm), saved as
    save_pretrained writes it (ViT with its pooler, as ViTModel builds by default)."""
    cls = tower_class(model_type)
    settings = {k: v for k, v in tiny_config(model_type).items() if k != "model_type"}
    torch.manual_seed(seed)
    model = perturbed(cls(cls.config_class(**settings)), seed).float()
    model.save_pretrained(folder)
    return model


def folder_spec(folder: Path, **fields: Any) -> HFModelSpec:
    return HFModelSpec(hf_id="local/tiny", weights=str(folder), **fields)


def images(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def assert_same_tensors(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(found[name], tensor, rtol=0, atol=0, msg=name)


def without(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith(prefix)}


# --- the entry ----------------------------------------------------------------------------------


def test_entry_keys_are_checked_by_name() -> None:
    entry = {"family": "transformers", "hf_id": "facebook/dinov2-small"}
    assert ModelSpec.from_config(entry) == HFModelSpec(hf_id="facebook/dinov2-small")
    assert set(dataclasses.asdict(HFModelSpec(hf_id="x"))) == HF_MODEL_KEYS
    with pytest.raises(ValueError, match=r"unknown model keys \['timm_id'\]"):
        ModelSpec.from_config({**entry, "timm_id": "vit_base_patch16_224"})
    with pytest.raises(ValueError, match="lacks 'hf_id'"):
        ModelSpec.from_config({"family": "transformers"})
    with pytest.raises(ValueError, match="config needs model_type"):
        ModelSpec.from_config({**entry, "weights": "random", "config": {"hidden_size": 48}})
    with pytest.raises(ValueError, match="config must be a mapping"):
        ModelSpec.from_config({**entry, "config": ["hidden_size"]})
    assert (
        ModelSpec.from_config({"timm_id": "vit_tiny_patch16_224"}).timm_id == "vit_tiny_patch16_224"
    )


# --- building each family -----------------------------------------------------------------------


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_saved_folder_loads_exactly_its_weights(model_type: str, tmp_path: Path) -> None:
    saved = saved_tower(model_type, tmp_path / model_type)
    loaded = build_hf_model(folder_spec(tmp_path / model_type))
    assert type(loaded) is tower_class(model_type) and not loaded.training
    assert loaded.config._attn_implementation == "eager"
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    # ViT: the tower is ViTForImageClassification's, without the pooler (dropped from the file).
    assert_same_tensors(loaded.state_dict(), without(saved.state_dict(), "pooler."))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_classifier_is_new_and_drawn_from_the_callers_rng(
    model_type: str, tmp_path: Path
) -> None:
    """With num_classes the tower sits in its classification class, its weights the file's;
    the head is the first draw from the caller's RNG (truncated normal, std 0.02; zero bias)
    and the only part that depends on it."""
    saved = saved_tower(model_type, tmp_path / model_type)
    torch.manual_seed(11)
    model = build_hf_model(folder_spec(tmp_path / model_type), num_classes=CLASSES)
    classifier = declared("classifiers")[type(saved).__name__][0]
    assert type(model).__name__ == getattr(classifier, "__name__", classifier)
    tower = architecture_for(model).tower(model)
    assert_same_tensors(tower.state_dict(), without(saved.state_dict(), "pooler."))
    width = model.classifier.in_features
    torch.manual_seed(11)
    expected = nn.init.trunc_normal_(torch.empty(CLASSES, width), std=0.02)
    torch.testing.assert_close(model.classifier.weight, expected, rtol=0, atol=0)
    assert torch.equal(model.classifier.bias, torch.zeros(CLASSES))
    torch.manual_seed(12)
    other = build_hf_model(folder_spec(tmp_path / model_type), num_classes=CLASSES)
    assert not torch.equal(other.classifier.weight, model.classifier.weight)
    assert_same_tensors(architecture_for(other).tower(other).state_dict(), tower.state_dict())
    assert not model.training
    assert tower.config._attn_implementation == "eager"
    config = getattr(model, "config", tower.config)  # CLIP, SigLIP: the dual encoder's
    assert getattr(config, "vision_config", config)._attn_implementation == "eager"


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_a_random_model_depends_on_init_seed_alone(model_type: str) -> None:
    spec = random_spec(model_type, init_seed=3)
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    bare = build_hf_model(spec)
    assert torch.equal(torch.random.get_rng_state(), state), "the caller's RNG is left alone"
    torch.manual_seed(1)
    classified = build_hf_model(spec, num_classes=CLASSES)
    tower = architecture_for(classified).tower(classified)
    assert_same_tensors(tower.state_dict(), bare.state_dict())
    # The same as the class drawn from that seed by hand (ViT without its pooler).
    cls = tower_class(model_type)
    settings = {k: v for k, v in tiny_config(model_type).items() if k != "model_type"}
    torch.manual_seed(3)
    kwargs = {"add_pooling_layer": False} if model_type in ("vit", "deit") else {}
    by_hand = cls(cls.config_class(**settings), **kwargs)
    assert_same_tensors(bare.state_dict(), by_hand.state_dict())
    other = build_hf_model(random_spec(model_type, init_seed=4))
    assert any(
        not torch.equal(a, b) for a, b in zip(other.parameters(), bare.parameters(), strict=True)
    )


def test_a_dual_encoder_checkpoint_loads_its_vision_tower(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CLIPModel folder (what openai/clip-* holds) builds the CLIPVisionModel by default:
    the vision weights loaded, the text tower, projections and logit scale dropped and logged."""
    vision = {k: v for k, v in tiny_config("clip_vision_model").items() if k != "model_type"}
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    text |= {"num_attention_heads": 2, "vocab_size": 64, "max_position_embeddings": 16}
    text |= {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1}
    torch.manual_seed(0)
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    dual = perturbed(transformers.CLIPModel(config), 1).float()
    dual.save_pretrained(tmp_path / "clip")
    with caplog.at_level(logging.INFO, logger="vitplasticity.models.hf_build"):
        tower = build_hf_model(folder_spec(tmp_path / "clip"))
    assert type(tower).__name__ == "CLIPVisionModel"
    expected = {
        k.removeprefix("vision_model."): v
        for k, v in dual.state_dict().items()
        if k.startswith("vision_model.")
    }
    assert_same_tensors(tower.state_dict(), expected)
    assert "text_model.final_layer_norm.weight" in caplog.text and "logit_scale" in caplog.text


def test_a_classification_checkpoint_gets_a_new_head(tmp_path: Path) -> None:
    """A Dinov2ForImageClassification folder loads as its config.json's class (its classifier
    with it, strictly); finetuning replaces the classifier with a new one of the run's class
    count, around the same tower."""
    settings = {k: v for k, v in tiny_config("dinov2").items() if k != "model_type"}
    classifier = transformers.Dinov2ForImageClassification(
        transformers.Dinov2Config(**settings, num_labels=7)
    )
    classifier = perturbed(classifier, 2).float()
    classifier.save_pretrained(tmp_path / "cls")
    loaded = build_hf_model(folder_spec(tmp_path / "cls"))
    assert type(loaded).__name__ == "Dinov2ForImageClassification"
    assert_same_tensors(loaded.state_dict(), classifier.state_dict())
    model = build_hf_model(folder_spec(tmp_path / "cls"), num_classes=CLASSES)
    assert type(model).__name__ == "Dinov2ForImageClassification"
    expected = without(classifier.state_dict(), "classifier.")
    assert_same_tensors(without(model.state_dict(), "classifier."), expected)
    assert model.classifier.out_features == CLASSES


# --- strict loading ------------------------------------------------------------------------------


def test_another_model_type_is_an_error_naming_folder_and_both_types(tmp_path: Path) -> None:
    saved_tower("vit", tmp_path / "my_vit")
    with pytest.raises(ValueError, match=r"my_vit'.*model_type 'vit', not 'dinov2'.*Dinov2Model"):
        build_hf_model(folder_spec(tmp_path / "my_vit", model_class="Dinov2Model"))
    with pytest.raises(ValueError, match=r"not 'clip_vision_model' or 'clip'"):
        build_hf_model(folder_spec(tmp_path / "my_vit", model_class="CLIPVisionModel"))


def _edit_weights(folder: Path, edit: Any) -> None:
    weights = safetensors_torch.load_file(folder / "model.safetensors")
    edit(weights)
    safetensors_torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def test_a_checkpoint_missing_a_tensor_is_an_error_naming_folder_and_key(tmp_path: Path) -> None:
    folder = tmp_path / "cut"
    saved_tower("dinov2", folder)
    _edit_weights(folder, lambda w: w.pop("encoder.layer.1.mlp.fc1.weight"))
    with pytest.raises(
        ValueError, match=r"'.*cut'.*Dinov2Model: 1 missing weight\(s\): encoder\.layer\.1\.mlp"
    ):
        build_hf_model(folder_spec(folder))
    with pytest.raises(ValueError, match=r"'.*cut'.*1 missing weight"):
        build_hf_model(folder_spec(folder), num_classes=CLASSES)


def test_a_checkpoint_with_an_extra_tensor_is_an_error_naming_folder_and_key(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "extra"
    saved_tower("dinov3_vit", folder)
    _edit_weights(folder, lambda w: w.update({"model.layer.1.extra.weight": torch.zeros(3)}))
    with pytest.raises(
        ValueError, match=r"'.*extra'.*1 unexpected weight\(s\): model\.layer\.1\.extra\.weight"
    ):
        build_hf_model(folder_spec(folder))


def test_other_shapes_and_bad_folders_are_errors_naming_them(tmp_path: Path) -> None:
    folder = tmp_path / "narrow"
    saved_tower("dinov2", folder)
    with pytest.raises(
        ValueError, match=r"'.*narrow'.*mismatched weight\(s\): encoder\.layer\.0\.mlp\.fc1\.bias"
    ):
        build_hf_model(folder_spec(folder, config={"mlp_ratio": 4}))
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"'.*narrow' has no config\.json"):
        build_hf_model(folder_spec(folder))
    with pytest.raises(FileNotFoundError, match="no/such/folder"):
        build_hf_model(HFModelSpec(hf_id="x", weights="no/such/folder"))
    with pytest.raises(ValueError, match="model_class 'NoSuchModel' is not a transformers model"):
        build_hf_model(random_spec("dinov2", model_class="NoSuchModel"))
    with pytest.raises(ValueError, match=r"give config\.model_type 'clip_vision_model'"):
        build_hf_model(HFModelSpec(hf_id="x", weights="random", config={"model_type": "clip"}))


def test_num_classes_needs_a_vision_tower() -> None:
    gpt2 = HFModelSpec(hf_id="gpt2", weights="random", config={"model_type": "gpt2", "n_layer": 1})
    with pytest.raises(ValueError, match="GPT2Model has no classification class here"):
        build_hf_model(gpt2, num_classes=CLASSES)
    text_classifier = HFModelSpec(
        hf_id="gpt2",
        weights="random",
        config={"model_type": "gpt2", "n_layer": 1},
        model_class="GPT2ForSequenceClassification",
    )
    with pytest.raises(ValueError, match="GPT2ForSequenceClassification has no classification"):
        build_hf_model(text_classifier, num_classes=CLASSES)


def test_a_classification_class_gets_a_new_head() -> None:
    """A vision tower built in its classification class (model_class) with num_classes: the
    class's classifier is replaced by a new one of that many classes, around the same tower."""
    vit = random_spec("vit", model_class="ViTForImageClassification")
    built = build_hf_model(vit)
    model = build_hf_model(vit, num_classes=CLASSES)
    assert type(model).__name__ == "ViTForImageClassification"
    assert model.classifier.out_features == CLASSES != built.classifier.out_features
    assert_same_tensors(
        without(model.state_dict(), "classifier."), without(built.state_dict(), "classifier.")
    )


# --- the classification wrappers pool as the model's own class ---------------------------------


def pooled(model_type: str, tokens: np.ndarray, registers: int) -> np.ndarray:
    """The classifier's input from the tower's last_hidden_state, written from
    transformers' classification classes (and the DINOv3 wrapper's docstring)."""
    if model_type in ("vit", "deit"):  # DeiT: its distillation token unused
        return tokens[:, 0]
    if model_type == "clip_vision_model":
        return tokens[:, 1:].mean(axis=1)
    if model_type == "siglip_vision_model":
        return tokens.mean(axis=1)
    return np.concatenate([tokens[:, 0], tokens[:, 1 + registers :].mean(axis=1)], axis=1)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_the_classifier_pools_as_the_models_own_class(model_type: str, tmp_path: Path) -> None:
    """The logits equal (1) float64 numpy pooling of the tower's output times the head and
    (2) a freshly built instance of transformers' own classification class holding the same
    weights (DINOv3 has none: (1) only)."""
    saved_tower(model_type, tmp_path / model_type)
    torch.manual_seed(0)
    model = build_hf_model(folder_spec(tmp_path / model_type), num_classes=CLASSES)
    with torch.no_grad():
        model.classifier.bias.normal_()  # a nonzero bias, so that it is tested too
    architecture = architecture_for(model)
    x = images(3)
    with torch.no_grad():
        logits = architecture.logits(model, x)
        tokens = architecture.tower(model)(x).last_hidden_state.double().numpy()
    registers = getattr(architecture.tower(model).config, "num_register_tokens", 0)
    weight = model.classifier.weight.detach().double().numpy()
    bias = model.classifier.bias.detach().double().numpy()
    expected = pooled(model_type, tokens, registers) @ weight.T + bias
    np.testing.assert_allclose(logits.double().numpy(), expected, rtol=1e-6, atol=1e-6)
    if type(model).__name__ == "DINOv3ViTClassifier":
        return
    own = type(model)(model.config)
    own.load_state_dict(model.state_dict())  # strict: the same parameters, by name
    with torch.no_grad():
        torch.testing.assert_close(own.eval()(pixel_values=x).logits, logits, rtol=0, atol=0)


# --- finetuning ----------------------------------------------------------------------------------

MHA_DINOV2 = [
    f"dinov2.encoder.layer.{block}.{name}"
    for block in range(2)
    for name in [
        *(f"attention.{p}_proj.{kind}" for p in "qkvo" for kind in ("weight", "bias")),
        "layer_scale1.lambda1",
    ]
] + ["dinov2.layernorm.weight", "dinov2.layernorm.bias", "classifier.weight", "classifier.bias"]
"""What configuration mha trains on Dinov2ForImageClassification, in order (written here:
the attention's four projections and the layer scale of its branch, then the final norm and
the new classifier)."""

FC1_VIT = [
    f"vit.layers.{block}.mlp.fc1.{kind}" for block in range(2) for kind in ("weight", "bias")
] + ["vit.layernorm.weight", "vit.layernorm.bias", "classifier.weight", "classifier.bias"]
"""What configuration fc1 trains on ViTForImageClassification, in order."""


@pytest.mark.parametrize(
    ("model_type", "configuration", "expected"),
    [("dinov2", "mha", MHA_DINOV2), ("vit", "fc1", FC1_VIT)],
)
def test_a_step_trains_exactly_the_configuration(
    model_type: str, configuration: str, expected: list[str], demo_dataset: Path
) -> None:
    """build_run_model + training_step: the trained names are the ParameterMap's and the
    list written here; after an SGD step every trained tensor with a gradient moved and every
    other tensor is bit-identical."""
    settings = settings_for(
        random_spec(model_type), configuration=configuration, batch_size=4, micro_batch_size=2
    )
    run_model = build_run_model(settings, CLASSES, CPU)
    names = [name for name, _ in run_model.trainable]
    assert names == expected
    assert set(names) == run_model.parameters.trained_names(configuration)
    model = run_model.model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = build_optimizer(run_model.trainable, settings)
    batch, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
    result = training_step(run_model, optimizer, (batch, labels), 1, settings, CPU, True)
    assert result.finite and result.lr > 0
    assert set(result.group_norms) == {configuration, "head"}
    for name, parameter in model.named_parameters():
        if name in names:
            assert parameter.grad is not None, name
            assert not torch.equal(parameter, before[name]), name
        else:
            assert parameter.grad is None, name
            assert torch.equal(parameter, before[name]), name


def test_lora_adapts_the_transformers_attention(demo_dataset: Path) -> None:
    """LoRA on a transformers DINOv2: adapters on q, k, v and o of every block, each on the
    forward path (B gets a gradient), and only adapters, final norm and head train."""
    pytest.importorskip("peft")
    settings = settings_for(
        random_spec("dinov2"), configuration="lora", batch_size=4, micro_batch_size=4
    )
    run_model = build_run_model(settings, CLASSES, CPU)
    optimizer = build_optimizer(run_model.trainable, settings)
    batch, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
    training_step(run_model, optimizer, (batch, labels), 0, settings, CPU)
    trained = dict(run_model.trainable)
    adapters = sorted(
        f"dinov2.encoder.layer.{block}.attention.{p}_proj.lora_{m}.default.weight"
        for block in range(2)
        for p in "qkvo"
        for m in "AB"
    )
    assert sorted(n for n in trained if ".lora_" in n) == adapters
    assert sorted(n for n in trained if ".lora_" not in n) == sorted(MHA_DINOV2[-4:])
    for name in adapters:
        if "lora_B" in name:
            assert trained[name].grad.abs().sum() > 0, name


def test_the_cli_finetunes_a_transformers_dinov2(demo_dataset: Path, tmp_path: Path) -> None:
    """`vitplasticity finetune` with a family: transformers model spec: a completed run whose
    trainable parameters are those of configuration mha."""
    spec = random_spec("dinov2")
    out = tmp_path / "run"
    assert main(cli_args(spec, demo_dataset, out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_step"] == 6
    torch.manual_seed(0)
    model = build_model(spec, num_classes=CLASSES)
    sizes = dict(model.named_parameters())
    assert summary["trainable_parameters"] == sum(sizes[n].numel() for n in MHA_DINOV2)
    assert summary["settings"]["model_spec"]["family"] == "transformers"
    assert 0 <= summary["test_accuracy"] <= 1


# --- recommend's criteria -------------------------------------------------------------------------


def test_head_warmup_and_gradient_statistics_run_the_models_own_logits() -> None:
    """The head warm-up trains the classifier alone (the backbone's flags restored); the
    gradient statistics differentiate the model's own logits."""
    torch.manual_seed(0)
    model = build_hf_model(random_spec("dinov3_vit"), num_classes=CLASSES)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    labels = torch.randint(0, CLASSES, (4,), generator=torch.Generator().manual_seed(1))
    batches = [(images(4), labels)] * 3  # one batch thrice: SGD on the head lowers its loss
    losses = head_warmup(model, batches, lr=0.01)
    assert len(losses) == 3 and losses[2] < losses[1] < losses[0]
    for name, parameter in model.named_parameters():
        assert parameter.requires_grad, name
        assert torch.equal(parameter, before[name]) != name.startswith("classifier."), name
    names = parameter_map(model).component_names("fc1")
    table = gradient_statistics(model, batches, names)
    assert table["parameter"].to_list() == names and (table["relative_gradient_norm"] > 0).all()


def test_recommend_ranks_a_transformers_dinov2(demo_dataset: Path) -> None:
    """The recommend stage end to end on a tiny transformers DINOv2 in its classification
    class: every criterion measured and ranked for every default configuration."""
    from vitplasticity.recommend.pipeline import RecommendInputs, recommend
    from vitplasticity.recommend.settings import RecommendImageSettings

    inputs = RecommendInputs(
        model="tiny-dinov2",
        dataset="demo-stripes",
        model_spec=random_spec("dinov2"),
        reference_fallback="synthetic",
    )
    settings = RecommendImageSettings(
        n_pairs=8, batch_size=4, batches=2, warmup_steps=2, device="cpu", demo=True
    )
    result = recommend(inputs, settings, demo_dataset)
    plasticity = result.table.filter(result.table["criterion"] == "plasticity")
    assert sorted(plasticity["rank"].to_list()) == list(range(1, plasticity.height + 1))
    assert result.recommendation.configuration in set(plasticity["configuration"])


# --- preprocessing ------------------------------------------------------------------------------


def write_processor(folder: Path, settings: dict[str, Any]) -> None:
    (folder / "preprocessor_config.json").write_text(json.dumps(settings))


DINOV2_PROCESSOR = {
    "image_processor_type": "BitImageProcessor",
    "do_resize": True,
    "size": {"shortest_edge": 40},
    "do_center_crop": True,
    "crop_size": {"height": 32, "width": 32},
    "resample": 3,
    "do_rescale": True,
    "rescale_factor": 0.00392156862745098,
    "do_normalize": True,
    "image_mean": [0.4, 0.5, 0.6],
    "image_std": [0.2, 0.25, 0.3],
}
"""facebook/dinov2-*'s preprocessor_config.json at 32 px: shorter side 40, center crop 32."""

VIT_PROCESSOR = {
    "image_processor_type": "ViTImageProcessor",
    "size": {"height": 32, "width": 32},
    "resample": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}
"""google/vit-*'s: a square resize, bilinear, mean = std = 0.5."""


def test_preprocessing_comes_from_the_processor_config(tmp_path: Path) -> None:
    folder = tmp_path / "dinov2"
    saved_tower("dinov2", folder)
    write_processor(folder, DINOV2_PROCESSOR)
    spec = folder_spec(folder)
    model = build_model(spec, num_classes=CLASSES)
    assert model_preprocessing(model, spec) == Preprocessing(
        32, 0.8, "bicubic", (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    )
    chosen = folder_spec(folder, normalize="imagenet", crop_pct=0.875)
    assert hf_preprocessing(model, chosen) == Preprocessing(
        32, 0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD
    )
    write_processor(folder, VIT_PROCESSOR)
    assert hf_preprocessing(model, spec) == Preprocessing(
        32, 1.0, "bilinear", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    )


def test_preprocessing_without_a_processor_config(tmp_path: Path) -> None:
    """A random init: the model's image_size and ImageNet's statistics; a checkpoint without
    its processor config under normalize: pretrained: an error naming the folder."""
    spec = random_spec("siglip_vision_model")
    model = build_hf_model(spec, num_classes=CLASSES)
    assert hf_preprocessing(model, spec) == Preprocessing(
        32, 1.0, "bicubic", IMAGENET_MEAN, IMAGENET_STD
    )
    folder = tmp_path / "bare"
    saved_tower("siglip_vision_model", folder)
    with pytest.raises(ValueError, match=r"'.*bare' has no preprocessor_config\.json"):
        hf_preprocessing(model, folder_spec(folder))
    given = {"mean": [0.1, 0.2, 0.3], "std": [1.0, 1.0, 1.0]}
    assert hf_preprocessing(model, folder_spec(folder, normalize=given)).mean == (0.1, 0.2, 0.3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"crop_size": {"height": 32, "width": 24}}, r"crop_size .*only square inputs"),
        ({"do_center_crop": False}, "shortest_edge resize without a center crop"),
        ({"resample": 1}, r"resample 1: the transforms do nearest, bilinear, bicubic"),
    ],
)
def test_processor_configs_the_transforms_cannot_follow_are_refused(
    change: dict[str, Any], message: str, tmp_path: Path
) -> None:
    folder = tmp_path / "dinov2"
    saved_tower("dinov2", folder)
    write_processor(folder, {**DINOV2_PROCESSOR, **change})
    spec = folder_spec(folder)
    with pytest.raises(ValueError, match=message):
        hf_preprocessing(build_hf_model(spec), spec)


# --- the hub ------------------------------------------------------------------------------------

HUB_SCRIPT = """
import dataclasses, json, sys
from safetensors.torch import save_file
from vitplasticity.models.architectures import architecture_for
from vitplasticity.models.hf_build import build_hf_model
from vitplasticity.models.hf_preprocessing import hf_preprocessing
from vitplasticity.models.spec import HFModelSpec
spec = HFModelSpec(**json.loads(sys.argv[1]))
try:
    model = build_hf_model(spec, num_classes=3)
except (OSError, ValueError) as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
    sys.exit(0)
tower = architecture_for(model).tower(model)
save_file({k: v.contiguous() for k, v in tower.state_dict().items()}, sys.argv[2])
print(json.dumps(dataclasses.asdict(hf_preprocessing(model, spec))))
"""


def test_hub_weights_load_at_their_revision_then_offline(tmp_path: Path) -> None:
    """weights: hub through a stand-in hub (HF_ENDPOINT): config.json, the safetensors and
    preprocessor_config.json of the revision fetched and loaded strictly; then with
    HF_HUB_OFFLINE=1 the same from the cache without a request, and a repo never fetched is an
    error naming it."""
    import subprocess
    import sys

    from safetensors.torch import load_file, save

    from tests.helpers.fake_hub import COMMIT, FakeHub, hub_env

    folder = tmp_path / "served"
    saved = saved_tower("dinov2", folder)
    write_processor(folder, DINOV2_PROCESSOR)
    files = {
        name: (folder / name).read_bytes() for name in ("config.json", "preprocessor_config.json")
    }
    files["model.safetensors"] = save({k: v.contiguous() for k, v in saved.state_dict().items()})
    hub = FakeHub({"acme/tiny-dinov2": files})
    spec = {"family": "transformers", "hf_id": "acme/tiny-dinov2", "revision": COMMIT}

    def run(entry: dict[str, Any], offline: bool) -> dict[str, Any]:
        env = hub_env(hub.url, tmp_path / "hf") | ({"HF_HUB_OFFLINE": "1"} if offline else {})
        out = tmp_path / "tower.safetensors"
        result = subprocess.run(
            [sys.executable, "-c", HUB_SCRIPT, json.dumps(entry), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        printed = json.loads(result.stdout.strip().splitlines()[-1])
        if "error" not in printed:
            assert_same_tensors(load_file(out), saved.state_dict())
        return printed

    try:
        expected = {"input_size": 32, "crop_pct": 0.8, "interpolation": "bicubic"}
        online = run(spec, offline=False)
        asked = {path for _, path in hub.file_requests()}
        for name in ("config.json", "model.safetensors", "preprocessor_config.json"):
            assert f"/acme/tiny-dinov2/resolve/{COMMIT}/{name}" in asked, name
        assert online.items() >= expected.items()
        assert online["mean"] == DINOV2_PROCESSOR["image_mean"]
        requests = len(hub.file_requests())
        assert run(spec, offline=True) == online
        assert len(hub.file_requests()) == requests, "offline: no request"
        missing = run({**spec, "hf_id": "acme/never-fetched"}, offline=True)
        assert missing["error"].startswith("FileNotFoundError: model 'acme/never-fetched@")
        assert "with HF_HUB_OFFLINE set" in missing["error"]
    finally:
        hub.stop()


def test_the_load_dtype_is_float32_unless_the_config_says(tmp_path: Path) -> None:
    saved_tower("vit", tmp_path / "vit")
    spec = folder_spec(tmp_path / "vit", config={"dtype": "float64"})
    assert {p.dtype for p in build_hf_model(spec).parameters()} == {torch.float64}
    wide = random_spec("vit", config={**tiny_config("vit"), "dtype": "bfloat16"})
    assert {p.dtype for p in build_hf_model(wide).parameters()} == {torch.bfloat16}
    with pytest.raises(ValueError, match=r"config\.dtype 'int8' is not a float dtype"):
        build_hf_model(random_spec("vit", config={**tiny_config("vit"), "dtype": "int8"}))
