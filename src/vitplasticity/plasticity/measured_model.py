"""The model a plasticity stage measures: built whole, or streamed from its checkpoint block
by block (``stream``: :mod:`vitplasticity.models.stream_decision` says when ``auto`` streams;
docs/protocol.md, "Streamed measurement")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl
import torch
from torch import nn

from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.stream_decision import stream_decision, verdict
from vitplasticity.models.streamed import StreamedModel, open_streamed, with_new_head
from vitplasticity.plasticity.measure import measure_protocols
from vitplasticity.plasticity.pairs import Images

log = logging.getLogger(__name__)


@dataclass
class MeasuredModel:
    """The model a plasticity stage measures: built whole, or streamed from its checkpoint
    (:func:`measured_model`)."""

    model: nn.Module
    """The model, or the streamed skeleton (its parameters on the meta device)."""
    streamed: StreamedModel | None
    why: str
    """Why it is measured whole or streamed
    (:func:`~vitplasticity.models.stream_decision.stream_decision`'s reason)."""

    def measure(self, reference: Images, downstream: Images, **options: Any) -> pl.DataFrame:
        """:func:`~vitplasticity.plasticity.measure.measure_protocols` of the pairs
        (``options``: its own), block by block when streamed."""
        return measure_protocols(self.streamed or self.model, reference, downstream, **options)


def measured_model(
    spec: ModelSpec,
    mode: str,
    device: torch.device,
    dtype: torch.dtype,
    build: Callable[[], nn.Module],
    num_classes: int = 0,
) -> MeasuredModel:
    """The model of ``spec`` as ``mode`` (``stream``: auto, always, never) measures it on
    ``device`` in ``dtype``: ``build()`` moved there, or streamed (with a new
    ``num_classes``-way head, as ``build`` gives the whole model one: 0, none); the log says
    which and why.

    Raises:
        NotStreamable: ``always`` for a checkpoint the streamed path cannot read.
        as ``build`` and :func:`~vitplasticity.models.streamed.open_streamed`.
    """
    stream, why = stream_decision(mode, spec, device, dtype)
    log.info("%s: %s", spec.model_id, verdict(stream, why))
    if not stream:
        return MeasuredModel(build().to(device=device, dtype=dtype), None, why)
    streamed = open_streamed(spec)
    if num_classes:
        streamed = with_new_head(streamed, spec, num_classes)
    streamed = streamed.to(device, dtype)
    return MeasuredModel(streamed.model, streamed, why)
