"""The image decoder of every stage (torchvision): what the prepared store's bytes become, and
what a dataset's preparation checks each image against."""

from __future__ import annotations

import torch
from torchvision.io import ImageReadMode, decode_image


def decode(image: bytes) -> torch.Tensor:
    """Decode PNG/JPEG bytes into a (3, H, W) uint8 tensor (grey and RGBA become RGB)."""
    data = torch.frombuffer(bytearray(image), dtype=torch.uint8)
    return decode_image(data, mode=ImageReadMode.RGB)
