"""The measurement: the plasticity of every component of every block of a model, per pair,
for one or several protocols in one pass over the images (:data:`PAIR_SCHEMA`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import polars as pl
import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import Architecture, UndefinedStage, architecture_for
from vitplasticity.models.architectures.base import check_fc1_mode
from vitplasticity.models.streamed import StreamedModel
from vitplasticity.plasticity.pairs import ImageQueue, Images, checked_pair_count, image_chunks
from vitplasticity.plasticity.protocols import PROTOCOL_FUNCTIONS, check_protocols

PAIR_SCHEMA: dict[str, pl.DataType] = {
    "protocol": pl.String(),
    "block": pl.Int64(),
    "component": pl.String(),
    "pair": pl.Int64(),
    "ratio": pl.Float64(),
    "numerator": pl.Float64(),
    "denominator": pl.Float64(),
}
"""Columns of :func:`measure`'s result, in order."""


def measure_protocols(
    model: nn.Module | StreamedModel,
    reference: Images,
    downstream: Images,
    *,
    protocols: Sequence[str] = ("embedding",),
    batch_size: int = 64,
    n_pairs: int | None = None,
    progress: Callable[[int], None] | None = None,
    fc1: str = "stage",
) -> pl.DataFrame:
    """Plasticity of every component of every block, per image pair, for several protocols.

    One pass over the images serves every protocol (each image is decoded once). See
    :func:`measure` for the arguments; ``progress`` is called with the number of pairs done
    after each batch. A :class:`~vitplasticity.models.streamed.StreamedModel` is measured
    block by block from its checkpoint (:func:`vitplasticity.plasticity.streamed.
    streamed_pairs`): the same numbers, one block in memory at a time.

    Returns:
        One row per (protocol, block, component, pair), columns :data:`PAIR_SCHEMA`.
    """
    streamed = model if isinstance(model, StreamedModel) else None
    model = model.model if isinstance(model, StreamedModel) else model
    protocols, fc1, architecture, blocks = checked_measurement(
        model, protocols, fc1, reference, batch_size, n_pairs
    )
    if streamed is not None:
        from vitplasticity.plasticity.streamed import streamed_pairs

        measured = {"protocols": protocols, "fc1": fc1, "progress": progress}
        batches = batch_pairs(reference, downstream, architecture, batch_size, n_pairs)
        found = streamed_pairs(streamed, architecture, blocks, batches, n_pairs, **measured)
        return pairs_table(found)
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype

    # Per protocol: a list of per-batch (numerator, denominator) tensors, left on the device
    # until the end so that no batch waits on a host copy.
    found: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {p: [] for p in protocols}
    done = 0
    with torch.inference_mode():
        batches = batch_pairs(reference, downstream, architecture, batch_size, n_pairs)
        for ref_batch, down_batch in batches:
            inputs = architecture.to_device(torch.cat([ref_batch, down_batch]), device, dtype)
            for protocol, batches_found in found.items():
                measured = PROTOCOL_FUNCTIONS[protocol]
                batches_found.append(
                    measured(architecture, model, blocks, inputs, len(ref_batch), fc1)
                )
            done += len(ref_batch)
            if progress is not None:
                progress(done)
    checked_pair_count(done, n_pairs)
    return pairs_table(found)


def checked_measurement(
    model: nn.Module,
    protocols: Sequence[str],
    fc1: str,
    reference: Images,
    batch_size: int,
    n_pairs: int | None,
) -> tuple[tuple[str, ...], str, Architecture, list[nn.Module]]:
    """The checked protocols and fc1 mode, the model's architecture and blocks, once the
    family accepts every protocol and the arguments are valid (:func:`measure`'s Raises)."""
    protocols = check_protocols(protocols)
    fc1 = check_fc1_mode(fc1)
    architecture = architecture_for(model)
    for protocol in protocols:
        refusal = architecture.refusal(f"plasticity {protocol}", model)
        if refusal is not None:
            raise UndefinedStage(f"the {protocol} protocol is not defined: {refusal}")
    blocks = list(architecture.blocks(model))
    _check_arguments(model, (architecture, blocks, fc1), reference, batch_size, n_pairs)
    return protocols, fc1, architecture, blocks


def _check_arguments(
    model: nn.Module,
    parts: tuple[Architecture, Sequence[nn.Module], str],
    reference: Images,
    batch_size: int,
    n_pairs: int | None,
) -> None:
    """Raise for an fc1 mode a block's MLP cannot take (``parts``: the model's architecture,
    blocks and fc1 mode; UnsupportedModel), a model in training mode, a batch size or pair
    count below 1, or a reference tensor with fewer images than ``n_pairs`` (ValueError)."""
    architecture, blocks, fc1 = parts
    for block in blocks:
        architecture.components(block, fc1)  # an fc1 mode the MLP cannot take, named now
    if model.training:
        raise ValueError("model is in training mode (dropout would be random): call model.eval()")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if n_pairs is not None and n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    if isinstance(reference, torch.Tensor) and n_pairs is not None and len(reference) < n_pairs:
        raise ValueError(
            f"reference: {len(reference)} images, fewer than the {n_pairs} pairs asked"
        )


def batch_pairs(
    reference: Images,
    downstream: Images,
    architecture: Architecture,
    batch_size: int,
    n_pairs: int | None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(reference batch, downstream batch) of up to ``batch_size`` pairs each, until
    ``n_pairs`` pairs (None: until the reference images run out; the downstream cycles).

    Raises:
        ValueError: when the two batches' images differ in shape.
    """
    references = ImageQueue(
        image_chunks(reference, "reference", cycle=False, architecture=architecture)
    )
    downstreams = ImageQueue(
        image_chunks(downstream, "downstream", cycle=True, architecture=architecture)
    )
    done = 0
    while n_pairs is None or done < n_pairs:
        wanted = batch_size if n_pairs is None else min(batch_size, n_pairs - done)
        ref_batch = references.take(wanted)
        if ref_batch is None:
            return
        down_batch = downstreams.take(len(ref_batch))
        assert down_batch is not None and len(down_batch) == len(ref_batch)  # cycled
        if ref_batch.shape[1:] != down_batch.shape[1:]:
            raise ValueError(
                f"reference images {tuple(ref_batch.shape[1:])} and downstream images "
                f"{tuple(down_batch.shape[1:])} differ in shape"
            )
        yield ref_batch, down_batch
        done += len(ref_batch)


def pairs_table(found: dict[str, list[tuple[torch.Tensor, torch.Tensor]]]) -> pl.DataFrame:
    """The rows of every protocol (in ``found``'s order) from its per-batch (numerator,
    denominator) tensors, moved to the host once."""
    return pl.concat(
        [
            pairs_frame(
                protocol,
                torch.cat([num for num, _ in batches], dim=-1).cpu().numpy(),
                torch.cat([den for _, den in batches], dim=-1).cpu().numpy(),
            )
            for protocol, batches in found.items()
        ]
    )


def measure(
    model: nn.Module | StreamedModel,
    reference: Images,
    downstream: Images,
    *,
    protocol: str = "embedding",
    batch_size: int = 64,
    n_pairs: int | None = None,
    progress: Callable[[int], None] | None = None,
    fc1: str = "stage",
) -> pl.DataFrame:
    """Plasticity of every component of every block of ``model``, per image pair.

    Args:
        model: a model of a registered architecture (:mod:`vitplasticity.models.architectures`: a
            timm ViT, Eva (EVA-02, DINOv3, rope ViT) or Beit; a transformers GPT2Model fed
            token ids (N, L) as ``reference`` and ``downstream``) in eval mode; it runs on its
            own device and dtype. A streamed model is measured block by block
            (:func:`measure_protocols`).
        reference: preprocessed reference images (N, 3, H, W), or an iterable of batches.
        downstream: preprocessed downstream images, the same way; pair i is reference image
            i with downstream image i, and the downstream set is cycled when shorter (an
            iterable must then be re-iterable, e.g. a list).
        protocol: "embedding" (every block fed the embedding output, the reference code) or
            "in_situ" (each component fed what reaches it in the forward pass).
        batch_size: pairs per forward pass (each pass carries 2 x batch_size images).
        n_pairs: pairs to measure; defaults to every reference image.
        progress: called with the number of pairs done after each batch.
        fc1: what FC1 of a gated MLP is: ``stage`` (gate and up projections together) or
            ``up`` (the up projection alone, the reference code's DINOv3 ablation).

    Returns:
        One row per (block, component, pair): protocol, block (0-based), component, pair,
        ratio = numerator / denominator, numerator = ||f(x) - f(y)||_F and denominator =
        ||x - y||_F of that component's inputs, all float64. Identical inputs give ratio NaN.

    Raises:
        ValueError: for an unknown protocol or fc1 mode (listing the valid ones), fewer
            reference images than ``n_pairs``, or malformed input batches.
        UnsupportedModel: for a model no architecture knows (naming its class and the known
            families), or an fc1 mode its MLP cannot take.
        UndefinedStage: for a protocol the model's family refuses (the embedding protocol of a
            Swin, whose stages differ in width), with the reason.
    """
    counts = {"batch_size": batch_size, "n_pairs": n_pairs}
    return measure_protocols(
        model, reference, downstream, protocols=(protocol,), **counts, progress=progress, fc1=fc1
    )


def pairs_frame(protocol: str, numerator: np.ndarray, denominator: np.ndarray) -> pl.DataFrame:
    """Rows of one protocol from (n_blocks, 5, N) numerators and denominators."""
    n_blocks, n_components, n = numerator.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = numerator / denominator
    return pl.DataFrame(
        {
            "protocol": [protocol] * ratio.size,
            "block": np.repeat(np.arange(n_blocks, dtype=np.int64), n_components * n),
            "component": np.tile(np.repeat(np.array(COMPONENTS), n), n_blocks),
            "pair": np.tile(np.arange(n, dtype=np.int64), n_blocks * n_components),
            "ratio": ratio.ravel(),
            "numerator": numerator.ravel(),
            "denominator": denominator.ravel(),
        },
        schema=PAIR_SCHEMA,
    )
