"""CIFAR-10 and CIFAR-100 from torchvision's python-pickle archives.

The pool is the official 50,000-image train set (re-split into train/val by the run seed);
the test split is the official 10,000-image test set. Images are stored as PNG (lossless),
in the archive's order; ``file`` is ``<batch>/<original file name>``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.archives import ArchiveError, find_member, read_tar_members, tar_names
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


def decode_batch(
    payload: bytes, label_key: bytes, origin: str
) -> tuple[np.ndarray, list[int], list[str]]:
    """One pickled CIFAR batch: (N, 32, 32, 3) uint8 images, labels and file names.

    The archive's md5 was verified before it is unpickled (pickle runs code by design).
    """
    batch = pickle.loads(payload, encoding="bytes")
    try:
        flat = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = [int(v) for v in batch[label_key]]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in batch[b"filenames"]]
    except KeyError as error:
        raise ArchiveError(f"{origin}: CIFAR batch without key {error}") from error
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
    """Prepare CIFAR-10 or CIFAR-100 (``spec['source']``) into ``out_dir``; return split sizes."""
    source = spec["source"]
    layout = _LAYOUT[source]
    paths = resolve_files(name, spec, Path(downloads), files)
    archive = next(iter(paths.values()))
    names = tar_names(archive)
    wanted = {
        part: find_member(names, part, archive)
        for part in [*layout["train"], *layout["test"], layout["meta"]]
    }
    members = read_tar_members(archive, set(wanted.values()))
    meta = pickle.loads(members[wanted[layout["meta"]]], encoding="bytes")
    class_names = [
        n.decode() if isinstance(n, bytes) else str(n) for n in meta[layout["names_key"]]
    ]

    def split_of(batches: list[str]) -> Split:
        images, labels, files_ = [], [], []
        for batch in batches:
            arrays, batch_labels, batch_files = decode_batch(
                members[wanted[batch]], layout["label_key"], f"{archive}:{batch}"
            )
            images.extend(encode_png(image) for image in arrays)
            labels.extend(batch_labels)
            files_.extend(f"{batch}/{f}" for f in batch_files)
        return make_split(images, labels, files_)

    prepared = PreparedSplits(
        splits={"pool": split_of(layout["train"]), "test": split_of(layout["test"])},
        class_names=class_names,
        details={"encoding": "png"},
    )
    return write_prepared(name, spec, out_dir, prepared, paths, expected)
