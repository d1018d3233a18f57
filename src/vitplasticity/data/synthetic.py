"""The demo's offline data source: small labelled image sets the project generates itself.

Each class is a visual concept a tiny ViT can learn in a few dozen steps (an orientation of
stripes, a position of a blob, or a colour palette), drawn with per-image random phase,
jitter and noise so that train and test images differ. The images are PNG-encoded into the
same prepared store as every real dataset, and read back by the same loader.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from vitplasticity.data.store import PreparedDatasetWriter, encode_png

STYLES: tuple[str, ...] = ("stripes", "blobs", "palette")


def synthetic_images(
    style: str, num_classes: int, n: int, image_size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Generate ``n`` images of ``style``: (n, H, W, 3) uint8 and (n,) int64 labels.

    Labels cycle through the classes (balanced); the images are deterministic in ``seed``.
    """
    if style not in STYLES:
        raise ValueError(f"unknown synthetic style {style!r}; known: {', '.join(STYLES)}")
    rng = np.random.default_rng(seed)
    labels = np.arange(n, dtype=np.int64) % num_classes
    rng.shuffle(labels)
    coords = (np.arange(image_size, dtype=np.float64) + 0.5) / image_size
    yy, xx = np.meshgrid(coords, coords, indexing="ij")  # (H, W)
    images = np.empty((n, image_size, image_size, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        fraction = label / num_classes
        if style == "stripes":
            angle = np.pi * fraction + rng.normal(0, 0.05)
            wave = np.sin(
                2 * np.pi * 4 * (np.cos(angle) * xx + np.sin(angle) * yy)
                + rng.uniform(0, 2 * np.pi)
            )
            base = rng.uniform(0.3, 0.7, size=3)
            canvas = base + 0.3 * wave[..., None] * np.array([1.0, 0.8, 0.6])
        elif style == "blobs":
            theta = 2 * np.pi * fraction
            cy, cx = 0.5 + 0.3 * np.sin(theta), 0.5 + 0.3 * np.cos(theta)
            cy, cx = cy + rng.normal(0, 0.03), cx + rng.normal(0, 0.03)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * 0.12**2))
            colour = rng.uniform(0.5, 1.0, size=3)
            canvas = 0.2 + blob[..., None] * colour
        else:  # palette
            hue = 2 * np.pi * fraction
            colour = 0.5 + 0.35 * np.array([np.cos(hue), np.cos(hue - 2.1), np.cos(hue + 2.1)])
            texture = rng.normal(0, 1, size=(4, 4))
            texture = np.kron(texture, np.ones((image_size // 4 + 1, image_size // 4 + 1)))
            canvas = colour + 0.08 * texture[:image_size, :image_size, None]
        canvas = canvas + rng.normal(0, 0.04, size=canvas.shape)
        images[i] = np.clip(canvas * 255.0, 0, 255).astype(np.uint8)
    return images, labels


def prepare_synthetic(
    out_dir: str | os.PathLike[str], name: str, spec: dict[str, Any]
) -> dict[str, int]:
    """Generate a synthetic dataset from its config entry and write it to the prepared store.

    ``spec`` keys: ``style``, ``num_classes``, ``n_pool``, ``n_test``, ``image_size``, ``seed``.
    Returns the split sizes.
    """
    num_classes, size, seed = int(spec["num_classes"]), int(spec["image_size"]), int(spec["seed"])
    with PreparedDatasetWriter(out_dir) as writer:
        for offset, (split, count) in enumerate(
            (("pool", spec["n_pool"]), ("test", spec["n_test"]))
        ):
            images, labels = synthetic_images(
                spec["style"], num_classes, int(count), size, seed + offset
            )
            writer.add_split(
                split,
                (encode_png(image) for image in images),
                labels.tolist(),
                [f"{split}/{i:06d}.png" for i in range(len(images))],
            )
        writer.finish(
            {
                "name": name,
                "source": "synthetic",
                "num_classes": num_classes,
                "class_names": [f"{spec['style']}_{k}" for k in range(num_classes)],
                "demo": True,
                "spec": spec,
            }
        )
        return dict(writer.counts)
