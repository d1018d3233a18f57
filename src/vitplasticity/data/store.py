"""The prepared store: one on-disk format for every dataset.

A prepared dataset is a directory ``resources/datasets/<name>/`` holding, per split, a
Parquet file ``<split>.parquet`` with columns ``image`` (encoded PNG/JPEG bytes), ``label``
(int32) and ``file`` (where the image came from), and ``meta.json`` (class names, split
sizes, source, provenance). Splits: ``pool`` (split into train/val by the run seed),
``test``, and, for datasets with an official validation set (flowers102), ``val``; then
``pool`` is the official train split and is not re-split.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vitplasticity.utils.io import naming_write_errors, read_json, read_parquet_table, unreadable

log = logging.getLogger(__name__)

SPLITS: tuple[str, ...] = ("pool", "val", "test")
_ROW_GROUP = 1024
_SCHEMA = pa.schema([("image", pa.binary()), ("label", pa.int32()), ("file", pa.string())])


@dataclass(frozen=True)
class Split:
    """One split in memory: encoded images, integer labels, and their origin."""

    images: list[bytes]
    labels: np.ndarray
    files: list[str]

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, indices: Sequence[int] | np.ndarray) -> Split:
        """The rows at ``indices``, in that order."""
        idx = np.asarray(indices, dtype=np.int64)
        return Split([self.images[i] for i in idx], self.labels[idx], [self.files[i] for i in idx])


def encode_png(array: np.ndarray) -> bytes:
    """Encode an (H, W, 3) uint8 array as PNG bytes (lossless)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def write_split(
    path: str | os.PathLike[str],
    images: Iterable[bytes],
    labels: Iterable[int],
    files: Iterable[str],
) -> int:
    """Write one split's Parquet file; return its row count."""
    images, labels, files = list(images), list(labels), list(files)
    if not len(images) == len(labels) == len(files):
        raise ValueError(
            f"{path}: {len(images)} images, {len(labels)} labels and {len(files)} file names"
        )
    table = pa.table(
        {
            "image": pa.array(images, pa.binary()),
            "label": pa.array(labels, pa.int32()),
            "file": pa.array(files, pa.string()),
        },
        schema=_SCHEMA,
    )
    pq.write_table(table, path, row_group_size=_ROW_GROUP)
    return len(images)


def store_remedy(dataset_dir: str | os.PathLike[str]) -> str:
    """What to do about a damaged file of a prepared dataset: prepare it again."""
    return f"delete the folder {dataset_dir} and rerun: the workflow prepares it again"


def read_split(dataset_dir: str | os.PathLike[str], split: str) -> Split:
    """Read one split of a prepared dataset.

    Raises:
        FileNotFoundError: naming the missing file and the splits that do exist.
        UnreadableFileError: when the file is damaged, naming it and the remedy.
    """
    path = Path(dataset_dir) / f"{split}.parquet"
    if not path.is_file():
        present = sorted(p.stem for p in Path(dataset_dir).glob("*.parquet"))
        raise FileNotFoundError(f"{path}: no split {split!r} (present: {present or 'none'})")
    table = read_parquet_table(path, ["image", "label", "file"], store_remedy(dataset_dir))
    return Split(
        images=table.column("image").to_pylist(),
        labels=table.column("label").to_numpy().astype(np.int64),
        files=table.column("file").to_pylist(),
    )


def read_meta(dataset_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``meta.json`` of a prepared dataset.

    Raises:
        FileNotFoundError: when the folder holds no meta.json.
        UnreadableFileError: when it is not JSON, or its ``num_classes`` is not a positive
            integer or disagrees with its ``class_names`` (every source writes both).
    """
    path = Path(dataset_dir) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a prepared dataset (no meta.json)")
    remedy = store_remedy(dataset_dir)
    meta = read_json(path, remedy)
    if not isinstance(meta, dict):
        raise unreadable(path, f"expected a JSON object, found {type(meta).__name__}", remedy)
    num_classes, names = meta.get("num_classes"), meta.get("class_names")
    if type(num_classes) is not int or num_classes < 1:
        raise unreadable(path, f"num_classes {num_classes!r} is not a positive integer", remedy)
    if names is not None and (not isinstance(names, list) or len(names) != num_classes):
        found = f"{len(names)} class_names" if isinstance(names, list) else "class_names not a list"
        raise unreadable(path, f"num_classes {num_classes} but {found}", remedy)
    return meta


def check_labels(
    dataset_dir: str | os.PathLike[str], num_classes: int, splits: dict[str, Split]
) -> None:
    """Check that every label of ``splits`` is a class of the head (0 .. num_classes - 1).

    The head has ``num_classes`` outputs, one per entry of meta.json's ``class_names``. A
    class without an image in any split is allowed (a small subset of a dataset need not hold
    every class; the sources write their official class list) and logged as a warning.

    Raises:
        UnreadableFileError: naming meta.json and the split whose labels fall outside.
    """
    meta = Path(dataset_dir) / "meta.json"
    seen: set[int] = set()
    for split, data in splits.items():
        if not len(data):
            continue
        low, high = int(data.labels.min()), int(data.labels.max())
        if low < 0 or high >= num_classes:
            raise unreadable(
                meta,
                f"num_classes {num_classes}, but {split}.parquet has labels from {low} to "
                f"{high} (a label must lie in 0..{num_classes - 1})",
                store_remedy(dataset_dir),
            )
        seen.update(np.unique(data.labels).tolist())
    absent = sorted(set(range(num_classes)) - seen)
    if absent:
        log.warning(
            "%s: %d of %d classes have no image in any split (e.g. %s); their head outputs "
            "are trained only as negatives",
            dataset_dir,
            len(absent),
            num_classes,
            absent[:5],
        )


def has_fixed_val(dataset_dir: str | os.PathLike[str]) -> bool:
    """Whether the dataset ships its own validation split (then the pool is not re-split)."""
    return (Path(dataset_dir) / "val.parquet").is_file()


def split_pool(n: int, seed: int, val_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Split ``n`` pool rows into (train, val) indices, seeded by the run seed.

    The first ``round(n * (1 - val_fraction))`` indices of a seeded permutation are train.
    Both index arrays come back sorted so that file order is kept within each part.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    n_train = round(n * (1.0 - val_fraction))
    return np.sort(order[:n_train]), np.sort(order[n_train:])


def fixed_split(
    n: int, seed: int = 42, test_fraction: float = 0.2
) -> tuple[np.ndarray, np.ndarray]:
    """The fixed (pool, test) split of datasets without an official test set.

    The reference code's: legacy ``np.random.seed(42)`` then ``permutation(n)``; the first
    ``int(0.8 n)`` indices are the pool. Both come back sorted (file order).
    """
    order = np.random.RandomState(seed).permutation(n)
    n_pool = int((1.0 - test_fraction) * n)
    return np.sort(order[:n_pool]), np.sort(order[n_pool:])


class PreparedDatasetWriter:
    """Write a prepared dataset into a temporary directory, then move it into place.

    Use as a context manager; on an exception nothing appears at ``out_dir``::

        with PreparedDatasetWriter(out_dir) as writer:
            writer.add_split("pool", images, labels, files)
            writer.finish(meta)
    """

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.out_dir = Path(out_dir)
        self.counts: dict[str, int] = {}
        self._tmp: Path | None = None

    def __enter__(self) -> PreparedDatasetWriter:
        self.out_dir.parent.mkdir(parents=True, exist_ok=True)
        # SIGTERM held while the folder is made and named: the SystemExit a SIGTERM handler
        # raises (commands.data) between mkdtemp and ``return`` would skip __exit__ and leave
        # the folder behind. Delivered on unblocking, inside the try that removes it.
        held = {signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            self._tmp = Path(
                tempfile.mkdtemp(prefix=f".{self.out_dir.name}.", dir=self.out_dir.parent)
            )
        finally:
            try:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
            except BaseException:
                if self._tmp is not None:
                    shutil.rmtree(self._tmp, ignore_errors=True)
                raise
        return self

    def add_split(
        self, split: str, images: Iterable[bytes], labels: Iterable[int], files: Iterable[str]
    ) -> None:
        """Write one split."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; known: {SPLITS}")
        assert self._tmp is not None, "use PreparedDatasetWriter as a context manager"
        name = f"{split}.parquet"
        with naming_write_errors(self.out_dir / name, self._tmp / name):
            self.counts[split] = write_split(self._tmp / name, images, labels, files)

    def finish(self, meta: dict[str, Any]) -> None:
        """Write meta.json (with the split sizes) and move the directory into place."""
        assert self._tmp is not None, "use PreparedDatasetWriter as a context manager"
        for required in ("pool", "test"):
            if required not in self.counts:
                raise ValueError(f"{self.out_dir.name}: split {required!r} was not written")
        payload = {**meta, "splits": dict(self.counts)}
        with naming_write_errors(self.out_dir / "meta.json", self._tmp / "meta.json"):
            text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
            (self._tmp / "meta.json").write_text(text)
        if self.out_dir.exists():
            shutil.rmtree(self.out_dir)
        os.replace(self._tmp, self.out_dir)
        self._tmp = None

    def __exit__(self, *exc: object) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
