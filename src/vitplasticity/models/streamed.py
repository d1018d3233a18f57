"""A model whose weights stay in its safetensors checkpoint until a block needs them: the
plasticity of a model larger than memory, block by block (docs/protocol.md, "Streamed
measurement").

:func:`open_streamed` builds the model of a ``models:`` entry as its family builds it (the
same class, config and sizes: :mod:`.timm_build`, :mod:`.hf_build`) but with every parameter
on the meta device, so that no weight is allocated nor initialised; buffers are built as usual
(a rotary table is computed, not stored). It then matches the skeleton's tensors with the
checkpoint's (:mod:`.checkpoint_tensors`: by name and shape, as strictly as the whole-model
loaders, transformers' own load-time conversions applied). A :class:`StreamedModel` then loads
what lies outside the blocks (the embedding, the final norm) once, and each block's tensors when
:meth:`StreamedModel.block` is entered, freeing them when it is left: memory holds one block at
a time, read tensor by tensor from the safetensors files.

What it cannot stream it refuses by name (weights that are not a local safetensors checkpoint,
``weights: random`` or ``hub``, tensors named otherwise, a ``config.dtype`` override): the
whole-model path (``stream: never``) measures those. When ``stream: auto`` streams:
:mod:`.stream_decision`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitplasticity.models.checkpoint_tensors import (
    Naming,
    NotStreamable,
    Source,
    checkpoint_files,
    checkpoint_shapes,
    match_checkpoint,
    timm_head_prefixes,
    transformers_naming,
)
from vitplasticity.models.spec import HFModelSpec, ModelSpec, TimmSpec

log = logging.getLogger(__name__)


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
    from vitplasticity.models.hf_build import saved_model_class
    from vitplasticity.utils.optional import require_transformers

    overrides = dict(spec.config)
    if "dtype" in overrides:
        raise NotStreamable(
            f"model {spec.hf_id!r}: config.dtype is applied by from_pretrained; the streamed "
            "measurement casts each block to the measurement's dtype itself: drop it"
        )
    overrides.setdefault("attn_implementation", "eager")
    model_class, _ = saved_model_class(require_transformers(), spec)
    config = model_class.config_class.from_pretrained(spec.weights, **overrides)
    tower = declared("tower_kwargs").get(model_class.__name__, {})
    return model_class(config, **tower)


@dataclass
class StreamedModel:
    """A skeleton (:func:`skeleton`) and, per tensor of it, where its checkpoint keeps it."""

    model: nn.Module
    """Parameters on the meta device until loaded; buffers real."""
    keys: dict[str, Source]
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
        self._load(self.model, self._outside())

    def outside_bytes(self) -> int:
        """The bytes, in the measurement's dtype, of what :meth:`load_outside_blocks` loads
        (a tied tensor once): what stays in memory beside the block being measured."""
        tensors = {
            name: tensor for _, _, name, _, tensor in self._to_load(self.model, self._outside())
        }
        return sum(_bytes(tensor, self.dtype) for tensor in tensors.values())

    def _outside(self) -> Callable[[torch.Tensor], bool]:
        """Whether :meth:`load_outside_blocks` loads a tensor: neither a block's nor a task
        class's head's."""
        inside = {id(t) for block in self.blocks for t in _tensors(block).values()}
        inside |= {id(t) for t in _task_head_tensors(self.model)}
        return lambda tensor: id(tensor) not in inside

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
            if self.device.type == "cpu":
                _return_freed_memory()

    def rooted(self, root: nn.Module) -> StreamedModel:
        """The streamed model of ``root``, a model built around this one's modules (a task
        class around the base model: :func:`vitplasticity.models.text.causal_lm`,
        :func:`with_new_head`): the same checkpoint tensors under the names ``root`` gives
        them, matched by identity; a tensor of ``root``'s own (a new head) is never read."""
        names = {id(t): n for n, t in _tensors(self.model).items()}
        keys = {
            name: self.keys[names[id(tensor)]]
            for name, tensor in _tensors(root).items()
            if names.get(id(tensor)) in self.keys
        }
        return StreamedModel(root, keys, self.source, self.blocks, self.device, self.dtype)

    def block_bytes(self) -> int:
        """The largest block's parameters, in bytes of the measurement's dtype."""
        return max(sum(_bytes(p, self.dtype) for p in block.parameters()) for block in self.blocks)

    def _load(self, root: nn.Module, wanted: Callable[[torch.Tensor], bool]) -> None:
        """Read the tensors of ``root`` that ``wanted`` keeps from the checkpoint, cast, and
        put them in place (a parameter as a frozen parameter, a buffer as a buffer)."""
        from safetensors import safe_open

        slots = self._to_load(root, wanted)
        files = {file for _, _, name, _, _ in slots for file, _ in self.keys[name].stored()}
        with ExitStack() as stack:
            handles = {
                file: stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
                for file in files
            }
            loaded: dict[str, torch.Tensor] = {}  # a tied tensor (GPT2's wte and lm_head): once
            for owner, leaf, name, kind, _ in slots:
                if name not in loaded:
                    value = self.keys[name].read(handles, self.source)
                    cast = self.dtype if value.is_floating_point() else value.dtype
                    value = value.to(device=self.device, dtype=cast)
                    if kind == "parameter":
                        value = nn.Parameter(value, requires_grad=False)
                    loaded[name] = value
                if kind == "parameter":
                    owner._parameters[leaf] = loaded[name]
                else:
                    owner._buffers[leaf] = loaded[name]

    def _to_load(
        self, root: nn.Module, wanted: Callable[[torch.Tensor], bool]
    ) -> list[tuple[nn.Module, str, str, str, torch.Tensor]]:
        """(owner, attribute, checkpoint name, "parameter" | "buffer", tensor) of every tensor
        below ``root`` that ``wanted`` keeps and the checkpoint holds: what :meth:`_load`
        reads."""
        names = {id(t): n for n, t in _tensors(self.model).items()}
        return [
            (owner, leaf, names[id(tensor)], kind, tensor)
            for owner, leaf, tensor, kind in _slots(root)
            if wanted(tensor) and names.get(id(tensor)) in self.keys
        ]


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
        naming = transformers_naming(model)
    else:
        naming = Naming(dropped=timm_head_prefixes(model))
    keys = match_checkpoint(model, checkpoint_shapes(files), source, naming)
    return StreamedModel(model, keys, source, blocks=list(architecture.blocks(model)))


def with_new_head(streamed: StreamedModel, spec: ModelSpec, num_classes: int) -> StreamedModel:
    """``streamed`` with a new ``num_classes``-way classifier on the meta device, as its
    family's builder puts one on the whole model (timm's ``reset_classifier``, a transformers
    vision tower's classification class): its names and sizes are those of the model a
    finetuning run trains. No measurement runs the head, so no weight of it is drawn."""
    with parameters_on_meta():
        if isinstance(spec, TimmSpec):
            streamed.model.reset_classifier(num_classes)
            root = streamed.model
        else:
            from vitplasticity.models.hf_classifier import with_classifier
            from vitplasticity.utils.optional import require_transformers

            root = with_classifier(require_transformers(), streamed.model, num_classes)
    return streamed.rooted(root.eval())


def loaded_blocks(
    model: nn.Module | StreamedModel, blocks: Sequence[nn.Module]
) -> Iterator[tuple[int, nn.Module]]:
    """(index, block) of each of ``blocks`` (the architecture's blocks of ``model``) with its
    weights: as it is in a whole model; in a streamed one loaded until the loop moves on to the
    next (:meth:`StreamedModel.block`), so that memory holds one block."""
    for index, block in enumerate(blocks):
        if isinstance(model, StreamedModel):
            with model.block(index) as loaded:
                yield index, loaded
        else:
            yield index, block


def _return_freed_memory() -> None:
    """Hand the heap memory a freed block leaves back to the system (glibc's malloc_trim):
    otherwise glibc keeps it, block after block, and the process's resident memory grows
    to several blocks' worth (benchmarks/streamed.py measured 1.6 GiB against 1.0 GiB for a
    20-block model). A no-op where the C library has no malloc_trim."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """The C library's malloc_trim, or None (found once per process)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


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


def _bytes(tensor: torch.Tensor, dtype: torch.dtype) -> int:
    """The bytes ``tensor`` takes once loaded: a floating tensor cast to ``dtype``, any other
    as it is (as :meth:`StreamedModel._load` casts)."""
    cast = dtype if tensor.is_floating_point() else tensor.dtype
    return tensor.numel() * torch.empty((), dtype=cast).element_size()


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
