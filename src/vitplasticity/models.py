"""Build the timm model a config entry names, and the preprocessing that goes with it.

A model entry (config.yaml ``models.<name>``) has ``timm_id``, ``weights`` ("hub", "random",
or a path to a local .safetensors / .pth / .bin file), ``normalize`` ("pretrained": the
checkpoint's pretrained_cfg; "imagenet": ImageNet mean/std as the reference code did; or an
explicit ``{mean: [...], std: [...]}``), and ``kwargs`` passed on to ``timm.create_model``
(a tiny architecture for tests and the demo). ``crop_pct`` overrides the checkpoint's eval
crop fraction: 1.0 is the reference code's Resize(224) + CenterCrop(224). ``init_seed`` fixes a
random-init backbone. ``revision`` (default "main") is the hub revision of ``weights: hub``
(branch, tag or commit; the weights stage, vitplasticity.weights, fetches it for the workflow).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from vitplasticity.weights import hub_file

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelSpec:
    """One entry of config.yaml's ``models``."""

    timm_id: str
    weights: str = "hub"
    normalize: str | dict[str, list[float]] = "pretrained"
    crop_pct: float | None = None
    init_seed: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)
    revision: str = "main"

    @classmethod
    def from_config(cls, entry: dict[str, Any]) -> ModelSpec:
        """Build from a config mapping, rejecting unknown keys by name."""
        known = {"timm_id", "weights", "normalize", "crop_pct", "init_seed", "kwargs", "revision"}
        unknown = set(entry) - known
        if unknown:
            raise ValueError(f"unknown model keys {sorted(unknown)}; known: {sorted(known)}")
        if "timm_id" not in entry:
            raise ValueError("model entry lacks 'timm_id'")
        return cls(**entry)


@dataclass(frozen=True)
class Preprocessing:
    """What turns an image into the model's input: resolution, crop and normalisation."""

    input_size: int
    crop_pct: float
    interpolation: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def resize_size(self) -> int:
        """The shorter-side resize before the center crop (timm's crop_pct convention)."""
        return round(self.input_size / self.crop_pct)


def build_model(spec: ModelSpec, num_classes: int = 0) -> nn.Module:
    """Create the model of ``spec`` with a fresh ``num_classes``-way head (0: no head).

    Raises:
        FileNotFoundError: when ``weights`` is a path that does not exist.
        ValueError: when ``weights`` is neither "hub", "random" nor a path, or a ``revision``
            is asked of a timm id without hub weights.
    """
    kwargs = {**spec.kwargs, "num_classes": num_classes}
    # Merged into the caller's own overlay (kwargs may carry one, e.g. another hf_hub_id).
    overlay = dict(kwargs.pop("pretrained_cfg_overlay", None) or {})
    if spec.weights == "hub":
        if spec.revision != "main":
            source = hub_file(spec.timm_id, spec.revision, spec.kwargs)
            overlay["hf_hub_id"] = f"{source.repo_id}@{source.revision}"
        return timm.create_model(
            spec.timm_id, pretrained=True, pretrained_cfg_overlay=overlay or None, **kwargs
        )
    if spec.weights == "random":
        return _random_init(spec, num_classes)
    path = Path(spec.weights)
    if not path.suffix:
        raise ValueError(
            f"model weights {spec.weights!r}: expected 'hub', 'random' or a weights file path"
        )
    if not path.is_file():
        raise FileNotFoundError(f"model weights file not found: {path}")
    return timm.create_model(
        spec.timm_id,
        pretrained=True,
        pretrained_cfg_overlay={**overlay, "file": str(path)},
        **kwargs,
    )


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


def preprocessing(model: nn.Module, spec: ModelSpec) -> Preprocessing:
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
    # The model's own resolution wins over its pretrained_cfg (a tiny demo ViT at 32 px
    # still carries the 224 px cfg of the architecture it was derived from).
    patch_embed = getattr(model, "patch_embed", None)
    img_size = getattr(patch_embed, "img_size", None) or cfg["input_size"][1:]
    return Preprocessing(
        input_size=int(img_size[-1]),
        crop_pct=float(spec.crop_pct if spec.crop_pct is not None else cfg.get("crop_pct", 1.0)),
        interpolation=str(cfg.get("interpolation", "bicubic")),
        mean=mean,  # type: ignore[arg-type]
        std=std,  # type: ignore[arg-type]
    )


def pick_device(requested: str = "auto") -> torch.device:
    """The device to run on: "auto" takes the GPU when one is present."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)
