"""Building a timm model entry's model (``family: timm``), and its preprocessing.

Weights load strictly (:func:`load_checkpoint`): a checkpoint that lacks a backbone tensor of
the model, holds one the model does not have, or holds one of another shape (a transformers
ViTModel file, a timm file of another depth or width) is an error naming the file and the
keys, raised when the model is built, before any compute. timm's own loading would log the
missing keys and leave those tensors a random init.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

import timm
import torch
from torch import nn

from vitplasticity.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vitplasticity.models.checked_weights import (
    SAFETENSORS_SUFFIX,
    check_finite,
    check_safetensors_file,
)
from vitplasticity.models.hub_file import hub_file
from vitplasticity.models.spec import TimmSpec
from vitplasticity.models.weights import download

log = logging.getLogger(__name__)


def build_timm_model(spec: TimmSpec, num_classes: int = 0) -> nn.Module:
    """Create the model of ``spec`` with a fresh ``num_classes``-way head (0: no head).

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
            unexpected or of another shape; naming the file, for a safetensors file that is
            not whole or a tensor that is not finite (NaN or inf).
    """
    from timm.models import load_state_dict

    if Path(path).suffix == SAFETENSORS_SUFFIX:
        check_safetensors_file(path)
    state = load_state_dict(str(path))
    check_finite(state.items(), path)
    convert = _family_filter(model)
    if convert is not None:
        state = convert(state, model)
    new, dropped = new_head_prefixes(model)
    head_keys = [key for key in state if key.startswith(dropped)]
    if head_keys:
        log.info("%s: the checkpoint's head dropped (%s)", path, ", ".join(head_keys))
    state = {key: value for key, value in state.items() if key not in head_keys}
    expected = {key: value for key, value in model.state_dict().items() if not key.startswith(new)}
    problems = _mismatches(state, expected)
    if problems:
        where = f"{convert.__module__}.checkpoint_filter_fn" if convert else "no renames"
        raise ValueError(
            f"{path} does not match {name}: {', '.join(problems)} (after {where}; "
            "the checkpoint's classifier keys dropped)"
        )
    head = {key: value for key, value in model.state_dict().items() if key.startswith(new)}
    model.load_state_dict({**state, **head})


_SHOWN_KEYS = 4


def _mismatches(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """The checkpoint's missing, unexpected and differently shaped keys, one message each."""
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    shapes = [
        f"{key} {tuple(state[key].shape)} in the file, {tuple(value.shape)} in the model"
        for key, value in expected.items()
        if key in state and state[key].shape != value.shape
    ]
    return [
        _listed(len(keys), what, keys)
        for keys, what in (
            (missing, "missing keys"),
            (unexpected, "unexpected keys"),
            (shapes, "shape mismatches"),
        )
        if keys
    ]


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


def new_head_prefixes(model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
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


def _random_init(spec: TimmSpec, num_classes: int) -> nn.Module:
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


def timm_preprocessing(model: nn.Module, spec: TimmSpec) -> Preprocessing:
    """Preprocessing from the model's pretrained_cfg, with the normalisation ``spec`` asks for."""
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
