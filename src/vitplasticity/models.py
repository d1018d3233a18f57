"""Build the timm model a config entry names, and the preprocessing that goes with it.

A model entry (config.yaml ``models.<name>``) has ``timm_id``, ``weights`` ("hub", "random",
or a path to a local .safetensors / .pth / .bin file), ``normalize`` ("pretrained": the
checkpoint's pretrained_cfg; "imagenet": ImageNet mean/std as the reference code did; or an
explicit ``{mean: [...], std: [...]}``), and ``kwargs`` passed on to ``timm.create_model``
(a tiny architecture for tests and the demo). ``crop_pct`` overrides the checkpoint's eval
crop fraction: 1.0 is the reference code's Resize(224) + CenterCrop(224).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelSpec:
    """One entry of config.yaml's ``models``."""

    timm_id: str
    weights: str = "hub"
    normalize: str | dict[str, list[float]] = "pretrained"
    crop_pct: float | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, entry: dict[str, Any]) -> ModelSpec:
        """Build from a config mapping, rejecting unknown keys by name."""
        known = {"timm_id", "weights", "normalize", "crop_pct", "kwargs"}
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
        ValueError: when ``weights`` is neither "hub", "random" nor a path.
    """
    kwargs = {**spec.kwargs, "num_classes": num_classes}
    if spec.weights == "hub":
        return timm.create_model(spec.timm_id, pretrained=True, **kwargs)
    if spec.weights == "random":
        return timm.create_model(spec.timm_id, pretrained=False, **kwargs)
    path = Path(spec.weights)
    if not path.suffix:
        raise ValueError(
            f"model weights {spec.weights!r}: expected 'hub', 'random' or a weights file path"
        )
    if not path.is_file():
        raise FileNotFoundError(f"model weights file not found: {path}")
    return timm.create_model(
        spec.timm_id, pretrained=True, pretrained_cfg_overlay={"file": str(path)}, **kwargs
    )


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
