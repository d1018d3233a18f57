"""Plasticity: the average rate of change ||f(x) - f(y)||_F / ||x - y||_F of every component f
(ln1, mha, ln2, fc1, fc2) of every block of a transformer, over pairs of images or token
sequences (docs/protocol.md). The model's architecture (:mod:`vitplasticity.architectures`)
says what its embedding and its components are; the measurement knows no module names.

Two protocols decide what each component is fed:

- ``embedding`` (the reference code, the default to reproduce): x and y are the embedding
  outputs of the reference and the downstream image; *every* block's components are fed that
  same pair. MHA is ``attn(x)`` without the norm before it or the residual; FC1 is ``fc1(x)``
  without activation; FC2 is ``fc2([x, 0, 0, 0])``, x zero-padded to fc2's input width.
- ``in_situ``: the real forward pass; each component gets what reaches it there, and its
  ratio divides by the difference of its own inputs.

Pair i is reference image i with downstream image i; the downstream set is cycled when it is
shorter. Both images of a pair travel in one forward pass (reference half first), so that
every difference is taken on the device right where the two activations are, and the
per-pair norms are the only thing kept. Computation runs in the model's parameter dtype on
the model's device; norms are reduced in float64 (over tokens; see ``_pair_norms``).

:func:`measure_dataset` is the workflow's ``plasticity`` stage: a model's config entry, a
reference set file and a prepared dataset in, a :class:`Measurement` (per-pair table, summary,
footer metadata) out; :mod:`vitplasticity.text_plasticity` is its counterpart on text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import nn

from vitplasticity import COMPONENTS
from vitplasticity.architectures import (
    Architecture,
    Embedded,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.architectures.base import check_fc1_mode
from vitplasticity.data.reference import read_reference_images
from vitplasticity.data.store import read_split
from vitplasticity.data.transforms import decoded_batches
from vitplasticity.models import ModelSpec, build_model, pick_device, preprocessing
from vitplasticity.progress import ProgressReporter
from vitplasticity.provenance import provenance

log = logging.getLogger(__name__)

PROTOCOLS: tuple[str, ...] = ("embedding", "in_situ")
"""What each component is fed: the embedding output (reference code) or the real forward pass."""

Images = torch.Tensor | Iterable[torch.Tensor]
"""Preprocessed images (N, 3, H, W), or an iterable of such batches (token ids (N, L) for GPT2)."""

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


def check_protocols(protocols: Sequence[str]) -> tuple[str, ...]:
    """Return ``protocols`` as a tuple after checking each is known.

    Raises:
        ValueError: naming the unknown protocol and listing the valid ones.
    """
    if isinstance(protocols, str):
        protocols = (protocols,)
    if not protocols:
        raise ValueError(f"no plasticity protocol given; valid protocols: {', '.join(PROTOCOLS)}")
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown plasticity protocol {protocol!r}; valid protocols: {', '.join(PROTOCOLS)}"
            )
    return tuple(protocols)


def embedding_tokens(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """The embedding output of ``images`` (B, 3, H, W): what the first block receives, (B, n, d).

    For a timm ViT: patch embedding, cls token and position embedding (timm's ``_pos_embed``),
    then ``patch_drop`` and ``norm_pre`` (identities in the paper's models).
    """
    return architecture_for(model).embed(model, images).tokens


def fc1_mode_matters(architecture: Architecture, blocks: Sequence[nn.Module]) -> bool:
    """Whether the fc1 mode changes what FC1 is in any block (a gated MLP)."""
    for block in blocks:
        try:
            if architecture.components(block, "up")["fc1"] != architecture.components(block)["fc1"]:
                return True
        except UnsupportedModel:  # a packed gated MLP: "up" is refused, "stage" is gated
            return True
    return False


def _pair_norms(activations: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """Frobenius norms of (reference half - downstream half), one per pair, in float64: (B,).

    Each token's norm (d terms) is reduced in the compute dtype, the sum over tokens in float64:
    as accurate as a float64 reduction of the whole matrix (~1e-8 relative in float32, where a
    float32 reduction of all n x d terms loses ~1e-6), without a float64 copy of every
    activation, which on a CPU costs as much as the layer that made it.
    """
    difference = activations[:n_pairs] - activations[n_pairs:]  # (B, n, d)
    token_norms = torch.linalg.vector_norm(difference, dim=-1)  # (B, n)
    return token_norms.to(torch.float64).square().sum(dim=-1).sqrt()


def _joint_pair_norms(parts: Sequence[torch.Tensor], n_pairs: int) -> torch.Tensor:
    """Pair norms of the feature-wise concatenation of ``parts`` (a gated MLP's fc1):
    ||[a, b]||_F^2 = ||a||_F^2 + ||b||_F^2, so no concatenated copy is made."""
    if len(parts) == 1:
        return _pair_norms(parts[0], n_pairs)
    return torch.stack([_pair_norms(part, n_pairs) for part in parts]).square().sum(0).sqrt()


def _embedding_protocol(
    architecture: Architecture,
    model: nn.Module,
    blocks: list[nn.Module],
    inputs: torch.Tensor,
    n_pairs: int,
    fc1: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerators and denominators (n_blocks, 5, B) of the embedding protocol."""
    embedded = architecture.embed(model, inputs)  # tokens (2B, n, d)
    denominator = _pair_norms(embedded.tokens, n_pairs)  # (B,): the same pair feeds every component
    numerators = []
    for index, block in enumerate(blocks):
        # FC2 is fc2([x, 0, 0, 0]): x meets fc2's first d input columns only.
        outputs = architecture.embedding_outputs(block, index, embedded, fc1)
        numerators.append(torch.stack([_joint_pair_norms(out, n_pairs) for out in outputs]))
    numerator = torch.stack(numerators)  # (n_blocks, 5, B)
    return numerator, denominator.expand_as(numerator)


class _InSituRecorder:
    """Forward hooks recording, per component, the pair norms of its input and output change.

    Hooks (rather than re-implementing Block.forward) see exactly what the real forward pass
    feeds each module, whatever the block does around it (layer scale, drop path, the MLP's
    activation and optional norm). A component whose input is the previous component's very
    output tensor (attn gets norm1's output, fc1 gets norm2's) reuses that norm.
    """

    def __init__(
        self, architecture: Architecture, blocks: list[nn.Module], n_pairs: int, fc1: str
    ) -> None:
        self.n_pairs = n_pairs
        self._input_of = architecture.hook_input
        self._output_of = architecture.hook_output
        self.numerators: list[list[torch.Tensor | None]] = [[None] * 5 for _ in blocks]
        self.denominators: list[list[torch.Tensor | None]] = [[None] * 5 for _ in blocks]
        # Per (block, component): the pair norms of each of its modules' outputs (a gated fc1
        # has two, concatenated; see _joint_pair_norms).
        self._parts: dict[tuple[int, int], list[torch.Tensor]] = {}
        self._last_output: torch.Tensor | None = None
        self._last_norm: torch.Tensor | None = None
        self._handles = [
            module.register_forward_hook(self._hook(b, c, len(modules)), with_kwargs=True)
            for b, block in enumerate(blocks)
            for c, modules in enumerate(architecture.components(block, fc1).values())
            for module in modules
        ]

    def _hook(self, block: int, component: int, n_parts: int) -> Callable[..., None]:
        def record(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: object
        ) -> None:
            inputs, output = self._input_of(args, kwargs), self._output_of(output)
            if inputs is self._last_output:
                denominator = self._last_norm
            else:
                denominator = _pair_norms(inputs, self.n_pairs)
            numerator = _pair_norms(output, self.n_pairs)
            self._last_output, self._last_norm = output, numerator
            if n_parts > 1:
                parts = self._parts.setdefault((block, component), [])
                parts.append(numerator)
                if len(parts) < n_parts:
                    self.denominators[block][component] = denominator  # the parts share it
                    return
                numerator = torch.stack(parts).square().sum(0).sqrt()
                del self._parts[(block, component)]
                denominator = self.denominators[block][component]
            self.numerators[block][component] = numerator
            self.denominators[block][component] = denominator

        return record

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._last_output = self._last_norm = None

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Numerators and denominators (n_blocks, 5, B) of the pass just run."""
        return (
            torch.stack([torch.stack(row) for row in self.numerators]),  # type: ignore[arg-type]
            torch.stack([torch.stack(row) for row in self.denominators]),  # type: ignore[arg-type]
        )


def _in_situ_protocol(
    architecture: Architecture,
    model: nn.Module,
    blocks: list[nn.Module],
    inputs: torch.Tensor,
    n_pairs: int,
    fc1: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerators and denominators (n_blocks, 5, B) of the in-situ protocol."""
    recorder = _InSituRecorder(architecture, blocks, n_pairs, fc1)
    try:
        embedded: Embedded = architecture.embed(model, inputs)
        tokens = embedded.tokens
        for index, block in enumerate(blocks):
            tokens = architecture.run_block(block, index, tokens, embedded)
    finally:
        recorder.remove()
    return recorder.result()


_PROTOCOL_FUNCTIONS = {"embedding": _embedding_protocol, "in_situ": _in_situ_protocol}


def _image_chunks(
    source: Images, name: str, *, cycle: bool, architecture: Architecture
) -> Iterator[torch.Tensor]:
    """The non-empty batches of ``source``, started over at its end when ``cycle``.

    Raises:
        ValueError: when ``source`` holds no image, a batch is not what ``architecture`` takes
            ((N, 3, H, W) images, (N, L) token ids), or a one-shot iterator would have to be
            cycled.
    """
    batches: Iterable[torch.Tensor] = (source,) if isinstance(source, torch.Tensor) else source
    one_shot = iter(batches) is batches
    while True:
        seen = 0
        for chunk in batches:
            architecture.check_batch(chunk, name)
            if len(chunk):
                seen += len(chunk)
                yield chunk
        if not cycle:
            return
        if seen == 0:
            raise ValueError(f"{name}: no images")
        if one_shot:
            raise ValueError(
                f"{name} is a one-shot iterator shorter than the pairs asked for: pass a tensor "
                "or a re-iterable (e.g. a list) of batches so that it can be cycled"
            )


class _ImageQueue:
    """Hands out images of a chunk stream in batches of any size, in order.

    Slices of one large tensor stay views: nothing is copied unless a batch spans chunks.
    """

    def __init__(self, chunks: Iterator[torch.Tensor]) -> None:
        self._chunks = chunks
        self._pending: list[torch.Tensor] = []
        self._held = 0

    def take(self, count: int) -> torch.Tensor | None:
        """The next ``count`` images (fewer at the end of the stream; None when it is empty)."""
        while self._held < count:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._pending.append(chunk)
            self._held += len(chunk)
        if not self._held:
            return None
        merged = self._pending[0] if len(self._pending) == 1 else torch.cat(self._pending)
        rest = merged[count:]
        self._pending, self._held = ([rest], len(rest)) if len(rest) else ([], 0)
        return merged[:count]


def measure_protocols(
    model: nn.Module,
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
    after each batch.

    Returns:
        One row per (protocol, block, component, pair), columns :data:`PAIR_SCHEMA`.
    """
    protocols = check_protocols(protocols)
    fc1 = check_fc1_mode(fc1)
    architecture = architecture_for(model)
    blocks = architecture.blocks(model)
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
    parameter = next(model.parameters())
    device, dtype = parameter.device, parameter.dtype

    references = _ImageQueue(
        _image_chunks(reference, "reference", cycle=False, architecture=architecture)
    )
    downstreams = _ImageQueue(
        _image_chunks(downstream, "downstream", cycle=True, architecture=architecture)
    )
    # Per protocol: a list of per-batch (numerator, denominator) tensors, left on the device
    # until the end so that no batch waits on a host copy.
    found: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {p: [] for p in protocols}
    done = 0
    with torch.inference_mode():
        while n_pairs is None or done < n_pairs:
            wanted = batch_size if n_pairs is None else min(batch_size, n_pairs - done)
            ref_batch = references.take(wanted)
            if ref_batch is None:
                break
            down_batch = downstreams.take(len(ref_batch))
            assert down_batch is not None and len(down_batch) == len(ref_batch)  # cycled
            if ref_batch.shape[1:] != down_batch.shape[1:]:
                raise ValueError(
                    f"reference images {tuple(ref_batch.shape[1:])} and downstream images "
                    f"{tuple(down_batch.shape[1:])} differ in shape"
                )
            inputs = architecture.to_device(torch.cat([ref_batch, down_batch]), device, dtype)
            for protocol in protocols:
                found[protocol].append(
                    _PROTOCOL_FUNCTIONS[protocol](
                        architecture, model, blocks, inputs, len(ref_batch), fc1
                    )
                )
            done += len(ref_batch)
            if progress is not None:
                progress(done)
    if done == 0:
        raise ValueError("reference: no images")
    if n_pairs is not None and done < n_pairs:
        raise ValueError(f"reference: {done} images, fewer than the {n_pairs} pairs asked for")
    return pl.concat(
        [
            _pairs_frame(
                protocol,
                torch.cat([num for num, _ in found[protocol]], dim=-1).cpu().numpy(),
                torch.cat([den for _, den in found[protocol]], dim=-1).cpu().numpy(),
            )
            for protocol in protocols
        ]
    )


def measure(
    model: nn.Module,
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
        model: a model of a registered architecture (:mod:`vitplasticity.architectures`: a
            timm ViT, Eva (EVA-02, DINOv3, rope ViT) or Beit; a transformers GPT2Model fed
            token ids (N, L) as ``reference`` and ``downstream``) in eval mode; it runs on its
            own device and dtype.
        reference: preprocessed reference images (N, 3, H, W), or an iterable of batches.
        downstream: preprocessed downstream images, the same way; pair i is reference image
            i with downstream image i, and the downstream set is cycled when shorter (an
            iterable must then be re-iterable, e.g. a list).
        protocol: "embedding" (every block fed the embedding output, the reference code) or
            "in_situ" (each component fed what reaches it in the forward pass).
        batch_size: pairs per forward pass (each pass carries 2 x batch_size images).
        n_pairs: pairs to measure; defaults to every reference image.
        progress: called with the number of pairs done after each batch.
        fc1: what FC1 of a gated MLP is (:data:`vitplasticity.architectures.FC1_MODES`):
            ``stage`` (gate and up projections together, the default) or ``up`` (the up
            projection alone, the reference code's DINOv3 ablation). A plain MLP has one fc1.

    Returns:
        One row per (block, component, pair): protocol, block (0-based), component, pair,
        ratio = numerator / denominator, numerator = ||f(x) - f(y)||_F and denominator =
        ||x - y||_F of that component's inputs, all float64. Identical inputs give ratio NaN.

    Raises:
        ValueError: for an unknown protocol or fc1 mode (listing the valid ones), fewer
            reference images than ``n_pairs``, or malformed input batches.
        UnsupportedModel: for a model no architecture knows (naming its class and the known
            families), or an fc1 mode its MLP cannot take.
    """
    return measure_protocols(
        model,
        reference,
        downstream,
        protocols=(protocol,),
        batch_size=batch_size,
        n_pairs=n_pairs,
        progress=progress,
        fc1=fc1,
    )


def _pairs_frame(protocol: str, numerator: np.ndarray, denominator: np.ndarray) -> pl.DataFrame:
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


def summarize(pairs: pl.DataFrame) -> pl.DataFrame:
    """Mean plasticity per (protocol, block, component) with its spread.

    Columns: protocol, block, component, relative_depth = (block + 1) / depth (depth: the
    number of blocks in ``pairs``), n_pairs, mean, std (ddof=1), ci95 = 1.96 std / sqrt(n)
    (the paper's 95% interval). Rows sorted by protocol, block and component in forward order.

    Raises:
        ValueError: when a column of :data:`PAIR_SCHEMA` is missing, naming it.
    """
    missing = [name for name in ("protocol", "block", "component", "ratio") if name not in pairs]
    if missing:
        raise ValueError(f"pairs frame lacks columns {missing}")
    depth = pairs.group_by("protocol").agg((pl.col("block").max() + 1).alias("depth"))
    order = pl.DataFrame({"component": list(COMPONENTS), "_order": range(len(COMPONENTS))})
    return (
        pairs.group_by("protocol", "block", "component")
        .agg(
            pl.len().cast(pl.Int64).alias("n_pairs"),
            pl.col("ratio").mean().alias("mean"),
            pl.col("ratio").std(ddof=1).alias("std"),
        )
        .join(depth, on="protocol")
        .join(order, on="component", how="left")
        .with_columns(
            ((pl.col("block") + 1) / pl.col("depth")).alias("relative_depth"),
            (1.96 * pl.col("std") / pl.col("n_pairs").sqrt()).alias("ci95"),
        )
        .sort("protocol", "block", "_order")
        .select(
            "protocol",
            "block",
            "component",
            "relative_depth",
            "n_pairs",
            "mean",
            "std",
            "ci95",
        )
    )


# --- the stage: one (model, downstream dataset) from files ---------------------------------


@dataclass(frozen=True)
class Measurement:
    """A stage's result, ready to write: the per-pair rows, their per-(protocol, block,
    component) summary, and the footer metadata both files carry (provenance, model,
    dataset, demo flag)."""

    pairs: pl.DataFrame
    summary: pl.DataFrame
    metadata: dict[str, Any]


def measurement(
    pairs: pl.DataFrame,
    *,
    model: str,
    dataset: str,
    settings: dict[str, Any],
    device: torch.device,
    demo: bool,
) -> Measurement:
    """``pairs`` with its summary (labelled with ``model`` and ``dataset``) and its metadata."""
    metadata = {
        "provenance": provenance(settings, device),
        "model": model,
        "dataset": dataset,
        "demo": bool(demo),
    }
    summary = summarize(pairs).select(
        pl.lit(model).alias("model"), pl.lit(dataset).alias("dataset"), pl.all()
    )
    return Measurement(pairs, summary, metadata)


def measure_dataset(
    model_name: str,
    model_spec: dict[str, Any],
    reference: str | Path,
    dataset_dir: str | Path,
    *,
    split: str = "test",
    protocols: Sequence[str] = ("embedding",),
    n_pairs: int,
    batch_size: int = 64,
    device: str = "auto",
    dtype: str = "float32",
    fc1: str = "stage",
    demo: bool = False,
) -> Measurement:
    """The plasticity of model ``model_name`` (its config entry ``model_spec``) between a
    reference set file and a prepared downstream dataset: the ``plasticity`` stage.

    Pair i is reference image i with downstream image i mod the split's size; images are
    decoded a batch ahead by a few threads.

    Raises:
        ValueError: for a bad argument (naming its CLI flag), a reference set with fewer
            than ``n_pairs`` images or an empty split, before the model is built.
        FileNotFoundError: for a missing reference set or dataset.
    """
    # Every input is checked before the model is built or an image decoded.
    protocols = check_protocols(protocols)
    fc1 = check_fc1_mode(fc1)
    if n_pairs < 1:
        raise ValueError(f"--n-pairs must be >= 1, got {n_pairs}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    spec = ModelSpec.from_config(model_spec)
    images = read_reference_images(reference)
    if len(images) < n_pairs:
        raise ValueError(
            f"{reference}: {len(images)} reference images, fewer than --n-pairs {n_pairs}"
        )
    downstream = read_split(dataset_dir, split)
    if len(downstream) == 0:
        raise ValueError(f"{dataset_dir}: split {split!r} holds no images")
    target = pick_device(device)
    dataset = Path(dataset_dir).name

    model = build_model(spec, num_classes=0).eval()
    architecture = architecture_for(model)
    gated = fc1_mode_matters(architecture, architecture.blocks(model))  # refusals named here
    model = model.to(device=target, dtype=getattr(torch, dtype))
    pre = preprocessing(model, spec)
    # Pair i: reference i with downstream i mod len(downstream), cycled here by reference so
    # that every image is decoded only when its batch comes up.
    cycled = [downstream.images[i % len(downstream)] for i in range(n_pairs)]
    log.info(
        "%s on %s (%s, %d images, cycled to %d): protocols %s, %s on %s",
        model_name,
        dataset,
        split,
        len(downstream),
        n_pairs,
        ", ".join(protocols),
        dtype,
        target,
    )
    with ProgressReporter(n_pairs, f"plasticity {model_name}/{dataset}") as progress:
        pairs = measure_protocols(
            model,
            decoded_batches(images[:n_pairs], pre, batch_size),
            decoded_batches(cycled, pre, batch_size),
            protocols=protocols,
            batch_size=batch_size,
            n_pairs=n_pairs,
            progress=progress,
            fc1=fc1,
        )
    settings: dict[str, Any] = {
        "model_spec": model_spec,
        "reference": str(reference),
        "dataset_dir": str(dataset_dir),
        "split": split,
        "protocols": list(protocols),
        "n_pairs": n_pairs,
        "batch_size": batch_size,
        "device": device,
        "dtype": dtype,
        "preprocessing": asdict(pre),
    }
    if gated:  # what FC1 measured; a plain MLP has one fc1 whatever the mode
        settings["fc1"] = fc1
    return measurement(
        pairs, model=model_name, dataset=dataset, settings=settings, device=target, demo=demo
    )
