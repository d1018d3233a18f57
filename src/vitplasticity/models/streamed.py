"""A model whose weights stay in its safetensors checkpoint until a block needs them: the
plasticity of a model larger than memory, block by block (docs/protocol.md, "Streamed
measurement").

:func:`open_streamed` builds the model of a ``models:`` entry as its family builds it (the
same class, config and sizes: :mod:`.timm_build`, :mod:`.hf_build`) but with every parameter
on the meta device, so that no weight is allocated nor initialised; buffers are built as usual
(a rotary table is computed, not stored). It then matches the skeleton's tensors with the
checkpoint's, by name and shape, as strictly as the whole-model loaders do: every parameter
from the file, nothing left over but a checkpoint's head (a task class's, or timm's
classifier), or an error naming the keys. transformers' own load-time conversions are applied
as from_pretrained applies them (``conversion_mapping``: legacy names renamed, an MoE's experts
saved one by one stacked into its fused 3-D parameters); timm's ``checkpoint_filter_fn``
(original, non-timm checkpoints) is not: such a checkpoint is refused by name. A
:class:`StreamedModel` then loads what lies outside the blocks (the embedding, the final norm)
once, and each block's tensors when :meth:`StreamedModel.block` is entered, freeing them when
it is left: memory holds one block at a time, read tensor by tensor from the safetensors files.

What it cannot stream it refuses by name (weights that are not a local safetensors checkpoint,
``weights: random`` or ``hub``, tensors named otherwise, a ``config.dtype`` override): the
whole-model path (``stream: never``) measures those. :func:`stream_decision` says when
``stream: auto`` streams.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitplasticity.models.checked_weights import (
    SAFETENSORS_SUFFIX,
    check_finite,
    check_safetensors_file,
)
from vitplasticity.models.spec import HFModelSpec, ModelSpec, TimmSpec

log = logging.getLogger(__name__)

_SHOWN = 4


class NotStreamable(ValueError):
    """A model or checkpoint the streamed path cannot measure: the message says why, and
    that the whole-model path (``stream: never``) can."""


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside hold their parameters on the meta device (shapes, no storage, no
    initialisation arithmetic) and their buffers as they would (a rotary table is computed
    at build time, and no checkpoint holds it).

    A parameter is created as its module creates it, then replaced by its meta twin, so the
    build allocates one parameter at a time at most.
    """
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, parameter: nn.Parameter | None) -> None:
        if parameter is not None and parameter.device.type != "meta":
            parameter = nn.Parameter(parameter.to("meta"), requires_grad=parameter.requires_grad)
        register(module, name, parameter)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


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
    found: dict[str, tuple[Path, tuple[int, ...], str]] = {}
    for file in files:
        with file.open("rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        for key, info in header.items():
            if key == "__metadata__":
                continue
            if key in found:
                raise NotStreamable(f"{key} is in both {found[key][0]} and {file}")
            found[key] = (file, tuple(info["shape"]), info["dtype"])
    return found


def skeleton(spec: ModelSpec) -> nn.Module:
    """The bare model of ``spec`` (no new head) in eval mode, its parameters on the meta
    device: the class, config and sizes its family's builder gives it.

    Raises:
        NotStreamable: for a family the streamed path does not know.
    """
    with parameters_on_meta():
        if isinstance(spec, TimmSpec):
            import timm

            model = timm.create_model(
                spec.timm_id, pretrained=False, **{**spec.kwargs, "num_classes": 0}
            )
        elif isinstance(spec, HFModelSpec):
            model = _hf_skeleton(spec)
        else:
            raise NotStreamable(
                f"model {spec.model_id!r}: the streamed measurement knows timm and "
                f"transformers models, not family {spec.family!r}"
            )
    return model.eval()


def _hf_skeleton(spec: HFModelSpec) -> nn.Module:
    """A transformers model of the folder's config.json and class, as :func:`.hf_build.
    load_strict` resolves them, its config overrides applied."""
    from vitplasticity.models.architectures import declared
    from vitplasticity.models.hf_build import (
        check_model_type,
        model_class_for,
        saved_class,
        saved_config,
    )
    from vitplasticity.utils.optional import require_transformers

    transformers = require_transformers()
    source = spec.source
    saved = saved_config(spec)
    overrides = dict(spec.config)
    if "dtype" in overrides:
        raise NotStreamable(
            f"model {spec.hf_id!r}: config.dtype is applied by from_pretrained; the streamed "
            "measurement casts each block to the measurement's dtype itself: drop it"
        )
    overrides.setdefault("attn_implementation", "eager")
    model_type = saved.get("model_type")
    model_class = model_class_for(
        transformers, spec.model_class or saved_class(saved, source), model_type, source
    )
    check_model_type(model_type, model_class, source)
    config = model_class.config_class.from_pretrained(spec.weights, **overrides)
    tower = declared("tower_kwargs").get(model_class.__name__, {})
    return model_class(config, **tower)


@dataclass
class StreamedModel:
    """A skeleton (:func:`skeleton`) and, per tensor of it, where its checkpoint keeps it."""

    model: nn.Module
    """Parameters on the meta device until loaded; buffers real."""
    keys: dict[str, _Source]
    """Skeleton tensor name -> where the checkpoint keeps it."""
    source: str
    """The checkpoint, in messages."""
    blocks: list[nn.Module] = field(default_factory=list)
    """The architecture's blocks, in order."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32

    def to(self, device: torch.device, dtype: torch.dtype) -> StreamedModel:
        """Measure on ``device`` in ``dtype``: the buffers move now, every tensor loaded later
        is cast there (a whole model's ``.to(device, dtype)``)."""
        self.device, self.dtype = device, dtype
        for module in self.model.modules():
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    cast = dtype if buffer.is_floating_point() else buffer.dtype
                    module._buffers[name] = buffer.to(device=device, dtype=cast)
        return self

    def load_outside_blocks(self) -> None:
        """Load every tensor that no block holds (the embedding, the final norm...) but a
        task class's head (a causal LM's untied ``lm_head``: vocabulary x width, as large as
        the embedding, and no measurement runs it), which stays on the meta device."""
        inside = {id(t) for block in self.blocks for t in _tensors(block).values()}
        inside |= {id(t) for t in _task_head_tensors(self.model)}
        self._load(self.model, lambda tensor: id(tensor) not in inside)

    @contextmanager
    def block(self, index: int) -> Iterator[nn.Module]:
        """Block ``index`` with its tensors loaded, for the duration of the ``with``; its
        parameters go back to the meta device after."""
        block = self.blocks[index]
        self._load(block, lambda tensor: True)
        try:
            yield block
        finally:
            for owner, leaf, parameter in _parameter_slots(block):
                owner._parameters[leaf] = nn.Parameter(
                    torch.empty_like(parameter, device="meta"), requires_grad=False
                )

    def block_bytes(self) -> int:
        """The largest block's parameters, in bytes of the measurement's dtype."""
        size = torch.empty((), dtype=self.dtype).element_size()
        return max(sum(p.numel() for p in block.parameters()) * size for block in self.blocks)

    def _load(self, root: nn.Module, wanted: Any) -> None:
        """Read the tensors of ``root`` that ``wanted`` keeps from the checkpoint, cast, and
        put them in place (a parameter as a frozen parameter, a buffer as a buffer)."""
        from safetensors import safe_open

        names = {id(t): n for n, t in _tensors(self.model).items()}
        slots = [
            (owner, leaf, names[id(tensor)], kind)
            for owner, leaf, tensor, kind in _slots(root)
            if wanted(tensor) and names.get(id(tensor)) in self.keys
        ]
        files = {file for _, _, name, _ in slots for file, _ in self.keys[name].stored()}
        with ExitStack() as stack:
            handles = {
                file: stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
                for file in files
            }
            for owner, leaf, name, kind in slots:
                value = self.keys[name].read(handles, self.source)
                cast = self.dtype if value.is_floating_point() else value.dtype
                value = value.to(device=self.device, dtype=cast)
                if kind == "parameter":
                    owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)
                else:
                    owner._buffers[leaf] = value


@dataclass(frozen=True)
class _Source:
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


def open_streamed(spec: ModelSpec) -> StreamedModel:
    """The streamed model of ``spec``: its skeleton, checked against the checkpoint.

    Raises:
        NotStreamable: for weights that are not a local safetensors checkpoint, a family the
            streamed path does not know, or a checkpoint whose tensors are not the
            skeleton's (missing, unexpected or of another shape, named; or tensors that
            transformers merges or splits as it loads them, which the whole-model loader
            measures).
        UnsupportedModel: for a model no architecture knows.
    """
    from vitplasticity.models.architectures import architecture_for

    files = checkpoint_files(spec)
    model = skeleton(spec)
    architecture = architecture_for(model)
    source = str(getattr(spec, "weights", ""))
    if isinstance(spec, HFModelSpec):
        naming = _transformers_naming(model)
    else:
        naming = _Naming(dropped=_timm_head_prefixes(model))
    keys = match_checkpoint(model, checkpoint_shapes(files), source, naming)
    return StreamedModel(model, keys, source, blocks=list(architecture.blocks(model)))


@dataclass(frozen=True)
class _Naming:
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


def _transformers_naming(model: nn.Module) -> _Naming:
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
    return _Naming(rename, converter, f"{prefix}." if prefix else "", dropped, unused)


def match_checkpoint(
    model: nn.Module,
    checkpoint: Mapping[str, tuple[Path, tuple[int, ...], str]],
    source: str,
    naming: _Naming | None = None,
) -> dict[str, _Source]:
    """Skeleton tensor name -> where the checkpoint keeps it: every parameter, and every
    persistent buffer the checkpoint holds, with its shape, the keys renamed (and merged) as
    ``naming`` says.

    A checkpoint tensor left over must be a head (outside ``naming.outside``, or under one of
    ``naming.dropped``): logged, not read.

    Raises:
        NotStreamable: naming the missing, unexpected and differently shaped tensors.
    """
    naming = naming or _Naming()
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
    keys = {name: _Source(parts, converters.get(name)) for name, parts in found.items()}
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


def _stored_shape(item: _Source, checkpoint: Mapping[str, tuple[Any, ...]]) -> tuple[int, ...]:
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


def _timm_head_prefixes(model: nn.Module) -> tuple[str, ...]:
    """A timm checkpoint's classifier and attention pooling, which a bare model drops (as
    :func:`vitplasticity.models.timm_build.load_checkpoint` does)."""
    from vitplasticity.models.timm_build import new_head_prefixes

    return new_head_prefixes(model)[1]


def _task_head_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors of a transformers task class outside its base model (the head); none for
    a bare model or a timm one. A tensor the base model shares (a tied LM head is the token
    embedding) is the base model's."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    if not isinstance(base, nn.Module) or base is model:
        return []
    own = {id(t) for t in _tensors(base).values()}
    return [t for t in _tensors(model).values() if id(t) not in own]


def _tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``module``, by name."""
    return {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }


def _parameter_slots(module: nn.Module) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """(owner, attribute, parameter) of every parameter below ``module``."""
    return [
        (owner, leaf, parameter)
        for owner in module.modules()
        for leaf, parameter in owner._parameters.items()
        if parameter is not None
    ]


def _slots(module: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor, str]]:
    """(owner, attribute, tensor, "parameter" | "buffer") of every tensor below ``module``."""
    found = [(owner, leaf, p, "parameter") for owner, leaf, p in _parameter_slots(module)]
    for owner in module.modules():
        for leaf, buffer in owner._buffers.items():
            if buffer is not None and leaf not in owner._non_persistent_buffers_set:
                found.append((owner, leaf, buffer, "buffer"))
    return found


STREAM_FRACTION = 0.5
"""``stream: auto`` streams a model whose weights, in the measurement's dtype, would take more
than this fraction of the device's free memory (the rest is for activations)."""


def stream_decision(
    mode: str, spec: ModelSpec, device: torch.device, dtype: torch.dtype
) -> tuple[bool, str]:
    """Whether a measurement of ``spec`` on ``device`` in ``dtype`` streams (``mode``: auto,
    always, never), and why, for the log.

    Raises:
        ValueError: for an unknown mode.
    """
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"stream: expected auto, always or never, got {mode!r}")
    if mode != "auto":
        return mode == "always", f"stream: {mode}"
    try:
        files = checkpoint_files(spec)
    except (NotStreamable, FileNotFoundError) as why:
        return False, f"measured whole ({why})"
    size = checkpoint_bytes(files, dtype)
    free = free_memory(device)
    stated = f"its weights take {_gib(size)} in {str(dtype).removeprefix('torch.')}"
    if size > STREAM_FRACTION * free:
        return True, f"streamed block by block: {stated}, more than half of {_gib(free)} free"
    return False, f"measured whole: {stated}, at most half of {_gib(free)} free"


def checkpoint_bytes(files: list[Path], dtype: torch.dtype) -> int:
    """The bytes every tensor of the safetensors ``files`` takes in ``dtype`` (headers only)."""
    size = torch.empty((), dtype=dtype).element_size()
    count = 0
    for _, shape, _ in checkpoint_shapes(files).values():
        count += int(torch.Size(shape).numel())
    return count * size


def free_memory(device: torch.device) -> int:
    """The bytes free on ``device``: a GPU's free memory, or on the CPU the memory the
    kernel says is available, capped by the process's cgroup limit (a SLURM job's)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    available = _meminfo_available()
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _meminfo_available() -> int:
    """MemAvailable of /proc/meminfo (the page count times the page size elsewhere)."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_room() -> int | None:
    """What the process's cgroup memory limit leaves (limit - usage), in the v2 or the v1
    hierarchy (a SLURM job's cgroup); None without a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            files = (root / path.lstrip("/"), "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            files = (
                root / "memory" / path.lstrip("/"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        folder, limit_file, usage_file = files
        try:
            limit = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text())
        except (OSError, ValueError):
            continue
        # v1 writes "no limit" as a page-rounded 2**63 - 1.
        if limit != "max" and int(limit) < 2**62:
            return max(int(limit) - usage, 0)
    return None


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
