"""CIFAR-10-C (Hendrycks & Dietterich) from the Zenodo ``CIFAR-10-C.tar``.

``<corruption>.npy`` holds (50000, 32, 32, 3) uint8 images: five severities of the CIFAR-10
test set, severity s in rows ``(s-1)*10000 : s*10000``; ``labels.npy`` the labels. One
severity (the paper: 5) is split 80/20 into pool/test by the reference code's fixed seed-42
permutation; the pool is re-split into train/val by the run seed.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.archives import FormatError, InputFile, read_tar_suffixes
from vitplasticity.data.sources.common import (
    PreparedSplits,
    make_split,
    paper_fixed_split,
    resolve_files,
    write_prepared,
)
from vitplasticity.data.sources.registry import CIFAR10C_CORRUPTIONS
from vitplasticity.data.store import encode_png

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
SEVERITIES = 5
NPY_MAGIC = b"\x93NUMPY"  # the first bytes of every .npy file


def severity_rows(n_rows: int, severity: int) -> slice:
    """The rows of one severity in a corruption array of ``n_rows`` (five equal blocks)."""
    per = n_rows // SEVERITIES
    return slice((severity - 1) * per, severity * per)


def prepare(
    name: str,
    spec: dict[str, Any],
    out_dir: Path,
    downloads: Path,
    *,
    files: dict | None = None,
    expected: dict[str, int] | None = None,
) -> dict[str, int]:
    """Prepare one corruption at one severity into ``out_dir``; return split sizes.

    Raises:
        ValueError: an unknown corruption or a severity outside 1..5, naming the key.
        DamagedFileError: the archive or a member cannot be parsed, or the arrays have the
            wrong shapes; naming the file, the member and the remedy.
    """
    corruption, severity = _corruption_and_severity(name, spec)
    paths = resolve_files(name, spec, Path(downloads), files)
    archive = paths["CIFAR-10-C.tar"]
    images, labels = _read_arrays(archive, corruption)
    rows = severity_rows(len(images), severity)
    images, labels = images[rows], labels[rows].astype(np.int64)
    first_row = rows.start
    pool, test = paper_fixed_split(len(images))

    def split_of(idx: np.ndarray):
        return make_split(
            [encode_png(images[i]) for i in idx],
            labels[idx].tolist(),
            [f"{corruption}.npy[{first_row + int(i)}]" for i in idx],
        )

    prepared = PreparedSplits(
        splits={"pool": split_of(pool), "test": split_of(test)},
        class_names=list(CIFAR10_CLASSES),
        details={
            "corruption": corruption,
            "severity": severity,
            "encoding": "png",
            "pool_test_split": "reference code: numpy legacy seed 42 permutation, first 80% pool",
        },
    )
    return write_prepared(name, spec, out_dir, prepared, paths, expected)


def _corruption_and_severity(name: str, spec: dict[str, Any]) -> tuple[str, int]:
    """The dataset's corruption and severity (default 5), checked.

    Raises:
        ValueError: an unknown corruption or a severity outside 1..5, naming the key.
    """
    corruption = spec.get("corruption")
    if corruption not in CIFAR10C_CORRUPTIONS:
        raise ValueError(
            f"datasets.{name}.corruption: {corruption!r} is not one of {CIFAR10C_CORRUPTIONS}"
        )
    severity = int(spec.get("severity", 5))
    if not 1 <= severity <= SEVERITIES:
        raise ValueError(f"datasets.{name}.severity: {severity} is not in 1..{SEVERITIES}")
    return corruption, severity


def _read_arrays(archive: InputFile, corruption: str) -> tuple[np.ndarray, np.ndarray]:
    """The corruption's images (every severity) and the labels out of the tar, shapes checked.

    Raises:
        DamagedFileError: the archive or a member cannot be parsed, or the arrays have the
            wrong shapes.
    """
    with archive.reading("CIFAR-10-C tar archive"):
        wanted, members = read_tar_suffixes(
            archive.path, {"images": f"{corruption}.npy", "labels": "labels.npy"}
        )
    image_member, label_member = wanted["images"], wanted["labels"]
    arrays = {}
    for member in (image_member, label_member):
        with archive.reading(".npy array", member):
            data = members[member]
            if not data.startswith(NPY_MAGIC):  # else numpy blames pickles (not allowed here)
                raise FormatError(f"no .npy header; it starts with {data[:16]!r}")
            arrays[member] = np.load(io.BytesIO(data), allow_pickle=False)
    images, labels = arrays[image_member], arrays[label_member]
    if images.ndim != 4 or images.shape[1:] != (32, 32, 3) or images.shape[:1] != labels.shape:
        layout = ", channel-first" if images.ndim == 4 and images.shape[1:] == (3, 32, 32) else ""
        raise archive.misshapen(
            f"{image_member} has shape {images.shape}{layout} and {label_member} "
            f"{labels.shape}; the official arrays are (N, 32, 32, 3) uint8 images and (N,) labels"
        )
    if len(images) % SEVERITIES:
        raise archive.damaged(
            f"{len(images)} rows do not split into {SEVERITIES} severities", image_member
        )
    return images, labels
