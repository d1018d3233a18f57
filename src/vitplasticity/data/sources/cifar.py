"""CIFAR-10 and CIFAR-100 from torchvision's python-pickle archives.

The pool is the official 50,000-image train set (re-split into train/val by the run seed);
the test split is the official 10,000-image test set. Images are stored as PNG (lossless),
in the archive's order; ``file`` is ``<batch>/<original file name>``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.archives import FormatError, InputFile, read_tar_suffixes
from vitplasticity.data.sources.common import (
    PreparedSplits,
    make_split,
    resolve_files,
    write_prepared,
)
from vitplasticity.data.store import Split, encode_png

# The archive layout per source: folder, train batches, test batches, meta file, label keys.
_LAYOUT: dict[str, dict[str, Any]] = {
    "cifar10": {
        "train": [f"data_batch_{k}" for k in range(1, 6)],
        "test": ["test_batch"],
        "meta": "batches.meta",
        "label_key": b"labels",
        "names_key": b"label_names",
    },
    "cifar100": {
        "train": ["train"],
        "test": ["test"],
        "meta": "meta",
        "label_key": b"fine_labels",
        "names_key": b"fine_label_names",
    },
}


def unpickle(payload: bytes) -> Any:
    """A pickled object of a CIFAR archive (byte-string keys, as the archives were written).

    The archive's checksum was verified before it is unpickled (pickle runs code by design).

    Raises:
        FormatError: the bytes are not a pickle (the unpickler raises a dozen different
            types on foreign or truncated bytes; one type for ``InputFile.reading``).
    """
    try:
        return pickle.loads(payload, encoding="bytes")
    except Exception as error:  # the unpickler has no one error type for bad bytes
        raise FormatError(f"{type(error).__name__}: {error}") from error


def decode_batch(payload: bytes, label_key: bytes) -> tuple[np.ndarray, list[int], list[str]]:
    """One pickled CIFAR batch: (N, 32, 32, 3) uint8 images, labels and file names.

    Raises:
        FormatError: not a pickle, or a batch without the expected keys or sizes.
    """
    batch = unpickle(payload)
    if not isinstance(batch, dict):
        raise FormatError(f"a pickled {type(batch).__name__}, not a dict")
    missing = [key for key in (b"data", label_key, b"filenames") if key not in batch]
    if missing:
        raise FormatError(f"no key {missing} (has {list(batch)[:5]})")
    flat = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = [int(v) for v in batch[label_key]]
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in batch[b"filenames"]]
    if flat.size != len(labels) * 3 * 32 * 32 or len(names) != len(labels):
        raise FormatError(
            f"{flat.size} pixel values, {len(labels)} labels and {len(names)} file names"
        )
    images = flat.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)  # (N, H, W, C)
    return images, labels, names


def prepare(
    name: str,
    spec: dict[str, Any],
    out_dir: Path,
    downloads: Path,
    *,
    files: dict | None = None,
    expected: dict[str, int] | None = None,
) -> dict[str, int]:
    """Prepare CIFAR-10 or CIFAR-100 (``spec['source']``) into ``out_dir``; return split sizes.

    Raises:
        DamagedFileError: the archive (or one of its members) cannot be parsed, naming the
            file, the member and the remedy.
    """
    layout = _LAYOUT[spec["source"]]
    paths = resolve_files(name, spec, Path(downloads), files)
    archive = next(iter(paths.values()))
    with archive.reading("CIFAR python archive (tar.gz)"):
        parts = [*layout["train"], *layout["test"], layout["meta"]]
        wanted, members = read_tar_suffixes(archive.path, {part: part for part in parts})
    with archive.reading("CIFAR meta pickle", wanted[layout["meta"]]):
        meta = unpickle(members[wanted[layout["meta"]]])
        if not isinstance(meta, dict) or layout["names_key"] not in meta:
            raise FormatError(f"no key {layout['names_key']!r}")
        class_names = [
            n.decode() if isinstance(n, bytes) else str(n) for n in meta[layout["names_key"]]
        ]
    batches = _BatchReader(archive, wanted, members, layout["label_key"])
    prepared = PreparedSplits(
        splits={"pool": batches.split(layout["train"]), "test": batches.split(layout["test"])},
        class_names=class_names,
        details={"encoding": "png"},
    )
    return write_prepared(name, spec, out_dir, prepared, paths, expected)


@dataclass
class _BatchReader:
    """The batch pickles read out of one CIFAR archive, decoded into splits."""

    archive: InputFile
    wanted: dict[str, str]  # batch name -> its member name
    members: dict[str, bytes]
    label_key: bytes

    def split(self, batches: list[str]) -> Split:
        """One split of ``batches``, in order; ``file`` is ``<batch>/<original file name>``."""
        images, labels, files = [], [], []
        for batch in batches:
            member = self.wanted[batch]
            with self.archive.reading("CIFAR batch pickle", member):
                arrays, batch_labels, batch_files = decode_batch(
                    self.members[member], self.label_key
                )
            images.extend(encode_png(image) for image in arrays)
            labels.extend(batch_labels)
            files.extend(f"{batch}/{f}" for f in batch_files)
        return make_split(images, labels, files)
