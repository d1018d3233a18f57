"""Image files built by the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def image_folder(root: Path, per_class: int = 6) -> Path:
    """A class-per-folder image tree at ``root``: ``per_class`` random 32 px PNGs each of
    "cat" and "dog" (seeded)."""
    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def write_reference(
    path: Path,
    n: int,
    *,
    seed: int,
    size: tuple[int, int] = (36, 36),
    broken: bool = False,
    name_prefix: str = "ref_",
) -> Path:
    """A reference set at ``path`` as the reference stage writes one (a split, every label 0):
    ``n`` random RGB PNGs of ``size`` (height, width) drawn from ``seed``, or with ``broken``
    bytes no decoder reads; named ``<name_prefix><i>.png``."""
    from vitplasticity.data.store import encode_png, write_split

    rng = np.random.default_rng(seed)
    images = [
        b"not an image" if broken else encode_png(rng.integers(0, 256, (*size, 3), np.uint8))
        for _ in range(n)
    ]
    write_split(path, images, [0] * n, [f"{name_prefix}{i}.png" for i in range(n)])
    return path
