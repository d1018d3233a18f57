"""Build the timm model a config entry names, and the preprocessing that goes with it.

A timm model entry (config.yaml ``models.<name>``, ``family: timm``) has ``timm_id``, ``weights`` ("hub", "random",
or a path to a local .safetensors / .pth / .bin file), ``normalize`` ("pretrained": the
checkpoint's pretrained_cfg; "imagenet": ImageNet mean/std as the reference code did; or an
explicit ``{mean: [...], std: [...]}``), and ``kwargs`` passed on to ``timm.create_model``
(a tiny architecture for tests and the demo). ``crop_pct`` overrides the checkpoint's eval
crop fraction: 1.0 is the reference code's Resize(224) + CenterCrop(224). ``init_seed`` fixes a
random-init backbone. ``revision`` (default "main") is the hub revision of ``weights: hub``
(branch, tag or commit; the weights stage, vitplasticity.models.weights, fetches it for the workflow).

Weights load strictly (:func:`load_checkpoint`): a checkpoint that lacks a backbone tensor of
the model, holds one the model does not have, or holds one of another shape (a transformers
ViTModel file, a timm file of another depth or width) is an error naming the file and the
keys, raised when the model is built, before any compute. timm's own loading would log the
missing keys and leave those tensors a random init.

A ``family: transformers`` entry is read by :meth:`ModelSpec.from_config` too, into the spec of
:mod:`vitplasticity.models.hf`, which builds it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import timm
import torch
from torch import nn

from vitplasticity.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vitplasticity.models.weights import download, hub_file

if TYPE_CHECKING:
    from vitplasticity.models.hf import HFModelSpec

log = logging.getLogger(__name__)


TIMM_FAMILY = "timm"
"""The ``family`` of a timm model's config entry (a spec without one is a timm spec)."""


@dataclass(frozen=True)
class ModelSpec:
    """One ``family: timm`` entry of config.yaml's ``models``."""

    timm_id: str
    weights: str = "hub"
    normalize: str | dict[str, list[float]] = "pretrained"
    crop_pct: float | None = None
    init_seed: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)
    revision: str = "main"

    @property
    def model_id(self) -> str:
        """What names the model in messages: its timm id."""
        return self.timm_id

    @classmethod
    def from_config(cls, entry: dict[str, Any]) -> ModelSpec | HFModelSpec:
        """The spec of a ``models`` entry, rejecting unknown keys by name.

        ``family: timm``, or no family (a compute job's spec of a timm model leaves it out:
        workflow/rules/common.smk), gives a :class:`ModelSpec`; ``family: transformers`` the
        :class:`~vitplasticity.models.hf.HFModelSpec` of :mod:`vitplasticity.models.hf`, so
        that every stage that reads a spec reads both families.

        Raises:
            ValueError: naming an unknown family or key, or a missing ``timm_id``.
        """
        family = entry.get("family", TIMM_FAMILY)
        if family == "transformers":
            from vitplasticity.models.hf import HFModelSpec

            return HFModelSpec.from_config(entry)
        if family != TIMM_FAMILY:
            raise ValueError(
                f"model entry family {family!r}: expected {TIMM_FAMILY!r} or 'transformers'"
            )
        entry = {key: value for key, value in entry.items() if key != "family"}
        known = {"timm_id", "weights", "normalize", "crop_pct", "init_seed", "kwargs", "revision"}
        unknown = set(entry) - known
        if unknown:
            raise ValueError(
                f"unknown model keys {sorted(unknown)} (family: {TIMM_FAMILY}); "
                f"known: {sorted(known | {'family'})}"
            )
        if "timm_id" not in entry:
            raise ValueError(f"model entry (family: {TIMM_FAMILY}) lacks 'timm_id'")
        return cls(**entry)


def build_model(spec: ModelSpec | HFModelSpec, num_classes: int = 0) -> nn.Module:
    """Create the model of ``spec`` with a fresh ``num_classes``-way head (0: no head).

    A ``family: transformers`` spec is built by :func:`vitplasticity.models.hf.build_hf_model`.

    ``weights: random`` draws the backbone from ``init_seed`` (:func:`_random_init`). A
    weights file, or the hub file of ``weights: hub`` (fetched into, or found offline in, the
    huggingface_hub cache), is loaded strictly (:func:`load_checkpoint`): every backbone
    tensor from the file, or an error. The model is first drawn from the caller's RNG as
    ``timm.create_model(pretrained=True)`` draws it, so a matching checkpoint gives the same
    model (the new head included) and leaves the RNG where timm's own loading left it.

    Raises:
        FileNotFoundError: when ``weights`` is a path that does not exist.
        ValueError: when ``weights`` is neither "hub", "random" nor a path; when the hub has
            no safetensors file for the timm id (:func:`vitplasticity.models.weights.hub_file`);
            when the checkpoint does not match the model (missing, unexpected or
            differently shaped keys, named with the file).
        RuntimeError: ``weights: hub`` when the hub cannot be reached and the file is not in
            the cache.
    """
    if getattr(spec, "family", None) == "transformers":  # an HFModelSpec
        from vitplasticity.models.hf import build_hf_model

        return build_hf_model(spec, num_classes)  # type: ignore[arg-type]
    if spec.weights == "random":
        return _random_init(spec, num_classes)
    kwargs = {**spec.kwargs, "num_classes": num_classes}
    # Merged into the caller's own overlay (kwargs may carry one, e.g. another hf_hub_id),
    # as timm.create_model(pretrained=True) got it: the model's pretrained_cfg is unchanged.
    overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
    if spec.weights == "hub":
        source = hub_file(spec.timm_id, spec.revision, spec.kwargs)
        if spec.revision != "main":
            overlay["hf_hub_id"] = f"{source.repo_id}@{source.revision}"
        path = download(source, "?", spec.timm_id)
    else:
        path = Path(spec.weights)
        if not path.suffix:
            raise ValueError(
                f"model weights {spec.weights!r}: expected 'hub', 'random' or a weights file path"
            )
        if not path.is_file():
            raise FileNotFoundError(f"model weights file not found: {path}")
        overlay["file"] = str(path)
    model = timm.create_model(
        spec.timm_id, pretrained=False, pretrained_cfg_overlay=overlay or None, **kwargs
    )
    load_checkpoint(model, path, spec.timm_id)
    return model


def load_checkpoint(model: nn.Module, path: str | Path, name: str) -> None:
    """Load the weights file ``path`` into ``model``'s backbone, strictly.

    The file is read as timm reads a checkpoint file (``timm.models.load_state_dict``:
    safetensors, or a torch .pth/.bin loaded with ``weights_only``; a nested ``state_dict``,
    ``model`` or EMA entry taken, a ``module.`` prefix dropped), then converted by the
    ``checkpoint_filter_fn`` of the model's timm module, the renames timm applies to its own
    pretrained files (:func:`_family_filter`). The checkpoint's classifier (the
    pretrained_cfg's ``classifier`` keys) is dropped: the model's head is new. Then every
    other tensor of the model must come from the file with its shape, and nothing else may be
    in it; the model is untouched unless it does.

    Args:
        model: a timm model, built without pretrained weights.
        path: the weights file.
        name: the model's name in messages (its timm id).

    Raises:
        ValueError: naming the file, ``name`` and the first keys, when keys are missing,
            unexpected or of another shape.
    """
    from timm.models import load_state_dict

    state = load_state_dict(str(path))
    convert = _family_filter(model)
    if convert is not None:
        state = convert(state, model)
    new, dropped = _new_head_prefixes(model)
    head_keys = [key for key in state if key.startswith(dropped)]
    if head_keys:
        log.info("%s: the checkpoint's head dropped (%s)", path, ", ".join(head_keys))
    state = {key: value for key, value in state.items() if key not in head_keys}
    expected = {key: value for key, value in model.state_dict().items() if not key.startswith(new)}
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    shapes = [
        f"{key} {tuple(state[key].shape)} in the file, {tuple(value.shape)} in the model"
        for key, value in expected.items()
        if key in state and state[key].shape != value.shape
    ]
    problems = [
        _listed(len(keys), what, keys)
        for keys, what in (
            (missing, "missing keys"),
            (unexpected, "unexpected keys"),
            (shapes, "shape mismatches"),
        )
        if keys
    ]
    if problems:
        where = f"{convert.__module__}.checkpoint_filter_fn" if convert else "no renames"
        raise ValueError(
            f"{path} does not match {name}: {', '.join(problems)} (after {where}; "
            "the checkpoint's classifier keys dropped)"
        )
    head = {key: value for key, value in model.state_dict().items() if key.startswith(new)}
    model.load_state_dict({**state, **head})


_SHOWN_KEYS = 4


def _listed(count: int, what: str, keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN_KEYS]) + (", ..." if count > _SHOWN_KEYS else "")
    return f"{count} {what} ({shown})"


def _family_filter(model: nn.Module) -> Callable | None:
    """The ``checkpoint_filter_fn`` of the timm module that defines the model's class.

    It is the conversion timm's own entrypoints pass to ``load_pretrained`` for that family:
    timm.models.vision_transformer's maps OpenAI CLIP, OpenCLIP, original DINOv2 (registers
    into ``reg_token``, ``w12``/``w3`` into ``fc1``/``fc2``, ``mask_token`` dropped), I-JEPA
    and AIMv2 checkpoints to timm's names; eva's maps EVA, DINOv3 and PE checkpoints; beit's
    drops the ``relative_position_index`` buffers. Each also resamples ``pos_embed`` and the
    patch kernel to the model's grid when the checkpoint's differs (bicubic: the FlexiViT and
    RADIO entrypoints of timm ask bilinear instead, and are not special-cased here). None
    when the module has no such function (the keys are then compared as they are).
    """
    module = sys.modules.get(type(model).__module__)
    return getattr(module, "checkpoint_filter_fn", None)


def _new_head_prefixes(model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The key prefixes of the model's new head, and those of a checkpoint's head to drop.

    The new head: the classifier module(s) the model's pretrained_cfg names (``head``; DeiT's
    distilled ``head``, ``head_dist``). Dropped from the checkpoint: those, and an attention
    pooling (``attn_pool``, SigLIP's MAP head) where the model pools otherwise
    (``global_pool`` other than "map"), the one case timm's VisionTransformer entrypoint
    loads non-strictly for.
    """
    classifier = model.pretrained_cfg.get("classifier") or ()
    names = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    new = tuple(f"{name}." for name in names)
    pooling = ("attn_pool.",) if hasattr(model, "attn_pool") and model.attn_pool is None else ()
    return new, new + pooling


def _random_init(spec: ModelSpec, num_classes: int) -> nn.Module:
    """A random-init model whose backbone depends on ``spec.init_seed`` alone.

    It stands in for pretrained weights, so every job (plasticity, bounds, each finetuning run)
    must see the same backbone: it is drawn from its own seed, leaving the caller's RNG as it
    was. The new head is then drawn from the caller's RNG (the run seed), with timm's ViT head
    init (truncated normal, std 0.02, zero bias), as it would be on top of pretrained weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        # Without a head: the backbone must not depend on how many classes follow.
        model = timm.create_model(
            spec.timm_id, pretrained=False, **{**spec.kwargs, "num_classes": 0}
        )
    if num_classes:
        model.reset_classifier(num_classes)
        head = model.get_classifier()
        if isinstance(head, nn.Linear):
            nn.init.trunc_normal_(head.weight, std=0.02)
            nn.init.zeros_(head.bias)
    return model


def preprocessing(model: nn.Module, spec: ModelSpec | HFModelSpec) -> Preprocessing:
    """Preprocessing from the model's pretrained_cfg, with the normalisation ``spec`` asks for
    (a ``family: transformers`` spec: :func:`vitplasticity.models.hf.hf_preprocessing`)."""
    if getattr(spec, "family", None) == "transformers":  # an HFModelSpec
        from vitplasticity.models.hf import hf_preprocessing

        return hf_preprocessing(model, spec)  # type: ignore[arg-type]
    cfg = timm.data.resolve_data_config({}, model=model)
    if spec.normalize == "pretrained":
        mean, std = tuple(cfg["mean"]), tuple(cfg["std"])
    elif spec.normalize == "imagenet":
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    elif isinstance(spec.normalize, dict):
        mean, std = tuple(spec.normalize["mean"]), tuple(spec.normalize["std"])
    else:
        raise ValueError(
            f"normalize {spec.normalize!r}: expected 'pretrained', 'imagenet' or {{mean, std}}"
        )
    return Preprocessing(
        input_size=input_resolution(model),
        crop_pct=float(spec.crop_pct if spec.crop_pct is not None else cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bicubic")),
        mean=mean,  # type: ignore[arg-type]
        std=std,  # type: ignore[arg-type]
    )


def input_resolution(model: nn.Module) -> int:
    """The side of the square images the model takes.

    The model's own resolution wins over its pretrained_cfg (a tiny demo ViT at 32 px still
    carries the 224 px cfg of the architecture it was derived from).
    """
    patch_embed = getattr(model, "patch_embed", None)
    img_size = (
        getattr(patch_embed, "img_size", None)
        or timm.data.resolve_data_config({}, model=model)["input_size"][1:]
    )
    return int(img_size[-1])


def train_flops_per_image(timm_id: str, kwargs: dict[str, Any] | None = None) -> int:
    """Training FLOPs of one image for the model ``timm_id`` (and ``kwargs``) at its input
    resolution, counted by its architecture (``Architecture.train_flops_per_image``).

    The model is built on the meta device: no weights, no memory, no arithmetic (a second
    for a 7B model). The classifier is left out (``num_classes=0``), as the count leaves it.

    Raises:
        UnsupportedModel: no architecture knows the model (naming its class).
    """
    from vitplasticity.models.architectures import architecture_for

    with torch.device("meta"):
        model = timm.create_model(timm_id, pretrained=False, **{**(kwargs or {}), "num_classes": 0})
        side = input_resolution(model)
        images = torch.empty(1, 3, side, side)
    return architecture_for(model).train_flops_per_image(model, images)


def pick_device(requested: str = "auto") -> torch.device:
    """The device to run on: "auto" takes the GPU when one is present."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)
