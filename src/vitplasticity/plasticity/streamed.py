"""The plasticity of a model block by block from its checkpoint (docs/protocol.md, "Streamed
measurement"): memory holds the embedding, one block and the pairs' activations, never the
whole model.

The order of work is turned around from :func:`vitplasticity.plasticity.measure.measure_protocols`
(batch by batch, every block for each) to block by block, every batch for each: each batch's
embedding output is computed once and kept; then each block is loaded
(:meth:`~vitplasticity.models.streamed.StreamedModel.block`), measured on every batch by the
very per-block functions the whole-model path runs (:func:`.protocols.embedding_block`,
:func:`.protocols.in_situ_block`: the in-situ protocol carries each batch's tokens to the next
block) and freed. Each block sees the same inputs in the same order, so the numbers are the
whole-model measurement's, bit for bit (tests/plasticity/test_streamed.py, float64).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass

import torch
from torch import nn

from vitplasticity.models.architectures import Architecture, Embedded
from vitplasticity.models.streamed import StreamedModel
from vitplasticity.plasticity.norms import pair_norms
from vitplasticity.plasticity.pairs import checked_pair_count
from vitplasticity.plasticity.protocols import embedding_block, in_situ_block


@dataclass
class _Batch:
    """One batch of pairs as the blocks see it: its embedding output, and (in situ) the
    tokens the previous block left, with every block's numerators and denominators so far."""

    embedded: Embedded
    pairs: int
    tokens: torch.Tensor
    norms: torch.Tensor
    """The pair norms of the embedding output: every component's denominator, embedding
    protocol."""
    found: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)


def streamed_pairs(
    streamed: StreamedModel,
    architecture: Architecture,
    blocks: Sequence[nn.Module],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_pairs: int | None,
    *,
    protocols: Sequence[str],
    fc1: str,
    progress: Callable[[int], None] | None,
) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per protocol, each batch's (n_blocks, 5, B) numerators and denominators, as
    :func:`~vitplasticity.plasticity.measure.measure_protocols` gathers them (it checks the
    arguments, calls this for a streamed model and makes the table): ``streamed``'s ``blocks`` loaded
    one at a time on the device and in the dtype of
    :meth:`~vitplasticity.models.streamed.StreamedModel.to`, over the (reference, downstream)
    ``batches``. ``progress`` is called with the number of pairs times the fraction of blocks
    done.

    Raises:
        ValueError: for no pairs, or fewer than ``n_pairs``.
    """
    model = streamed.model
    streamed.load_outside_blocks()
    device, dtype = streamed.device, streamed.dtype
    with torch.inference_mode():
        carried = []
        for ref_batch, down_batch in batches:
            inputs = architecture.to_device(torch.cat([ref_batch, down_batch]), device, dtype)
            embedded = architecture.embed(model, inputs)
            norms = pair_norms(embedded.tokens, len(ref_batch))
            carried.append(_Batch(embedded, len(ref_batch), embedded.tokens, norms))
        total = sum(batch.pairs for batch in carried)
        checked_pair_count(total, n_pairs)
        for index in range(len(blocks)):
            with streamed.block(index) as block:
                for batch in carried:
                    _measure_block(architecture, block, index, batch, protocols, fc1)
            if progress is not None:
                progress(total * (index + 1) // len(blocks))
    return {protocol: [_stacked(batch, protocol) for batch in carried] for protocol in protocols}


def carried_bytes(
    streamed: StreamedModel,
    architecture: Architecture,
    batch: torch.Tensor,
    n_batches: int,
    protocols: Sequence[str],
) -> int:
    """The bytes :func:`streamed_pairs` keeps from block to block over ``n_batches`` batches
    like ``batch`` (its inputs, reference half first): each batch's embedding output (its
    tokens and the context every block takes), its pair norms and, in situ, the tokens the
    last block left. Counted, not computed: ``streamed`` and ``batch`` are on the meta device
    (:meth:`~vitplasticity.models.streamed.StreamedModel.to`), where the architecture's
    embedding gives the shapes and dtypes alone. The per-block sums (5 numbers per pair and
    block) are left out."""
    with torch.inference_mode():
        inputs = architecture.to_device(batch, streamed.device, streamed.dtype)
        embedded = architecture.embed(streamed.model, inputs)
        norms = pair_norms(embedded.tokens, len(batch) // 2)
    kept: list[torch.Tensor] = [norms, *_tensors_of(embedded)]
    if "in_situ" in protocols:
        kept.append(embedded.tokens)  # a second copy: the previous block's output
    return n_batches * sum(tensor.untyped_storage().nbytes() for tensor in kept)


def _tensors_of(value: object, seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every distinct tensor ``value`` holds: itself, or in its fields, items and elements
    (an :class:`Embedded` and its context: a dataclass of tuples of tensors)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        parts: Iterable[object] = value.values()
    elif isinstance(value, list | tuple):
        parts = value
    elif is_dataclass(value):
        parts = (getattr(value, f.name) for f in fields(value))
    else:
        return []
    return [tensor for part in parts for tensor in _tensors_of(part, seen)]


def _measure_block(
    architecture: Architecture,
    block: nn.Module,
    index: int,
    batch: _Batch,
    protocols: Sequence[str],
    fc1: str,
) -> None:
    """Block ``index``'s numerators and denominators of every protocol on ``batch``."""
    for protocol in protocols:
        found = batch.found.setdefault(protocol, [])
        if protocol == "embedding":
            numerator = embedding_block(
                architecture, block, index, batch.embedded, batch.pairs, fc1
            )
            found.append((numerator, batch.norms))
        else:
            batch.tokens, numerator, denominator = in_situ_block(
                architecture, block, index, batch.tokens, batch.embedded, batch.pairs, fc1
            )
            found.append((numerator, denominator))


def _stacked(batch: _Batch, protocol: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's (n_blocks, 5, B) numerators and denominators of ``protocol``."""
    numerators = torch.stack([numerator for numerator, _ in batch.found[protocol]])
    denominators = torch.stack([d.expand(n.shape) for n, d in batch.found[protocol]])
    return numerators, denominators
