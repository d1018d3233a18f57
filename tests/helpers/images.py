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
