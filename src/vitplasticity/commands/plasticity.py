"""``plasticity``: measure every component's plasticity for one (model, downstream dataset)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplasticity.commands import json_argument

if TYPE_CHECKING:
    import polars as pl
    import torch

    from vitplasticity.models import Preprocessing

log = logging.getLogger(__name__)

DTYPES: tuple[str, ...] = ("float32", "float64")
# Decoding threads: torchvision's decode and resize release the GIL, so a few threads keep
# the device fed while the main thread launches the forward passes.
_DECODE_THREADS = 4


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plasticity`` subcommand."""
    parser = subparsers.add_parser(
        "plasticity",
        help="plasticity of every component of every block, per image pair",
        description="Pair reference image i with downstream image i (the downstream split "
        "cycled when shorter) and measure ||f(x)-f(y)|| / ||x-y|| for ln1, mha, ln2, fc1 and "
        "fc2 of every block. Writes the per-pair table and its per-(block, component) summary.",
    )
    parser.add_argument("--model", required=True, help="model name (config key)")
    parser.add_argument(
        "--model-spec", required=True, type=json_argument, help="its config entry, as JSON"
    )
    parser.add_argument("--reference", required=True, help="reference set Parquet file")
    parser.add_argument("--dataset-dir", required=True, help="prepared downstream dataset folder")
    parser.add_argument("--split", default="test", help="downstream split (default: test)")
    parser.add_argument(
        "--protocols",
        nargs="+",
        default=["embedding"],
        metavar="P",
        help="embedding (the reference code) and/or in_situ",
    )
    parser.add_argument("--n-pairs", type=int, default=12800, help="image pairs (paper: 12,800)")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="pairs per forward pass (2x images)"
    )
    parser.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda")
    parser.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="compute dtype (norms are float64)"
    )
    parser.add_argument("--demo", action="store_true", help="label the outputs as a demo")
    parser.add_argument("--out", required=True, help="per-pair Parquet file")
    parser.add_argument("--summary", required=True, help="per-(block, component) Parquet file")
    parser.set_defaults(handler=run_plasticity)


def read_reference_images(path: str | Path) -> list[bytes]:
    """The encoded images of a reference set (prepared-split columns image, label, file).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: when it has no ``image`` column.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reference set not found: {path}")
    if "image" not in pq.read_schema(path).names:
        raise ValueError(f"{path}: not a reference set (no 'image' column)")
    return pq.read_table(path, columns=["image"]).column("image").to_pylist()


def decoded_batches(
    images: Sequence[bytes], pre: Preprocessing, batch_size: int, threads: int = _DECODE_THREADS
) -> Iterator[torch.Tensor]:
    """Preprocessed batches of ``images`` in order, decoded ahead by a few threads.

    At most ``threads + 1`` batches are decoded and waiting at any time, so memory stays
    bounded however many images there are.
    """
    from vitplasticity.data.transforms import eval_batches

    def decode(start: int) -> torch.Tensor:
        chunk = images[start : start + batch_size]
        return next(eval_batches(chunk, pre, len(chunk)))

    starts = iter(range(0, len(images), batch_size))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        # range first: zip stops on it without drawing (and losing) one more start.
        pending: list[Future[torch.Tensor]] = [
            pool.submit(decode, start) for _, start in zip(range(threads + 1), starts, strict=False)
        ]
        while pending:
            batch = pending.pop(0).result()
            start = next(starts, None)
            if start is not None:
                pending.append(pool.submit(decode, start))
            yield batch


class ProgressReporter:
    """Progress of a long loop: a tqdm bar on a terminal, else a log line every ~10%."""

    def __init__(self, total: int, description: str) -> None:
        self.total, self.description = total, description
        self._next_log = 0.1
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=description, unit="pair")

    def __call__(self, done: int) -> None:
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            return
        if done >= self._next_log * self.total or done == self.total:
            log.info(
                "%s: %d/%d (%.0f%%)", self.description, done, self.total, 100 * done / self.total
            )
            while self._next_log * self.total <= done:
                self._next_log += 0.1

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run_plasticity(args: argparse.Namespace) -> int:
    import torch

    from vitplasticity.data.store import read_split
    from vitplasticity.models import ModelSpec, build_model, pick_device, preprocessing
    from vitplasticity.plasticity import check_protocols, measure_protocols

    # Every input is checked before the model is built or an image decoded.
    protocols = check_protocols(args.protocols)
    if args.n_pairs < 1:
        raise ValueError(f"--n-pairs must be >= 1, got {args.n_pairs}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    spec = ModelSpec.from_config(args.model_spec)
    reference = read_reference_images(args.reference)
    if len(reference) < args.n_pairs:
        raise ValueError(
            f"{args.reference}: {len(reference)} reference images, fewer than --n-pairs "
            f"{args.n_pairs}"
        )
    downstream = read_split(args.dataset_dir, args.split)
    if len(downstream) == 0:
        raise ValueError(f"{args.dataset_dir}: split {args.split!r} holds no images")
    device = pick_device(args.device)
    dataset = Path(args.dataset_dir).name

    model = build_model(spec, num_classes=0).eval()
    model = model.to(device=device, dtype=getattr(torch, args.dtype))
    pre = preprocessing(model, spec)
    n = args.n_pairs
    # Pair i: reference i with downstream i mod len(downstream), cycled here by reference so
    # that every image is decoded only when its batch comes up.
    cycled = [downstream.images[i % len(downstream)] for i in range(n)]
    log.info(
        "%s on %s (%s, %d images, cycled to %d): protocols %s, %s on %s",
        args.model,
        dataset,
        args.split,
        len(downstream),
        n,
        ", ".join(protocols),
        args.dtype,
        device,
    )
    progress = ProgressReporter(n, f"plasticity {args.model}/{dataset}")
    try:
        pairs = measure_protocols(
            model,
            decoded_batches(reference[:n], pre, args.batch_size),
            decoded_batches(cycled, pre, args.batch_size),
            protocols=protocols,
            batch_size=args.batch_size,
            n_pairs=n,
            progress=progress,
        )
    finally:
        progress.close()

    settings: dict[str, Any] = {
        "model_spec": args.model_spec,
        "reference": str(args.reference),
        "dataset_dir": str(args.dataset_dir),
        "split": args.split,
        "protocols": list(protocols),
        "n_pairs": n,
        "batch_size": args.batch_size,
        "device": args.device,
        "dtype": args.dtype,
        "preprocessing": asdict(pre),
    }
    write_outputs(args, pairs, dataset=dataset, settings=settings, device=device)
    return 0


def write_outputs(
    args: argparse.Namespace,
    pairs: pl.DataFrame,
    *,
    dataset: str,
    settings: dict[str, Any],
    device: Any,
) -> None:
    """Write the per-pair table (--out) and its summary (--summary), both carrying the
    provenance, model, dataset and demo flag in their Parquet metadata."""
    import polars as pl

    from vitplasticity.io import write_parquet
    from vitplasticity.plasticity import summarize
    from vitplasticity.provenance import provenance

    metadata = {
        "provenance": provenance(settings, device),
        "model": args.model,
        "dataset": dataset,
        "demo": bool(args.demo),
    }
    summary = summarize(pairs).select(
        pl.lit(args.model).alias("model"), pl.lit(dataset).alias("dataset"), pl.all()
    )
    write_parquet(args.out, pairs, metadata)
    write_parquet(args.summary, summary, metadata)
    log.info("wrote %s (%d rows) and %s", args.out, pairs.height, args.summary)
