"""The generic ImageFolder preparer: ``root/<class>/<image>`` trees into the prepared store.

Images are stored as their original encoded bytes (no re-encoding, no quality loss). When
``root`` has ``train/`` and ``test/`` subfolders they become the pool and test splits (and
``val/`` a fixed validation split); otherwise the fixed seed-42 80/20 split makes pool/test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.archives import InputFile, first_undecodable
from vitplasticity.data.store import PreparedDatasetWriter, fixed_split

IMAGE_SUFFIXES: frozenset[str] = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif"})


def scan_image_folder(
    root: str | os.PathLike[str], classes: list[str] | None = None
) -> tuple[list[Path], list[int], list[str]]:
    """List images under ``root/<class>/`` sorted by (class, file name).

    Returns the image paths, their labels, and the class names (sorted folder names unless
    ``classes`` fixes them).

    Raises:
        FileNotFoundError: when ``root`` is missing or holds no class folder with images.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist")
    names = classes or sorted(p.name for p in root.iterdir() if p.is_dir())
    paths: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(names):
        folder = root / name
        files = (
            sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if folder.is_dir()
            else []
        )
        paths.extend(files)
        labels.extend([label] * len(files))
    if not paths:
        raise FileNotFoundError(f"image folder {root}: no <class>/<image> files found")
    return paths, labels, names


def read_images(paths: list[Path], key: str) -> list[bytes]:
    """The encoded bytes of every image, each checked to decode as training will decode it.

    Args:
        paths: the image files.
        key: the config key the folder comes from (named in the remedy).

    Raises:
        DamagedFileError: an unreadable or undecodable image, naming it and the remedy.
    """
    images = []
    for path in paths:
        with InputFile.local(path, key).reading("image file"):
            images.append(path.read_bytes())
    bad = first_undecodable(images)
    if bad is not None:
        raise InputFile.local(paths[bad[0]], key).damaged(f"not a decodable image ({bad[1]})")
    return images


def prepare_image_folder(
    root: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    name: str,
    *,
    split_seed: int = 42,
    test_fraction: float = 0.2,
    extra_meta: dict[str, Any] | None = None,
    key: str | None = None,
) -> dict[str, int]:
    """Prepare an ImageFolder tree; return the split sizes.

    Every image must decode (see :func:`read_images`); on any failure nothing is written.

    Args:
        root: the folder.
        out_dir: the prepared dataset's folder.
        name: the dataset's name.
        split_seed: seed of the fixed pool/test split (no ``train``/``test`` subfolders).
        test_fraction: the share of that split's test part.
        extra_meta: more meta.json entries.
        key: where ``root`` comes from, named in errors (default ``datasets.<name>.root``).

    Raises:
        FileNotFoundError: ``root`` is missing or holds no class folder with images.
        DamagedFileError: an image cannot be read or decoded, naming it and the remedy.
    """
    root = Path(root)
    key = key or f"datasets.{name}.root"
    with PreparedDatasetWriter(out_dir) as writer:
        if (root / "train").is_dir() and (root / "test").is_dir():
            classes = _add_given_splits(writer, root, key)
        else:
            classes = _add_fixed_split(writer, root, key, split_seed, test_fraction)
        writer.finish(
            {
                "name": name,
                "source": "image_folder",
                "num_classes": len(classes),
                "class_names": classes,
                **(extra_meta or {}),
            }
        )
        return dict(writer.counts)


def _add_given_splits(writer: PreparedDatasetWriter, root: Path, key: str) -> list[str]:
    """Write the tree's own ``train`` (the pool), ``val`` (when there) and ``test`` folders,
    labelled by the classes of ``train``; return those classes."""
    _, _, classes = scan_image_folder(root / "train")
    for folder, split in (("train", "pool"), ("val", "val"), ("test", "test")):
        if (root / folder).is_dir():
            paths, labels, _ = scan_image_folder(root / folder, classes)
            writer.add_split(
                split, read_images(paths, key), labels, [str(p.relative_to(root)) for p in paths]
            )
    return classes


def _add_fixed_split(
    writer: PreparedDatasetWriter, root: Path, key: str, split_seed: int, test_fraction: float
) -> list[str]:
    """Write a fixed seeded pool/test split of the tree's class folders; return the classes."""
    paths, labels, classes = scan_image_folder(root)
    pool, test = fixed_split(len(paths), split_seed, test_fraction)
    for split, idx in (("pool", pool), ("test", test)):
        chosen = [paths[i] for i in idx]
        writer.add_split(
            split,
            read_images(chosen, key),
            np.asarray(labels)[idx].tolist(),
            [str(p.relative_to(root)) for p in chosen],
        )
    return classes
