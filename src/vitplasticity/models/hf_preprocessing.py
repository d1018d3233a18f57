"""The preprocessing of a transformers model entry's checkpoint, from its image processor.

``transformers`` is the optional extra ``vitplasticity[extras]``
(:func:`vitplasticity.utils.optional.require_transformers`); it is imported only when a model is built.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torch import nn

from vitplasticity.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vitplasticity.models.spec import HFModelSpec, hub_offline
from vitplasticity.utils.optional import require_transformers

PREPROCESSOR_CONFIG = "preprocessor_config.json"
"""The image processor's settings in a checkpoint folder or hub repo."""

RESAMPLE: dict[int, str] = {0: "nearest", 2: "bilinear", 3: "bicubic"}
"""PIL resampling filters the eval and training transforms implement."""


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
