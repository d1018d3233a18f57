"""The memory a plasticity measurement of one model holds, whole or streamed, from its
checkpoint's headers and its skeleton on the meta device: no tensor is read and nothing is
computed. The workflow turns it into a job's memory request (vitplasticity.workflow.memory).

The pieces are the ones the measurement itself loads and keeps, counted by the same code:
the whole model's weights as the stream decision counts them
(:func:`~vitplasticity.models.stream_decision.host_dtype`,
:func:`~vitplasticity.models.checkpoint_tensors.checkpoint_bytes`); what a streamed model keeps
beside its blocks and its largest block
(:meth:`~vitplasticity.models.streamed.StreamedModel.outside_bytes`,
:meth:`~vitplasticity.models.streamed.StreamedModel.block_bytes`); and what the streamed
measurement carries from block to block for every pair
(:func:`vitplasticity.plasticity.streamed.carried_bytes`), the architecture's own embedding run
on the meta device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vitplasticity.models.architectures import architecture_for
from vitplasticity.models.build import preprocessing
from vitplasticity.models.checkpoint_tensors import (
    NotStreamable,
    checkpoint_bytes,
    checkpoint_files,
)
from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.stream_decision import host_dtype
from vitplasticity.models.streamed import open_streamed
from vitplasticity.plasticity.streamed import carried_bytes

META = torch.device("meta")


@dataclass(frozen=True)
class Footprint:
    """The bytes of one model's plasticity measurement (:func:`footprint`)."""

    whole: int
    """Every checkpoint tensor in the dtype the host holds the whole model in
    (:func:`~vitplasticity.models.stream_decision.host_dtype`)."""
    outside: int | None
    """What a streamed model keeps loaded beside its blocks (the embedding, the final norm),
    in the measurement's dtype; None: the streamed path cannot read the checkpoint."""
    block: int | None
    """The largest block's parameters in the measurement's dtype; None as ``outside``."""
    carried: int | None
    """What the streamed measurement carries from block to block, every batch's; None as
    ``outside``."""
    not_streamable: str | None = None
    """Why the streamed path cannot read the checkpoint (None: it can)."""


@dataclass(frozen=True)
class Pairs:
    """The pairs a stage measures, as its settings say."""

    n_pairs: int
    batch_size: int
    protocols: Sequence[str]
    sequence_length: int | None = None
    """Tokens per sequence of a text stage; None: images, at the model's input size."""


def footprint(spec: ModelSpec, dtype: torch.dtype, pairs: Pairs) -> Footprint:
    """The footprint of measuring ``spec`` in ``dtype`` over ``pairs``.

    Raises:
        NotStreamable: for weights that are not a local safetensors checkpoint (random, a
            hub model not fetched, another format): there are no headers to count.
        FileNotFoundError: for local weights that are not there.
    """
    whole = checkpoint_bytes(checkpoint_files(spec), host_dtype(dtype))
    try:
        streamed = open_streamed(spec).to(META, dtype)
    except NotStreamable as why:
        return Footprint(whole, None, None, None, str(why))
    architecture = architecture_for(streamed.model)
    batch = 2 * min(pairs.batch_size, pairs.n_pairs)
    if architecture.inputs == "tokens":
        inputs = torch.empty(batch, pairs.sequence_length or 1, dtype=torch.long, device=META)
    else:
        side = preprocessing(streamed.model, spec).input_size
        inputs = torch.empty(batch, 3, side, side, device=META)
    batches = math.ceil(pairs.n_pairs / pairs.batch_size)
    carried = carried_bytes(streamed, architecture, inputs, batches, pairs.protocols)
    return Footprint(whole, streamed.outside_bytes(), streamed.block_bytes(), carried)
