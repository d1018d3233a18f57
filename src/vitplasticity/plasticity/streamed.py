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

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import torch
from torch import nn

from vitplasticity.models.architectures import Architecture, Embedded
from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.stream_decision import stream_decision
from vitplasticity.models.streamed import StreamedModel, open_streamed
from vitplasticity.plasticity.measure import (
    batch_pairs,
    checked_measurement,
    checked_pair_count,
    measure_protocols,
    pairs_table,
)
from vitplasticity.plasticity.norms import pair_norms
from vitplasticity.plasticity.pairs import Images
from vitplasticity.plasticity.protocols import embedding_block, in_situ_block

log = logging.getLogger(__name__)


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


def measure_streamed(
    streamed: StreamedModel,
    reference: Images,
    downstream: Images,
    *,
    protocols: Sequence[str] = ("embedding",),
    batch_size: int = 64,
    n_pairs: int | None = None,
    progress: Callable[[int], None] | None = None,
    fc1: str = "stage",
) -> pl.DataFrame:
    """:func:`vitplasticity.plasticity.measure.measure_protocols` of ``streamed``'s model,
    its blocks loaded one at a time on the device and in the dtype of
    :meth:`~vitplasticity.models.streamed.StreamedModel.to`.

    ``progress`` is called with the number of pairs times the fraction of blocks done.

    Raises:
        as :func:`~vitplasticity.plasticity.measure.measure_protocols`.
    """
    model = streamed.model
    protocols, fc1, architecture, blocks = checked_measurement(
        model, protocols, fc1, reference, batch_size, n_pairs
    )
    streamed.load_outside_blocks()
    device, dtype = streamed.device, streamed.dtype
    with torch.inference_mode():
        batches = []
        for ref_batch, down_batch in batch_pairs(
            reference, downstream, architecture, batch_size, n_pairs
        ):
            inputs = architecture.to_device(torch.cat([ref_batch, down_batch]), device, dtype)
            embedded = architecture.embed(model, inputs)
            norms = pair_norms(embedded.tokens, len(ref_batch))
            batches.append(_Batch(embedded, len(ref_batch), embedded.tokens, norms))
        total = sum(batch.pairs for batch in batches)
        checked_pair_count(total, n_pairs)
        for index in range(len(blocks)):
            with streamed.block(index) as block:
                for batch in batches:
                    _measure_block(architecture, block, index, batch, protocols, fc1)
            if progress is not None:
                progress(total * (index + 1) // len(blocks))
    return pairs_table(
        {protocol: [_stacked(batch, protocol) for batch in batches] for protocol in protocols}
    )


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


@dataclass
class MeasuredModel:
    """The model a plasticity stage measures: built whole, or streamed from its checkpoint
    (:func:`measured_model`)."""

    model: nn.Module
    """The model, or the streamed skeleton (its parameters on the meta device)."""
    streamed: StreamedModel | None
    why: str
    """How it is measured and why, as the log says."""

    def measure(self, reference: Images, downstream: Images, **options: Any) -> pl.DataFrame:
        """:func:`~vitplasticity.plasticity.measure.measure_protocols` or
        :func:`measure_streamed` of the pairs (``options``: theirs)."""
        if self.streamed is None:
            return measure_protocols(self.model, reference, downstream, **options)
        return measure_streamed(self.streamed, reference, downstream, **options)


def measured_model(
    spec: ModelSpec,
    mode: str,
    device: torch.device,
    dtype: torch.dtype,
    build: Callable[[], nn.Module],
) -> MeasuredModel:
    """The model of ``spec`` as ``mode`` (``stream``: auto, always, never) measures it on
    ``device`` in ``dtype``: ``build()`` moved there, or streamed; the log says which and why.

    Raises:
        NotStreamable: ``always`` for a checkpoint the streamed path cannot read.
        as ``build`` and :func:`~vitplasticity.models.streamed.open_streamed`.
    """
    stream, why = stream_decision(mode, spec, device, dtype)
    log.info("%s: %s", spec.model_id, why)
    if not stream:
        return MeasuredModel(build().to(device=device, dtype=dtype), None, why)
    streamed = open_streamed(spec).to(device, dtype)
    return MeasuredModel(streamed.model, streamed, why)
