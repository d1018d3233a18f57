"""The plasticity reference set: ImageNet-1k val images in the paper's order, or a split of a
prepared dataset (the demo). Written in the prepared-split format (image, label, file)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from vitplasticity.data.imagenet_layouts import imagenet_missing_message
from vitplasticity.data.store import read_split, write_split
from vitplasticity.utils.io import atomic_path, read_parquet_table


def build_reference(
    out: str | os.PathLike[str],
    *,
    source: str,
    imagenet: str | None = None,
    dataset_dir: str | None = None,
    split: str = "test",
    n_images: int = 12800,
    selection: str = "paper",
    seed: int = 0,
) -> int:
    """Write the reference set to ``out`` (Parquet); return its image count.

    Raises:
        ValueError: when the ImageNet path is unset, naming the config key and layouts.
    """
    if source == "imagenet":
        if not imagenet:
            raise ValueError(imagenet_missing_message())
        from vitplasticity.data.imagenet import imagenet_reference

        images, labels, files = imagenet_reference(
            imagenet, n_images=n_images, selection=selection, seed=seed
        )
    elif source == "dataset":
        if not dataset_dir:
            raise ValueError("reference.dataset: required when reference.source is 'dataset'")
        data = read_split(dataset_dir, split)
        if selection == "paper":
            idx = np.arange(min(n_images, len(data)))
        else:
            idx = np.sort(np.random.default_rng(seed).permutation(len(data))[:n_images])
        subset = data.subset(idx)
        images, labels, files = subset.images, subset.labels.tolist(), subset.files
    else:
        raise ValueError(f"reference.source: unknown source {source!r} (imagenet | dataset)")
    if len(images) < n_images:
        raise ValueError(
            f"reference set has {len(images)} images, fewer than reference.n_images = {n_images}"
        )
    with atomic_path(out) as tmp:
        write_split(tmp, images, labels, files)
    return len(images)


def read_reference_images(path: str | os.PathLike[str]) -> list[bytes]:
    """The encoded images of a reference set (prepared-split columns image, label, file).

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        UnreadableFileError: when it is damaged or has no ``image`` column.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"reference set not found: {path}")
    remedy = f"delete {path} and rerun: the workflow builds the reference set again"
    return read_parquet_table(path, ["image"], remedy).column("image").to_pylist()
