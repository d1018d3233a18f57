"""Building the transformers model of a config entry (``family: transformers``), strictly, with a
new classification head for finetuning, and the preprocessing its checkpoint asks for.

An entry names a checkpoint (``hf_id`` at ``revision``), where its weights come from
(``weights``: "hub", a local folder holding a saved model or a hub snapshot, or "random") and
the class to build (``model_class``; by default the bare model of the checkpoint's
``model_type``, the vision tower for CLIP and SigLIP).

Loading is strict. transformers loads a Llama folder into a GPT2Model, or a checkpoint that
lacks a tensor into its class, with a warning, and leaves every weight it cannot place at its
random init: a random model would be measured or finetuned. Here the checkpoint's config.json
must have the class's ``model_type``, and every weight of the model must come from the
checkpoint with its shape and nothing else be in it; otherwise the error names the folder (or
hub id) and the first keys. Two kinds of left-over tensors are dropped (and logged), as timm's
path drops a checkpoint's classifier: a vision tower's checkpoint head (``classifier``; ViT's
``pooler``, which neither ViTForImageClassification nor any stage uses), and the rest of a
CLIP or SigLIP dual encoder (its text tower, projections and logit scale).

Attention is eager unless the entry's ``config`` says otherwise (``attn_implementation``): the
float64 plasticity and the architectures' contract compute attention as the eager kernel does.
Weights load in float32 (``config: {dtype: ...}`` overrides it); the stages cast.

Finetuning (``num_classes > 0``) puts the vision tower into its model's own classification
class, so that the pooling of the tower's output is the model's own (docs/protocol.md,
section 5), with a new head drawn from the caller's RNG (timm's ViT head init, as on the timm
path: truncated normal, std 0.02, zero bias):

| tower | classification class | pooled features |
|---|---|---|
| ViTModel | ViTForImageClassification | cls token, after the final layernorm |
| Dinov2Model, Dinov2WithRegistersModel | their ...ForImageClassification | [cls, mean of the patch tokens] (registers left out), after the final layernorm |
| DINOv3ViTModel | :class:`DINOv3ViTClassifier` (ours: transformers has none) | as DINOv2's |
| CLIPVisionModel | CLIPForImageClassification | mean of the patch tokens of the encoder output (``post_layernorm`` unused: it gets no gradient) |
| SiglipVisionModel | SiglipForImageClassification | mean of all tokens after ``post_layernorm`` (the attention-pooling ``head`` unused: no gradient) |

``transformers`` is the optional extra ``vitplasticity[extras]``
(:func:`vitplasticity.utils.optional.require_transformers`); it is imported only when a model is built.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitplasticity.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vitplasticity.models.architectures.base import UnsupportedModel
from vitplasticity.utils.optional import require_transformers

log = logging.getLogger(__name__)

FAMILY = "transformers"
"""The ``family`` of a transformers model's config entry."""

HF_MODEL_KEYS = frozenset(
    {
        "family",
        "hf_id",
        "revision",
        "weights",
        "config",
        "model_class",
        "init_seed",
        "normalize",
        "crop_pct",
    }
)
"""Keys of a transformers model's config entry (``family: transformers``)."""

TOWER_CLASSES: dict[str, str] = {"clip": "CLIPVisionModel", "siglip": "SiglipVisionModel"}
"""The default class of a dual encoder's checkpoint: its vision tower (the bare model of every
other ``model_type`` is transformers' own, ``MODEL_MAPPING_NAMES``)."""

DUAL_ENCODERS: dict[str, str] = {"clip_vision_model": "clip", "siglip_vision_model": "siglip"}
"""The ``model_type`` of the dual encoder whose checkpoint also holds a vision tower's."""

OTHER_TOWER_KEYS: dict[str, tuple[str, ...]] = {
    "clip": ("text_model.", "text_projection.", "visual_projection.", "logit_scale"),
    "siglip": ("text_model.", "logit_scale", "logit_bias"),
}
"""A dual encoder's tensors outside its vision tower, dropped when the tower is loaded."""

CLASSIFIERS: dict[str, tuple[str, str]] = {
    "ViTModel": ("ViTForImageClassification", "vit"),
    "Dinov2Model": ("Dinov2ForImageClassification", "dinov2"),
    "Dinov2WithRegistersModel": (
        "Dinov2WithRegistersForImageClassification",
        "dinov2_with_registers",
    ),
    "DINOv3ViTModel": ("DINOv3ViTClassifier", "dinov3"),
    "CLIPVisionModel": ("CLIPForImageClassification", "vision_model"),
    "SiglipVisionModel": ("SiglipForImageClassification", "vision_model"),
}
"""Per vision tower class: its classification class and where that class holds the tower."""

CHECKPOINT_HEADS: dict[str, tuple[str, ...]] = {
    **{tower: ("classifier.",) for tower in CLASSIFIERS},
    "ViTModel": ("classifier.", "pooler."),
}
"""Per vision tower class: a checkpoint's head tensors, dropped (the head is new)."""

TOWER_KWARGS: dict[str, dict[str, Any]] = {"ViTModel": {"add_pooling_layer": False}}
"""Built into every tower of the class: ViT's as ViTForImageClassification holds it."""

PREPROCESSOR_CONFIG = "preprocessor_config.json"
"""The image processor's settings in a checkpoint folder or hub repo."""

RESAMPLE: dict[int, str] = {0: "nearest", 2: "bilinear", 3: "bicubic"}
"""PIL resampling filters the eval and training transforms implement."""

SHOWN_KEYS = 5
"""How many missing or unexpected weight names an error quotes."""


@dataclass(frozen=True)
class HFModelSpec:
    """One ``family: transformers`` entry of config.yaml's ``models``."""

    hf_id: str
    """The hub repo (e.g. ``facebook/dinov2-base``); with ``weights: random``, a name only."""
    family: str = FAMILY
    revision: str = "main"
    """Hub revision of ``weights: hub`` (branch, tag or commit)."""
    weights: str = "hub"
    """"hub", "random" (``init_seed``, no download) or a local folder (config.json and
    *.safetensors, maybe preprocessor_config.json)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Config overrides; with ``weights: random`` the whole config, ``model_type`` included."""
    model_class: str | None = None
    """A transformers class name; default: the bare model of the ``model_type``."""
    init_seed: int = 0
    """The seed a random-init model is drawn from (its only source of randomness)."""
    normalize: str | dict[str, list[float]] = "pretrained"
    """"pretrained" (the image processor's), "imagenet", or ``{mean: [...], std: [...]}``."""
    crop_pct: float | None = None
    """Overrides the image processor's eval crop fraction."""

    @property
    def model_id(self) -> str:
        """What names the model in messages: its hub id."""
        return self.hf_id

    @classmethod
    def from_config(cls, entry: dict[str, Any]) -> HFModelSpec:
        """Build from a config mapping, checking it without touching the disk or the hub.

        Raises:
            ValueError: naming an unknown key, a missing ``hf_id``, another ``family``, a
                ``config`` that is not a mapping, or ``weights: random`` without
                ``config.model_type``.
        """
        unknown = set(entry) - HF_MODEL_KEYS
        if unknown:
            raise ValueError(
                f"unknown model keys {sorted(unknown)} (family: {FAMILY}); "
                f"known: {sorted(HF_MODEL_KEYS)}"
            )
        if entry.get("family") != FAMILY:
            raise ValueError(f"model entry family {entry.get('family')!r}: expected {FAMILY!r}")
        if not isinstance(entry.get("hf_id"), str) or not entry["hf_id"]:
            raise ValueError(f"model entry (family: {FAMILY}) lacks 'hf_id'")
        spec = cls(**entry)
        if not isinstance(spec.config, dict):
            raise ValueError(f"model {spec.hf_id!r}: config must be a mapping, got {spec.config!r}")
        if spec.weights == "random" and "model_type" not in spec.config:
            raise ValueError(
                f"model {spec.hf_id!r}: weights: random builds the model from its config alone: "
                "config needs model_type (e.g. dinov2) and the sizes"
            )
        return spec

    @property
    def source(self) -> str:
        """Where the weights come from, for messages: the folder, or hf_id at its revision."""
        if self.weights == "hub":
            return self.hf_id if self.revision == "main" else f"{self.hf_id}@{self.revision}"
        return self.weights


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set now (huggingface_hub reads it
    once, at import)."""
    values = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any(str(v).upper() in {"1", "ON", "YES", "TRUE"} for v in values if v is not None)


# --- building -----------------------------------------------------------------------------------


def build_hf_model(spec: HFModelSpec, num_classes: int = 0) -> nn.Module:
    """The model of ``spec``, in eval mode: the bare model (``num_classes`` 0), or a vision
    tower in its classification class with a new ``num_classes``-way head.

    The model (``weights: random``: from ``init_seed`` alone; else loaded strictly) is built
    leaving the caller's RNG as it was; the new head is then drawn from it, so a run's seed
    sets the head and nothing else.

    Raises:
        ImportError: naming the optional extra when transformers is missing.
        FileNotFoundError: for weights that are neither "hub", "random" nor a folder, a
            folder without config.json, or hub files that cannot be fetched (offline: not in
            the cache), naming the hub id and revision.
        ValueError: for a checkpoint of another model type than the class's (naming the folder
            and both types); missing, unexpected or differently shaped weights (naming the
            folder and the first keys); an unknown model class; ``num_classes`` on a class
            that is not a known vision tower.
    """
    if spec.weights not in ("hub", "random") and not Path(spec.weights).is_dir():
        raise FileNotFoundError(
            f"model weights {spec.weights!r} ({spec.hf_id}): not 'hub', 'random' nor a saved "
            "model folder"
        )
    transformers = require_transformers()
    overrides = dict(spec.config)
    overrides.setdefault("attn_implementation", "eager")
    dtype = _dtype(overrides.pop("dtype", "float32"), spec)
    with torch.random.fork_rng(devices=[]):
        if spec.weights == "random":
            torch.manual_seed(spec.init_seed)
            model = random_model(transformers, spec, overrides).to(dtype)
        else:
            model = load_strict(transformers, spec, overrides, dtype)
    if num_classes:
        model = with_classifier(transformers, model, num_classes)
    return model.eval()


def _dtype(name: Any, spec: HFModelSpec) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"model {spec.hf_id!r}: config.dtype {name!r} is not a float dtype")
    return dtype


def model_class_for(transformers: Any, name: str | None, model_type: Any, source: str) -> type:
    """The class to build: ``name``, or the bare model of ``model_type``.

    Raises:
        ValueError: naming ``source`` when the class is not a transformers model class or no
            bare model is known for the model type.
    """
    if name is None:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        name = TOWER_CLASSES.get(model_type) or MODEL_MAPPING_NAMES.get(model_type)
        if name is None:
            raise ValueError(
                f"model {source!r}: no transformers model class for model_type {model_type!r}: "
                "name one (model_class)"
            )
    found = getattr(transformers, name, None)
    if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
        raise ValueError(f"model {source!r}: model_class {name!r} is not a transformers model")
    return found


def expected_model_types(model_class: type) -> tuple[str, ...]:
    """The config.json ``model_type`` values that load into ``model_class``: its config's,
    and that of the dual encoder whose checkpoint holds it (CLIP, SigLIP vision towers)."""
    own = model_class.config_class.model_type
    return (own, DUAL_ENCODERS[own]) if own in DUAL_ENCODERS else (own,)


def check_model_type(model_type: Any, model_class: type, source: str) -> None:
    """Raise unless ``model_type`` (from ``source``'s config) loads into ``model_class``.

    Raises:
        ValueError: naming the source, both model types and the class.
    """
    expected = expected_model_types(model_class)
    if model_type not in expected:
        shown = " or ".join(repr(t) for t in expected)
        raise ValueError(
            f"model {str(source)!r}: its config.json has model_type {model_type!r}, not "
            f"{shown}: only such checkpoints load into a {model_class.__name__}"
        )


def random_model(transformers: Any, spec: HFModelSpec, overrides: dict[str, Any]) -> nn.Module:
    """``model_class(config)`` from the config overrides alone (the caller seeds the RNG).

    Raises:
        ValueError: for a model type the class does not take, or an unknown class.
    """
    settings = dict(overrides)
    model_type = settings.pop("model_type")
    model_class = model_class_for(transformers, spec.model_class, model_type, spec.hf_id)
    own = model_class.config_class.model_type
    if model_type != own:
        check_model_type(model_type, model_class, spec.hf_id)
        raise ValueError(
            f"model {spec.hf_id!r}: weights: random builds {model_class.__name__} from its own "
            f"config: give config.model_type {own!r} (and the tower's sizes), not {model_type!r}"
        )
    config = model_class.config_class(**settings)
    return model_class(config, **TOWER_KWARGS.get(model_class.__name__, {}))


def saved_config(spec: HFModelSpec) -> dict[str, Any]:
    """The config.json of ``spec``'s weights: a folder's, or the hub repo's at its revision.

    Raises:
        FileNotFoundError: naming a folder without config.json.
        ValueError: naming a config.json that is not a JSON object.
    """
    if spec.weights == "hub":
        transformers = require_transformers()
        with _named_hub_errors(spec):
            config, _ = transformers.PretrainedConfig.get_config_dict(
                spec.hf_id, revision=spec.revision, local_files_only=hub_offline()
            )
        return config
    path = Path(spec.weights) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"model folder {spec.weights!r} has no config.json: not a saved transformers model "
            "(save_pretrained writes one beside the weights)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a JSON file ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


@contextmanager
def _named_hub_errors(spec: HFModelSpec) -> Iterator[None]:
    """transformers' errors for a hub file it cannot get (its OSError names the endpoint,
    not the repo), as FileNotFoundError naming the model, its revision and HF_HUB_OFFLINE."""
    try:
        yield
    except OSError as error:
        if spec.weights != "hub":
            raise
        offline = " with HF_HUB_OFFLINE set (the cache only)" if hub_offline() else ""
        raise FileNotFoundError(
            f"model {spec.source!r} (hf_id {spec.hf_id}, revision {spec.revision}): its files "
            f"could not be fetched{offline}: {error}"
        ) from error


def load_strict(
    transformers: Any, spec: HFModelSpec, overrides: dict[str, Any], dtype: torch.dtype
) -> nn.Module:
    """``model_class.from_pretrained`` of ``spec``'s weights, refusing a checkpoint of another
    model type or one that does not fill the model exactly.

    Raises:
        ValueError: naming the source and both model types, or the first few missing,
            unexpected or differently shaped weights (a tower's checkpoint head and a dual
            encoder's other tower dropped first).
    """
    source = spec.source
    model_type = saved_config(spec).get("model_type")
    model_class = model_class_for(transformers, spec.model_class, model_type, source)
    check_model_type(model_type, model_class, source)
    where: dict[str, Any] = {}
    if spec.weights == "hub":
        where = {"revision": spec.revision, "local_files_only": hub_offline()}
    with _named_hub_errors(spec):
        model, info = model_class.from_pretrained(
            spec.hf_id if spec.weights == "hub" else spec.weights,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below, by name
            dtype=dtype,
            **where,
            **TOWER_KWARGS.get(model_class.__name__, {}),
            **overrides,
        )
    droppable = CHECKPOINT_HEADS.get(model_class.__name__, ()) + (
        OTHER_TOWER_KEYS.get(model_type, ()) if model_type in DUAL_ENCODERS.values() else ()
    )
    unexpected = sorted(str(key) for key in info.get("unexpected_keys") or ())
    dropped = [key for key in unexpected if key.startswith(droppable)]
    if dropped:
        log.info("%s: checkpoint tensors dropped (%s)", source, ", ".join(dropped))
    found = {
        "missing": sorted(str(key) for key in info.get("missing_keys") or ()),
        "unexpected": [key for key in unexpected if key not in dropped],
        "mismatched": sorted(_mismatch(item) for item in info.get("mismatched_keys") or ()),
    }
    problems = [
        f"{len(keys)} {kind} weight(s): {_shown(keys)}" for kind, keys in found.items() if keys
    ]
    if problems:
        raise ValueError(
            f"model {str(source)!r}: the checkpoint does not match {model_class.__name__}: "
            f"{'; '.join(problems)}"
        )
    return model


def _mismatch(item: Any) -> str:
    if isinstance(item, tuple) and len(item) == 3:
        key, saved, wanted = item
        return f"{key} ({tuple(saved)} in the checkpoint, {tuple(wanted)} in the model)"
    return str(item)


def _shown(keys: list[str]) -> str:
    return ", ".join(keys[:SHOWN_KEYS]) + (" ..." if len(keys) > SHOWN_KEYS else "")


# --- classification -----------------------------------------------------------------------------


class DINOv3ViTClassifier(nn.Module):
    """A ``DINOv3ViTModel`` with a linear classifier (transformers 5 has no
    DINOv3ViTForImageClassification): the smallest wrapper that pools as
    ``Dinov2ForImageClassification`` does.

    Pooling: the concatenation of the cls token and the mean of the patch tokens (the register
    tokens left out) of the tower's ``last_hidden_state`` (after its final ``norm``), so the
    classifier takes 2 x hidden_size features.
    """

    def __init__(self, dinov3: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.dinov3 = dinov3
        width = 2 * dinov3.config.hidden_size
        self.classifier = nn.Linear(width, num_classes, device="meta")  # drawn by the builder

    def forward(self, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        """The classifier's logits of ``pixel_values`` (B, 3, H, W), in an
        ``ImageClassifierOutput`` as transformers' classification classes return them."""
        from transformers.modeling_outputs import ImageClassifierOutput

        outputs = self.dinov3(pixel_values, **kwargs)
        tokens = outputs.last_hidden_state  # (B, 1 + registers + patches, d)
        patches = tokens[:, 1 + self.dinov3.config.num_register_tokens :]
        logits = self.classifier(torch.cat([tokens[:, 0], patches.mean(dim=1)], dim=1))
        return ImageClassifierOutput(
            logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


def with_classifier(transformers: Any, tower: nn.Module, num_classes: int) -> nn.Module:
    """``tower`` inside its classification class (:data:`CLASSIFIERS`) with a new
    ``num_classes``-way classifier drawn from the caller's RNG.

    The class is built on the meta device (no second backbone in memory, no draw from the
    RNG), then holds ``tower`` itself where it holds its own: its forward pass is the class's,
    its backbone the tower's weights.

    Raises:
        ValueError: naming the class when it is not a known vision tower.
        UnsupportedModel: when the class holds parts beside the tower and the classifier.
    """
    name = type(tower).__name__
    if name not in CLASSIFIERS:
        raise ValueError(
            f"{name} has no classification class here (num_classes {num_classes}): finetuning "
            f"takes a vision tower, one of {', '.join(sorted(CLASSIFIERS))}"
        )
    class_name, attribute = CLASSIFIERS[name]
    if class_name == DINOv3ViTClassifier.__name__:
        model: nn.Module = DINOv3ViTClassifier(tower, num_classes)
    else:
        model_class = getattr(transformers, class_name)
        if model_class.config_class is type(tower.config):
            config = copy.deepcopy(tower.config)
            config.num_labels = num_classes
        else:  # CLIP, SigLIP: the dual encoder's config, around the tower's
            config = _dual_encoder_config(transformers, model_class, tower, num_classes)
        with torch.device("meta"):
            model = model_class(config)
        setattr(model, attribute, tower)
    model.classifier = new_head(model.classifier, tower)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise UnsupportedModel(
            f"{type(model).__name__} holds {_shown(left)} beside its {attribute} and classifier: "
            "not built here"
        )
    return model


def _dual_encoder_config(
    transformers: Any, model_class: type, tower: nn.Module, num_classes: int
) -> Any:
    """The dual encoder's config that ``model_class`` takes, around the tower's config.

    Its text config is the default one and is never built; SigLIP's default text config makes
    transformers warn about its token ids, which says nothing about this model: that warning
    is not shown.
    """
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return model_class.config_class(
            vision_config=tower.config.to_dict(),  # a copy: the tower's config stays its own
            num_labels=num_classes,
            attn_implementation=tower.config._attn_implementation,
        )
    finally:
        transformers.logging.set_verbosity(verbosity)


def new_head(template: nn.Module, tower: nn.Module) -> nn.Linear:
    """A new linear classifier of ``template``'s shape on the tower's device and dtype, drawn
    from the caller's RNG: truncated normal (std 0.02) weight, zero bias (timm's ViT head init,
    as the timm path draws it)."""
    if not isinstance(template, nn.Linear):
        raise UnsupportedModel(f"classifier {type(template).__name__}: expected a Linear")
    reference = next(tower.parameters())
    # Built on the meta device: nn.Linear's own init would draw from the RNG first.
    head = nn.Linear(template.in_features, template.out_features, device="meta")
    head = head.to_empty(device=reference.device).to(reference.dtype)
    with torch.no_grad():
        nn.init.trunc_normal_(head.weight, std=0.02)
        nn.init.zeros_(head.bias)
    return head


# --- preprocessing ------------------------------------------------------------------------------


def hf_preprocessing(model: nn.Module, spec: HFModelSpec) -> Preprocessing:
    """The preprocessing of ``spec``'s checkpoint, from its image processor config
    (preprocessor_config.json beside the weights), with the normalisation ``spec`` asks for.

    The eval transform is a resize of the shorter side then a center crop (timm's crop_pct
    convention): a processor's ``{shortest_edge: s}`` resize and ``c`` crop is crop_pct c / s;
    a square ``{height, width}`` resize (ViT, SigLIP, DINOv3) is crop_pct 1 (the same on square
    images; a non-square one is cropped, not squashed). ``resample`` gives the interpolation.
    Without weights (``random``) or without a processor config: the model's ``image_size``,
    crop_pct 1 (or ``spec.crop_pct``), bicubic; "pretrained" normalisation is then ImageNet's
    for a random init and an error for a checkpoint.

    Raises:
        ValueError: for a processor config whose resize or crop is not square, a resample
            filter the transforms lack, or a checkpoint without a processor config under
            ``normalize: pretrained`` (naming the source).
        FileNotFoundError: for a hub processor config not in the cache under HF_HUB_OFFLINE.
    """
    processor = None if spec.weights == "random" else image_processor(spec)
    if processor is None:
        if spec.normalize == "pretrained" and spec.weights != "random":
            raise ValueError(
                f"model {spec.source!r} has no {PREPROCESSOR_CONFIG}, so no pretrained "
                "normalisation: put the checkpoint's beside its weights, or set normalize "
                "('imagenet' or {mean, std})"
            )
        side = _square(_tower_config(model).image_size, f"model {spec.hf_id!r} image_size")
        input_size, crop_pct, interpolation = side, 1.0, "bicubic"
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    else:
        input_size, crop_pct, interpolation = _resize_and_crop(processor, spec.source)
        mean, std = _processor_normalization(processor, spec.source)
    if spec.normalize == "imagenet":
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    elif isinstance(spec.normalize, dict):
        mean, std = tuple(spec.normalize["mean"]), tuple(spec.normalize["std"])
    elif spec.normalize != "pretrained":
        raise ValueError(
            f"normalize {spec.normalize!r}: expected 'pretrained', 'imagenet' or {{mean, std}}"
        )
    return Preprocessing(
        input_size=input_size,
        crop_pct=float(spec.crop_pct if spec.crop_pct is not None else crop_pct),
        interpolation=interpolation,
        mean=tuple(float(v) for v in mean),  # type: ignore[arg-type]
        std=tuple(float(v) for v in std),  # type: ignore[arg-type]
    )


def _tower_config(model: nn.Module) -> Any:
    from vitplasticity.models.architectures import architecture_for

    architecture = architecture_for(model)
    tower = architecture.tower(model) if hasattr(architecture, "tower") else model
    return tower.config


def preprocessor_folder(spec: HFModelSpec) -> Path | None:
    """The folder holding ``spec``'s preprocessor_config.json (None: the checkpoint has none).

    Raises:
        FileNotFoundError: when the hub file is not in the cache and the hub is offline (or
            unreachable): the weights stage fetches it with the weights.
    """
    if spec.weights != "hub" or Path(spec.hf_id).is_dir():
        folder = Path(spec.hf_id if spec.weights == "hub" else spec.weights)
        return folder if (folder / PREPROCESSOR_CONFIG).is_file() else None
    import huggingface_hub
    from huggingface_hub import errors

    try:
        path = huggingface_hub.hf_hub_download(
            spec.hf_id,
            PREPROCESSOR_CONFIG,
            revision=spec.revision,
            local_files_only=hub_offline(),
        )
    except errors.LocalEntryNotFoundError as error:
        raise FileNotFoundError(
            f"model {spec.source!r}: {PREPROCESSOR_CONFIG} is not in the huggingface_hub cache "
            f"and the hub cannot be asked (HF_HUB_OFFLINE or no connection): {error}"
        ) from error
    except errors.RemoteEntryNotFoundError:
        return None
    return Path(path).parent


def image_processor(spec: HFModelSpec) -> Any:
    """transformers' image processor of ``spec``'s checkpoint (its class defaults filled in),
    or None when the checkpoint has no preprocessor_config.json.

    Raises:
        ValueError: naming the folder when transformers cannot read the file.
    """
    folder = preprocessor_folder(spec)
    if folder is None:
        return None
    transformers = require_transformers()
    try:
        return transformers.AutoImageProcessor.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(
            f"{folder / PREPROCESSOR_CONFIG}: not an image processor ({error})"
        ) from error


def _size(size: Any, key: str) -> Any:
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def _square(size: Any, what: str) -> int:
    sides = (size, size) if isinstance(size, int) else tuple(size)
    if len(sides) != 2 or sides[0] != sides[1]:
        raise ValueError(f"{what} {size!r}: only square inputs are supported")
    return int(sides[0])


def _resize_and_crop(processor: Any, source: str) -> tuple[int, float, str]:
    """(input_size, crop_pct, interpolation) of an image processor."""
    where = f"model {source!r} {PREPROCESSOR_CONFIG}"
    if not getattr(processor, "do_resize", True):
        raise ValueError(f"{where}: do_resize false: the transforms always resize")
    size = processor.size
    shortest = _size(size, "shortest_edge")
    if shortest is not None:
        resized = int(shortest)
    elif _size(size, "height") is not None:
        resized = _square((_size(size, "height"), _size(size, "width")), f"{where}: size")
    else:
        raise ValueError(f"{where}: size {size!r}: expected shortest_edge or height and width")
    if getattr(processor, "do_center_crop", False):
        crop = processor.crop_size
        input_size = _square((_size(crop, "height"), _size(crop, "width")), f"{where}: crop_size")
    elif shortest is not None:
        raise ValueError(
            f"{where}: a shortest_edge resize without a center crop gives non-square inputs"
        )
    else:
        input_size = resized
    return input_size, input_size / resized, _interpolation(processor.resample, where)


def _interpolation(resample: Any, where: str) -> str:
    value = getattr(resample, "value", resample)  # a PIL or torchvision enum, or an int
    if isinstance(value, str) and value in RESAMPLE.values():
        return value
    if isinstance(value, int) and value in RESAMPLE:
        return RESAMPLE[value]
    raise ValueError(
        f"{where}: resample {resample!r}: the transforms do {', '.join(RESAMPLE.values())} "
        f"(PIL {', '.join(map(str, RESAMPLE))})"
    )


def _processor_normalization(
    processor: Any, source: str
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The processor's (mean, std) on pixels in [0, 1], as the transforms normalise."""
    where = f"model {source!r} {PREPROCESSOR_CONFIG}"
    if getattr(processor, "do_rescale", True) and not math.isclose(
        float(getattr(processor, "rescale_factor", 1 / 255)), 1 / 255
    ):
        raise ValueError(f"{where}: rescale_factor {processor.rescale_factor}: expected 1/255")
    if not getattr(processor, "do_normalize", True):
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    return tuple(processor.image_mean), tuple(processor.image_std)
