"""A safetensors checkpoint as the streamed measurement reads it (:mod:`.streamed`): its
files and tensor shapes from the headers alone, and where it keeps each tensor of a model,
matched by name and shape as strictly as the whole-model loaders match them.

transformers' own load-time conversions are applied as from_pretrained applies them
(``conversion_mapping``: legacy names renamed, an MoE's experts saved one by one stacked into
its fused 3-D parameters, by transformers' own operations); timm's ``checkpoint_filter_fn``
(original, non-timm checkpoints) is not: such a checkpoint is refused by name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitplasticity.models.checked_weights import (
    SAFETENSORS_SUFFIX,
    check_finite,
    check_safetensors_file,
)
from vitplasticity.models.spec import ModelSpec

log = logging.getLogger(__name__)

_SHOWN = 4


class NotStreamable(ValueError):
    """A model or checkpoint the streamed path cannot measure: the message says why, and
    that the whole-model path (``stream: never``) can."""


def checkpoint_files(spec: ModelSpec) -> list[Path]:
    """The safetensors files of ``spec``'s local weights: the timm file, or a transformers
    folder's (sharded or not).

    Raises:
        NotStreamable: for ``weights: random`` or ``hub`` (the workflow gives compute jobs a
            local path), or weights that are not safetensors.
        FileNotFoundError: for a path that is not there.
    """
    weights = str(getattr(spec, "weights", "random"))
    if weights in ("random", "hub"):
        raise NotStreamable(
            f"model {spec.model_id!r}: weights {weights!r} are not a local safetensors "
            "checkpoint to stream from; measure it whole (stream: never)"
        )
    path = Path(weights)
    if not path.exists():
        raise FileNotFoundError(f"model weights not found: {path}")
    files = [path] if path.is_file() else sorted(path.glob(f"*{SAFETENSORS_SUFFIX}"))
    if not files or any(file.suffix != SAFETENSORS_SUFFIX for file in files):
        raise NotStreamable(
            f"model {spec.model_id!r}: {path} holds no safetensors weights, which the streamed "
            "measurement reads tensor by tensor; measure it whole (stream: never)"
        )
    for file in files:
        check_safetensors_file(file)
    return files


def checkpoint_shapes(files: list[Path]) -> dict[str, tuple[Path, tuple[int, ...], str]]:
    """Every tensor of the safetensors ``files``: key -> (file, shape, dtype), from their
    headers alone (no tensor is read).

    Raises:
        NotStreamable: naming a key two files hold.
    """
    from safetensors import safe_open

    found: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if key in found:
                    raise NotStreamable(f"{key} is in both {found[key][0]} and {file}")
                stored = handle.get_slice(key)
                found[key] = (file, tuple(stored.get_shape()), stored.get_dtype())
    return found


def checkpoint_bytes(files: list[Path], dtype: torch.dtype) -> int:
    """The bytes every tensor of the safetensors ``files`` takes in ``dtype`` (headers only)."""
    size = torch.empty((), dtype=dtype).element_size()
    count = 0
    for _, shape, _ in checkpoint_shapes(files).values():
        count += int(torch.Size(shape).numel())
    return count * size


@dataclass(frozen=True)
class Source:
    """Where the checkpoint keeps one tensor of the model: one key, or (``converter``) the
    keys transformers merges into it as it loads them, by source pattern, in order (an
    MoE's experts saved one by one, stacked and joined into its fused 3-D parameter)."""

    parts: dict[str | None, list[tuple[Path, str]]]
    converter: Any = None

    def stored(self) -> list[tuple[Path, str]]:
        """Every (file, key) it is read from."""
        return [item for items in self.parts.values() for item in items]

    def read(self, handles: Mapping[Path, Any], source: str) -> torch.Tensor:
        """The tensor, read (and converted) from the open safetensors ``handles``.

        Raises:
            ValueError: naming the checkpoint and a tensor that is not finite.
        """
        read = {
            pattern: [handles[file].get_tensor(key) for file, key in items]
            for pattern, items in self.parts.items()
        }
        for pattern, tensors in read.items():
            keys = [key for _, key in self.parts[pattern]]
            check_finite(zip(keys, tensors, strict=True), source)
        if self.converter is None:
            return read[None][0]
        return _converted(self.converter, read)


def _converted(converter: Any, tensors: dict[str | None, list[torch.Tensor]]) -> torch.Tensor:
    """``converter``'s operations (transformers' own: stack the experts, join gate and up)
    applied to ``tensors`` by source pattern: the one tensor it makes.

    Raises:
        NotStreamable: when it makes several (a split).
    """
    found: dict[str, Any] = dict(tensors)  # type: ignore[arg-type]
    patterns = {
        "source_patterns": list(converter.source_patterns),
        "target_patterns": list(converter.target_patterns),
    }
    for operation in converter.operations:
        found = operation.convert(found, **patterns)
    if len(found) != 1:
        raise NotStreamable(
            f"transformers' {converter.operations} makes {len(found)} tensors of "
            f"{converter.source_patterns}: the streamed measurement merges, not splits"
        )
    return next(iter(found.values()))


@dataclass(frozen=True)
class Naming:
    """How a checkpoint names the model's tensors (:func:`match_checkpoint`)."""

    rename: Any = None
    """key -> (the model's name for it, the source pattern of the converter that merges it
    into that tensor, or None); None: the key is the name."""
    converter: Any = None
    """source pattern -> its converter (transformers' ``WeightConverter``)."""
    outside: str = ""
    """The prefix of the model's own tensors in a task class's checkpoint: a key outside it
    is the task's head, not read ('' : none)."""
    dropped: tuple[str, ...] = ()
    """Key prefixes of a checkpoint's head that the bare model drops (logged, not read)."""
    unused: str | None = None
    """A module of the model no stage runs (BERT's pooler): a checkpoint without it is
    accepted, as the whole-model loader accepts it."""


def transformers_naming(model: nn.Module) -> Naming:
    """transformers' own renames of legacy checkpoint keys (``conversion_mapping``: ViT's
    ``encoder.layer.`` to ``layers.``...) and its base-model prefix, as from_pretrained
    applies them."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    from vitplasticity.models.architectures import declared

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = getattr(model, "base_model_prefix", "") or ""
    names = model.state_dict()

    def rename(key: str) -> tuple[str, str | None]:
        return rename_source_key(key, renamings, converters, prefix or None, names)

    def converter(pattern: str) -> Any:
        return next(c for c in converters if pattern in c.source_patterns)

    class_name = type(model).__name__
    model_type = getattr(model.config, "model_type", None)
    dropped = declared("checkpoint_heads").get(class_name, ()) + declared("other_tower_keys").get(
        model_type, ()
    )
    unused = declared("unused_modules").get(class_name)
    return Naming(rename, converter, f"{prefix}." if prefix else "", dropped, unused)


def match_checkpoint(
    model: nn.Module,
    checkpoint: Mapping[str, tuple[Path, tuple[int, ...], str]],
    source: str,
    naming: Naming | None = None,
) -> dict[str, Source]:
    """Skeleton tensor name -> where the checkpoint keeps it: every parameter, and every
    persistent buffer the checkpoint holds, with its shape, the keys renamed (and merged) as
    ``naming`` says.

    A checkpoint tensor left over must be a head (outside ``naming.outside``, or under one of
    ``naming.dropped``): logged, not read.

    Raises:
        NotStreamable: naming the missing, unexpected and differently shaped tensors.
    """
    naming = naming or Naming()
    expected = model.state_dict(keep_vars=True)
    found: dict[str, dict[str | None, list[tuple[Path, str]]]] = {}
    converters: dict[str, Any] = {}
    unexpected, head = [], []
    for key in sorted(checkpoint, key=_natural):
        file = checkpoint[key][0]
        name, pattern = naming.rename(key) if naming.rename else (key, None)
        if name in expected:
            found.setdefault(name, {}).setdefault(pattern, []).append((file, key))
            if pattern is not None:
                converters[name] = naming.converter(pattern)
        elif key.startswith(naming.dropped) or (
            naming.outside and not name.startswith(naming.outside)
        ):
            head.append(key)
        else:
            unexpected.append(key)
    keys = {name: Source(parts, converters.get(name)) for name, parts in found.items()}
    shapes = [
        f"{name} {shape} from the file, {tuple(expected[name].shape)} in the model"
        for name, item in keys.items()
        if (shape := _stored_shape(item, checkpoint)) != tuple(expected[name].shape)
    ]
    missing = [name for name, _ in model.named_parameters() if name not in keys]
    unused = [n for n in missing if naming.unused and n.startswith(f"{naming.unused}.")]
    missing = [name for name in missing if name not in unused]
    problems = [
        _listed(found, what)
        for found, what in (
            (missing, "missing tensors"),
            (unexpected, "unexpected tensors"),
            (shapes, "shape mismatches"),
        )
        if found
    ]
    if problems:
        raise NotStreamable(
            f"{source} does not hold {type(model).__name__}'s tensors under their names: "
            f"{'; '.join(problems)}. The streamed measurement reads each tensor by the name "
            "transformers or timm gives it; measure this checkpoint whole (stream: never)"
        )
    if head:
        log.info("%s: tensors outside the model not read (%s)", source, _shown(head))
    if unused:
        log.info("%s: the checkpoint holds no %s; no stage runs it", source, naming.unused)
    return keys


def _natural(key: str) -> list[Any]:
    """A key's sort order with its numbers as numbers (``experts.10`` after ``experts.9``):
    the order a converter stacks the experts in."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in key.split(".")]


def _stored_shape(item: Source, checkpoint: Mapping[str, tuple[Any, ...]]) -> tuple[int, ...]:
    """The shape ``item`` reads as: its key's, or its converter's output on meta tensors of
    the keys' shapes (no data read)."""
    metas = {
        pattern: [torch.empty(checkpoint[key][1], device="meta") for _, key in items]
        for pattern, items in item.parts.items()
    }
    if item.converter is None:
        return tuple(metas[None][0].shape)
    return tuple(_converted(item.converter, metas).shape)


def _shown(keys: list[str]) -> str:
    return ", ".join(keys[:_SHOWN]) + (", ..." if len(keys) > _SHOWN else "")


def _listed(keys: list[str], what: str) -> str:
    return f"{len(keys)} {what} ({_shown(keys)})"


def timm_head_prefixes(model: nn.Module) -> tuple[str, ...]:
    """A timm checkpoint's classifier and attention pooling, which a bare model drops (as
    :func:`vitplasticity.models.timm_build.load_checkpoint` does)."""
    from vitplasticity.models.timm_build import new_head_prefixes

    return new_head_prefixes(model)[1]
