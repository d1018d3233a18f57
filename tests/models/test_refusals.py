"""The torch-free table of refusals (vitplasticity.models.refusals), which the Snakefile's config
check reads, is the architectures' own: on a tiny model of every family, every stage is refused
by the table exactly when ``architecture.refusal(stage, model)`` refuses it, with the same
reason; a config-dependent refusal (Falcon's layouts, DeBERTa-v2's convolution, a Swin grid
that is not a whole number of windows) is the one the built model gets; and the table's keys
(model types, class names, timm names, config defaults) are those of the architectures and of
transformers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.tiny_models import (
    ENCODER_TINY_CONFIG,
    HF_PARALLEL_TINY_CONFIG,
    HF_SWIN_TINY_CONFIG,
    HF_SWIN_TINY_MODELS,
    HF_VISION_TINY_MODELS,
    TIMM_SWIN_TINY_KWARGS,
    TINY_MODELS,
    TinyModel,
)
from vitplasticity.models.architectures import architecture_for
from vitplasticity.models.architectures.base import UnsupportedModel
from vitplasticity.models.architectures.registry import ARCHITECTURES
from vitplasticity.models.refusals import (
    CLASS_ARCHITECTURES,
    CONFIG_DEFAULTS,
    MODEL_TYPE_ARCHITECTURES,
    STAGE_REFUSALS,
    TIMM_SWIN_DEPTHS,
    class_architecture,
    entry_architecture,
    entry_refusals,
)
from vitplasticity.models.spec import TRANSFORMERS_MODEL_CLASSES
from vitplasticity.utils.optional import require_transformers

STAGES = (
    "plasticity embedding",
    "plasticity in_situ",
    "bounds",
    "finetune",
    "lora",
    "recommend",
    "recommend lm",
    "export",
)
"""Every stage an architecture is asked about (``Architecture.refusal``)."""

# The workflow builds a vision tower in its classification class (a bare tower has no head to
# finetune or rank with, and is refused so): the `_classifier` tiny models are those.
BARE_TOWERS = {
    tiny.id
    for tiny in (*HF_VISION_TINY_MODELS, *HF_SWIN_TINY_MODELS)
    if not tiny.id.endswith("_classifier")
}
AS_BUILT = [tiny for tiny in TINY_MODELS if tiny.id not in BARE_TOWERS]


@pytest.mark.parametrize("tiny", AS_BUILT, ids=[t.id for t in AS_BUILT])
def test_the_table_refuses_each_stage_as_the_architecture_does(tiny: TinyModel) -> None:
    model = tiny.build()
    architecture = architecture_for(model)
    assert architecture.name == tiny.family
    for stage in STAGES:
        expected = STAGE_REFUSALS.get(tiny.family, {}).get(stage)
        given = architecture.refusal(stage, model)
        assert (given is None) == (expected is None), (stage, given, expected)
        if expected is not None:
            assert given.endswith(expected), (stage, given)


def test_every_family_of_the_table_is_registered() -> None:
    assert set(STAGE_REFUSALS) <= set(ARCHITECTURES)
    families = set(MODEL_TYPE_ARCHITECTURES.values()) | set(CLASS_ARCHITECTURES.values())
    assert families <= set(ARCHITECTURES)


def test_model_types_are_the_architectures() -> None:
    """Every model type of a family with a refusal maps to it, and nothing else is mapped."""
    mapped = set(MODEL_TYPE_ARCHITECTURES.values())
    expected = {
        model_type: architecture.name
        for architecture in ARCHITECTURES.values()
        if architecture.name in mapped
        for model_type in architecture.model_types
    }
    assert expected == MODEL_TYPE_ARCHITECTURES
    assert set(STAGE_REFUSALS) - {"timm_swin"} <= mapped


def test_every_class_name_maps_as_its_model_type() -> None:
    """A ``model_class`` decides the family as the class's own config's model_type does."""
    transformers = require_transformers()
    for name in sorted(TRANSFORMERS_MODEL_CLASSES):
        model_type = getattr(transformers, name).config_class.model_type
        assert class_architecture(name) == MODEL_TYPE_ARCHITECTURES.get(model_type), name


@pytest.mark.parametrize("tiny", TINY_MODELS, ids=[t.id for t in TINY_MODELS])
def test_an_entry_names_its_family(tiny: TinyModel) -> None:
    """A timm entry by its timm_id, a transformers one by its model_class (families that refuse
    nothing: no family)."""
    if tiny.timm_id is not None:
        entry = {"family": "timm", "timm_id": tiny.timm_id}
    else:
        entry = {
            "family": "transformers",
            "hf_id": "x/y",
            "model_class": type(tiny.build()).__name__,
        }
    mapped = set(MODEL_TYPE_ARCHITECTURES.values()) | {"timm_swin"}
    assert entry_architecture(entry) == (tiny.family if tiny.family in mapped else None)


@pytest.mark.parametrize("size", sorted(TIMM_SWIN_DEPTHS))
def test_timm_swin_depths_are_timms(size: str) -> None:
    import timm

    with torch.device("meta"):
        model = timm.create_model(f"swin_{size}_patch4_window7_224", pretrained=False)
    assert tuple(len(stage.blocks) for stage in model.layers) == TIMM_SWIN_DEPTHS[size]


def test_the_config_defaults_are_transformers() -> None:
    transformers = require_transformers()
    classes = {
        "hf_bert": "BertConfig",
        "hf_falcon": "FalconConfig",
        "hf_deberta_v2": "DebertaV2Config",
        "hf_swin": "SwinConfig",
    }
    assert set(classes) == set(CONFIG_DEFAULTS)
    for family, class_name in classes.items():
        config = getattr(transformers, class_name)()
        for key, value in CONFIG_DEFAULTS[family].items():
            if family == "hf_deberta_v2" and key == "conv_kernel_size":
                continue  # not a DebertaV2Config attribute: the encoder reads it (below)
            assert getattr(config, key) == value, (family, key)
    # DebertaV2Config has no conv_kernel_size; the encoder reads its absence as 0: no conv.
    assert not hasattr(transformers.DebertaV2Config(), "conv_kernel_size")
    model = _hf("DebertaV2Config", "DebertaV2Model", ENCODER_TINY_CONFIG)
    assert CONFIG_DEFAULTS["hf_deberta_v2"]["conv_kernel_size"] == 0
    assert getattr(model.encoder, "conv", None) is None


def _hf(config_class: str, model_class: str, settings: dict) -> nn.Module:
    transformers = require_transformers()
    return getattr(transformers, model_class)(getattr(transformers, config_class)(**settings))


FALCON = {**HF_PARALLEL_TINY_CONFIG, "ffn_hidden_size": 96}
# (id, config class, model class, the config a random-init entry states)
WHOLE_MODEL_CASES = [
    ("falcon-alibi", "FalconConfig", "FalconModel", {**FALCON, "alibi": True}),
    (
        "falcon-one-norm",
        "FalconConfig",
        "FalconModel",
        {**FALCON, "new_decoder_architecture": True, "num_ln_in_parallel_attn": 1},
    ),
    ("falcon-7b-layout", "FalconConfig", "FalconModel", FALCON),
    (
        "falcon-new-sequential",
        "FalconConfig",
        "FalconModel",
        {**FALCON, "new_decoder_architecture": True, "parallel_attn": False},
    ),
    ("bert-decoder", "BertConfig", "BertModel", {**ENCODER_TINY_CONFIG, "is_decoder": True}),
    (
        "roberta-chunks",
        "RobertaConfig",
        "RobertaModel",
        {**ENCODER_TINY_CONFIG, "chunk_size_feed_forward": 4},
    ),
    (
        "deberta-conv",
        "DebertaV2Config",
        "DebertaV2Model",
        {**ENCODER_TINY_CONFIG, "conv_kernel_size": 3},
    ),
]


@pytest.mark.parametrize(
    ("config_class", "model_class", "settings"),
    [case[1:] for case in WHOLE_MODEL_CASES],
    ids=[case[0] for case in WHOLE_MODEL_CASES],
)
def test_a_config_refused_at_parse_is_refused_by_the_architecture(
    config_class: str, model_class: str, settings: dict
) -> None:
    model_type = getattr(require_transformers(), config_class).model_type
    entry = {
        "family": "transformers",
        "hf_id": "x/y",
        "weights": "random",
        "config": {"model_type": model_type, **settings},
    }
    reason = entry_refusals(entry).get(None)
    assert reason is not None
    with pytest.raises(UnsupportedModel) as error:
        model = _hf(config_class, model_class, settings)
        architecture_for(model).blocks(model)
    assert reason in str(error.value)


def test_falcon_with_two_norms_is_not_refused() -> None:
    settings = {**FALCON, "new_decoder_architecture": True}
    entry = {"family": "transformers", "hf_id": "x/y", "weights": "random"}
    assert entry_refusals({**entry, "config": {"model_type": "falcon", **settings}}) == {}
    model = _hf("FalconConfig", "FalconModel", settings)
    architecture_for(model).blocks(model)


def _timm_swin(kwargs: dict) -> nn.Module:
    import timm

    return timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kwargs)


# (id, family, kwargs of a timm Swin or config of a transformers one, whether in-situ refuses it)
SWIN_GRIDS = [
    ("timm-whole-windows", "timm", TIMM_SWIN_TINY_KWARGS, False),
    ("timm-odd-second-stage", "timm", {**TIMM_SWIN_TINY_KWARGS, "img_size": 24}, True),
    (
        "timm-odd-first-stage",
        "timm",
        {**TIMM_SWIN_TINY_KWARGS, "img_size": 36, "window_size": 4},
        True,
    ),
    ("hf-whole-windows", "transformers", HF_SWIN_TINY_CONFIG, False),
    ("hf-odd-second-stage", "transformers", {**HF_SWIN_TINY_CONFIG, "image_size": 24}, True),
]


@pytest.mark.parametrize(
    ("family", "settings", "refused"),
    [c[1:] for c in SWIN_GRIDS],
    ids=[c[0] for c in SWIN_GRIDS],
)
def test_a_swin_grid_is_refused_at_parse_as_in_situ_refuses_it(
    family: str, settings: dict, refused: bool
) -> None:
    if family == "timm":
        entry = {"family": "timm", "timm_id": "swin_tiny_patch4_window7_224", "kwargs": settings}
        model = _timm_swin(settings)
    else:
        entry = {
            "family": "transformers",
            "hf_id": "x/y",
            "weights": "random",
            "config": {"model_type": "swin", **settings},
        }
        model = _hf("SwinConfig", "SwinModel", settings)
    given = architecture_for(model).refusal("plasticity in_situ", model)
    expected = entry_refusals(entry).get("plasticity in_situ")
    assert (given is not None) == (expected is not None) == refused, (given, expected)
    if expected is not None:
        assert given.endswith(expected)
