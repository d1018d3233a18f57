"""Finetuning beyond the plain timm ViT: what each configuration trains on the Eva and Beit
families (SwiGLU FC1, q/v biases), their per-group gradient norms, the refusal of models no
architecture knows (Swin V2, ConvNeXt) before any step, and, on the demo ViT, every
configuration's trained parameters as a hard list written from docs/protocol.md (section 5),
in order: the paper's path must not move."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.tiny_finetune import cli_args, first_batch, settings_for
from tests.helpers.tiny_vit import TINY_SPEC
from vitplasticity.cli import main
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.step import training_step
from vitplasticity.models.architectures import UnsupportedModel, registry
from vitplasticity.models.architectures.timm_vit import TimmVisionTransformer
from vitplasticity.models.lora import check_adapters_used
from vitplasticity.models.spec import TimmSpec

CPU = torch.device("cpu")
CLASSES = 4
SMALL = {"img_size": 32, "embed_dim": 48, "depth": 2, "num_heads": 3}


# One intra-op thread per module (conftest.py: tiny models run fastest so).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def spec(timm_id: str, **kwargs: Any) -> TimmSpec:
    return TimmSpec(timm_id=timm_id, weights="random", kwargs=kwargs)


def trained(model_spec: TimmSpec, configuration: str) -> list[str]:
    """The names a run of ``configuration`` trains, in ``named_parameters`` order."""
    settings = settings_for(model_spec, configuration=configuration)
    return [name for name, _ in build_run_model(settings, CLASSES, CPU).trainable]


def head_and_final_norm(names: list[str]) -> list[str]:
    """What every configuration trains besides (docs/protocol.md, section 5): the classifier
    and the final norm (``norm`` or, for a pooled model, ``fc_norm``)."""
    return [name for name in names if name.split(".")[0] in ("norm", "fc_norm", "head")]


def all_names(model_spec: TimmSpec) -> list[str]:
    return trained(model_spec, "full")


# -- Eva and Beit: the components are what the paper means ------------------------------------

DINOV3_SWIGLU = spec("vit_small_plus_patch16_dinov3", **SMALL)


def test_fc1_of_a_swiglu_dinov3_is_gate_and_up() -> None:
    """FC1 of a gated MLP is its first linear stage: gate (fc1_g) and up (fc1_x) projections.
    (Before the registry: 0 block parameters, only the head and final norm.)"""
    names = all_names(DINOV3_SWIGLU)
    fc1 = [
        f"blocks.{block}.mlp.{linear}.{kind}"
        for block in range(2)
        for linear in ("fc1_g", "fc1_x")
        for kind in ("weight", "bias")
    ]
    assert trained(DINOV3_SWIGLU, "fc1") == fc1 + head_and_final_norm(names)
    assert head_and_final_norm(names) == ["norm.weight", "norm.bias", "head.weight", "head.bias"]


@pytest.mark.parametrize(
    "model_spec",
    [
        spec("beit_base_patch16_224", **SMALL),
        spec("eva02_tiny_patch14_224", **{**SMALL, "img_size": 28}),
        spec("vit_base_patch16_rope_reg1_gap_256", **SMALL),
        spec("vit_small_patch16_dinov3_qkvb", **SMALL),
    ],
    ids=lambda s: s.timm_id,
)
def test_mha_trains_the_query_and_value_biases(model_spec: TimmSpec) -> None:
    """MHA is the whole attention module: q_bias and v_bias (and BEiT's relative position
    table) with qkv and proj, plus the LayerScale of its branch (gamma_1) where there is one.
    (Before the registry: attn.qkv and attn.proj only, the biases frozen.)"""
    names = all_names(model_spec)
    got = trained(model_spec, "mha")
    for block in range(2):
        assert {f"blocks.{block}.attn.q_bias", f"blocks.{block}.attn.v_bias"} <= set(got)
    attention = [n for n in names if re.fullmatch(r"blocks\.\d+\.(attn\..+|gamma_1)", n)]
    assert got == attention + head_and_final_norm(names)
    per_block = {re.sub(r"^blocks\.\d+\.", "", n) for n in attention}
    assert {"attn.qkv.weight", "attn.proj.weight", "attn.proj.bias"} <= per_block


def test_gradient_norm_groups_follow_the_components(demo_dataset: Path) -> None:
    """A full run's per-group gradient norms on a SwiGLU DINOv3: fc1 is gate + up, mha the
    attention with its biases and gamma_1, fc2 with gamma_2; equal to float64 norms of the
    gradients grouped by names written here. (Before: fc1_g/fc1_x and the gammas counted in
    no column.)"""
    model_spec = spec("vit_small_plus_patch16_dinov3", **SMALL)
    # No clipping: the gradients left after the step are those the norms were taken of.
    settings = settings_for(
        model_spec, configuration="full", batch_size=4, micro_batch_size=4, clip_grad_norm=1e30
    )
    run_model = build_run_model(settings, CLASSES, CPU)
    optimizer = build_optimizer(run_model.trainable, settings)
    images, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
    result = training_step(run_model, optimizer, (images, labels), 0, settings, CPU, True)
    patterns = {
        "emb": r"cls_token|reg_token|patch_embed\..+",
        "ln1": r"blocks\.\d+\.norm1\..+",
        "mha": r"blocks\.\d+\.(attn\..+|gamma_1)",
        "ln2": r"blocks\.\d+\.norm2\..+",
        "fc1": r"blocks\.\d+\.mlp\.fc1_[gx]\..+",
        "fc2": r"blocks\.\d+\.(mlp\.fc2\..+|gamma_2)",
        "head": r"(norm|head)\..+",
    }
    gradients = {n: p.grad.double() for n, p in run_model.trainable}
    expected = {}
    for group, pattern in patterns.items():
        members = [g for n, g in gradients.items() if re.fullmatch(pattern, n)]
        assert members, group
        expected[group] = float(torch.sqrt(sum(g.square().sum() for g in members)))
    assert sum(len([n for n in gradients if re.fullmatch(p, n)]) for p in patterns.values()) == (
        len(gradients)
    )
    assert result.group_norms == pytest.approx(expected, rel=1e-5)


SWIN = spec(
    "swin_tiny_patch4_window7_224",
    img_size=32,
    embed_dim=12,
    depths=(2, 2),
    num_heads=(2, 4),
    window_size=2,
)


def test_swin_components_and_patch_merging(demo_dataset: Path) -> None:
    """A timm Swin with a new head: MHA is each block's window attention with its relative
    position bias table, in every stage; the patch merging between the stages is trained by
    ``full`` alone, and gets a gradient in a full run's step."""
    names = all_names(SWIN)
    attention = [n for n in names if re.fullmatch(r"layers\.\d+\.blocks\.\d+\.attn\..+", n)]
    assert trained(SWIN, "mha") == attention + head_and_final_norm(names)
    assert {
        f"layers.{s}.blocks.{b}.attn.relative_position_bias_table"
        for s in range(2)
        for b in range(2)
    } <= set(attention)
    merging = [
        "layers.1.downsample.norm.weight",
        "layers.1.downsample.norm.bias",
        "layers.1.downsample.reduction.weight",
    ]
    assert [n for n in names if ".downsample." in n] == merging
    for configuration in ("emb", "ln1", "mha", "ln2", "fc1", "fc2", "head"):
        assert not set(merging) & set(trained(SWIN, configuration)), configuration
    settings = settings_for(SWIN, configuration="full", batch_size=4, micro_batch_size=4)
    run_model = build_run_model(settings, CLASSES, CPU)
    optimizer = build_optimizer(run_model.trainable, settings)
    images, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
    result = training_step(run_model, optimizer, (images, labels), 0, settings, CPU, True)
    # Trained by full, logged in no column (GROUPS: the configurations' own groups).
    assert set(result.group_norms) == {"emb", "ln1", "mha", "ln2", "fc1", "fc2", "head"}
    assert all(norm > 0 for norm in result.group_norms.values())
    gradients = dict(run_model.trainable)
    for name in merging:
        assert gradients[name].grad is not None and gradients[name].grad.abs().sum() > 0, name


def test_a_transformers_swin_finetunes_in_its_classification_class() -> None:
    """A bare transformers Swin entry is finetuned as SwinForImageClassification with a new
    head; the patch merging (at the end of stage 0) is trained by ``full`` alone."""
    pytest.importorskip("transformers")
    from tests.helpers.tiny_models import HF_SWIN_TINY_CONFIG
    from vitplasticity.models.spec import HFModelSpec

    config = {"model_type": "swin", **HF_SWIN_TINY_CONFIG}
    model_spec = HFModelSpec(hf_id="tiny/swin", weights="random", config=config)
    runs = {
        configuration: build_run_model(
            settings_for(model_spec, configuration=configuration), CLASSES, CPU
        )
        for configuration in ("mha", "full")
    }
    assert type(runs["mha"].model).__name__ == "SwinForImageClassification"
    assert runs["mha"].model.classifier.out_features == CLASSES
    trained = {configuration: {n for n, _ in run.trainable} for configuration, run in runs.items()}
    merging = {n for n in trained["full"] if ".downsample." in n}
    assert merging == {
        f"swin.encoder.layers.0.downsample.{p}"
        for p in ("norm.weight", "norm.bias", "reduction.weight")
    }
    assert not merging & trained["mha"]
    assert {n for n in trained["mha"] if ".blocks." in n} == {
        n for n in trained["full"] if re.search(r"\.blocks\.\d+\.attention\.", n)
    }


# -- LoRA: every adapter on the forward path, or refused -------------------------------------


@pytest.mark.parametrize(
    "model_spec",
    [
        spec("beit_base_patch16_224", **SMALL),
        spec("eva02_tiny_patch14_224", **{**SMALL, "img_size": 28}),
        spec("vit_small_patch16_dinov3_qkvb", **SMALL),
    ],
    ids=lambda s: s.timm_id,
)
def test_lora_reaches_qkv_despite_separate_biases(model_spec: TimmSpec, demo_dataset: Path) -> None:
    """With q/v biases timm's attention computes F.linear(x, qkv.weight, bias), which would
    bypass the adapter peft wraps around qkv (before: the run trained proj's adapters alone,
    and said completed). The architecture switches it to qkv(x) + bias: every qkv adapter
    gets a gradient; a bypass that remains is refused by name."""
    pytest.importorskip("peft")
    settings = settings_for(model_spec, configuration="lora", batch_size=4, micro_batch_size=4)
    run_model = build_run_model(settings, CLASSES, CPU)
    optimizer = build_optimizer(run_model.trainable, settings)
    images, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
    training_step(run_model, optimizer, (images, labels), 0, settings, CPU)
    grads = dict(run_model.trainable)
    for block in range(2):
        gradient = grads[f"blocks.{block}.attn.qkv.lora_B.default.weight"].grad
        assert gradient is not None and gradient.abs().sum() > 0
    model = run_model.model
    model.blocks[0].attn.qkv_bias_separate = False  # the bypass timm takes by default
    image = torch.zeros(
        1, 3, run_model.preprocessing.input_size, run_model.preprocessing.input_size
    )
    with pytest.raises(UnsupportedModel, match=r"never calls the adapted blocks\.0\.attn\.qkv"):
        check_adapters_used(model, image)


def test_lora_step_reaches_every_adapter(demo_dataset: Path) -> None:
    """On a DINOv3 without q/v biases every adapter (qkv and proj of each block) gets a
    gradient in a step, and only adapters, head and final norm are trained."""
    pytest.importorskip("peft")
    settings = settings_for(DINOV3_SWIGLU, configuration="lora", batch_size=4, micro_batch_size=4)
    run_model = build_run_model(settings, CLASSES, CPU)
    optimizer = build_optimizer(run_model.trainable, settings)
    images, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
    training_step(run_model, optimizer, (images, labels), 0, settings, CPU)
    adapters = {name: parameter.grad for name, parameter in run_model.trainable if ".lora_" in name}
    assert sorted(adapters) == sorted(
        f"blocks.{block}.attn.{linear}.lora_{matrix}.default.weight"
        for block in range(2)
        for linear in ("qkv", "proj")
        for matrix in "AB"
    )
    for name, gradient in adapters.items():  # B = 0 at init: B has a gradient, A's is 0
        assert gradient is not None, name
        assert ("lora_A" in name) or gradient.abs().sum() > 0, name


# -- models no architecture knows --------------------------------------------------------------

UNKNOWN = [
    (
        spec(
            "swinv2_tiny_window8_256",
            img_size=32,
            embed_dim=12,
            depths=(1, 1),
            num_heads=(1, 2),
            window_size=4,
        ),
        "SwinTransformerV2",
    ),
    (spec("convnext_atto", depths=(1, 1, 1, 1), dims=(8, 16, 32, 64)), "ConvNeXt"),
]
KNOWN_FAMILIES = ("timm_vit", "timm_eva", "timm_beit")


@pytest.mark.parametrize("configuration", ["mha", "head", "lora"])
@pytest.mark.parametrize(("model_spec", "model_class"), UNKNOWN, ids=["swinv2", "convnext"])
def test_unknown_models_are_refused(
    model_spec: TimmSpec, model_class: str, configuration: str
) -> None:
    """Before the registry every configuration "completed" with only the head trained."""
    settings = settings_for(model_spec, configuration=configuration)
    with pytest.raises(UnsupportedModel, match=model_class) as error:
        build_run_model(settings, CLASSES, CPU)
    for family in KNOWN_FAMILIES:
        assert family in str(error.value)


@pytest.mark.parametrize(("model_spec", "model_class"), UNKNOWN, ids=["swinv2", "convnext"])
def test_the_finetune_command_refuses_before_any_step(
    model_spec: TimmSpec,
    model_class: str,
    demo_dataset: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    out = tmp_path / "run"
    with caplog.at_level(logging.ERROR):
        assert main(cli_args(model_spec, demo_dataset, out)) == 2
    assert model_class in caplog.text and "known families" in caplog.text
    assert not out.exists()  # no checkpoint, no metrics: not one step


class RefusingViT(TimmVisionTransformer):
    """The timm ViT family, refusing to finetune (as a family may where the paper's
    configurations are not defined)."""

    name = "refusing_vit"

    def refusal(self, stage: str, model: torch.nn.Module) -> str | None:
        return "no finetuning here, for the test" if stage == "finetune" else None


def test_a_family_refusal_stops_finetuning(monkeypatch: pytest.MonkeyPatch) -> None:
    families = {"refusing_vit": RefusingViT(), **registry.ARCHITECTURES}
    monkeypatch.setattr(registry, "ARCHITECTURES", families)
    with pytest.raises(UnsupportedModel, match="VisionTransformer: no finetuning here"):
        build_run_model(settings_for(TINY_SPEC), CLASSES, CPU)


# -- the demo ViT: every configuration's trained names, as the paper defines them -------------

EMB = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"]
BLOCK = {
    "ln1": ["norm1.weight", "norm1.bias"],
    "mha": ["attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias"],
    "ln2": ["norm2.weight", "norm2.bias"],
    "fc1": ["mlp.fc1.weight", "mlp.fc1.bias"],
    "fc2": ["mlp.fc2.weight", "mlp.fc2.bias"],
}
LORA = [
    f"attn.{linear}.lora_{matrix}.default.weight" for linear in ("qkv", "proj") for matrix in "AB"
]
HEAD = ["norm.weight", "norm.bias", "head.weight", "head.bias"]


def expected_names(configuration: str) -> list[str]:
    """The demo ViT's (3 blocks) trained names of ``configuration``, in model order."""
    parts = configuration.split("+")
    if "full" in parts:
        parts = ["emb", *BLOCK]
    per_block = [s for c in BLOCK if c in parts for s in BLOCK[c]]
    if "lora" in parts:
        per_block = [*per_block, *LORA]  # no configuration here joins lora with a component
    blocks = [f"blocks.{i}.{suffix}" for i in range(3) for suffix in per_block]
    return (EMB if "emb" in parts else []) + blocks + HEAD


@pytest.mark.parametrize(
    "configuration",
    ["full", "emb", "ln1", "mha", "ln2", "fc1", "fc2", "head", "lora", "mha+fc1", "emb+lora"],
)
def test_demo_vit_trains_the_papers_parameters(configuration: str) -> None:
    """Unchanged by the registry: the same names, in the same order, for every configuration
    of the demo ViT (vit_tiny_patch16_224: img 32, patch 8, width 48, 3 blocks, 3 heads)."""
    if "lora" in configuration:
        pytest.importorskip("peft")
    assert TINY_SPEC.kwargs["depth"] == 3
    assert trained(TINY_SPEC, configuration) == expected_names(configuration)
