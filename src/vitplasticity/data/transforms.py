"""Eval preprocessing of decoded images (:mod:`vitplasticity.data.decode`), shared by the plasticity, reference and finetune stages.

Eval: Resize(shorter side to input_size / crop_pct) + CenterCrop(input_size) + normalise, on
uint8 tensors decoded by torchvision (antialiased bilinear/bicubic resize, as PIL does).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F

from vitplasticity.data.decode import decode
from vitplasticity.data.preprocessing import Preprocessing

_INTERPOLATION = {
    "bicubic": InterpolationMode.BICUBIC,
    "bilinear": InterpolationMode.BILINEAR,
    "nearest": InterpolationMode.NEAREST,
}


def interpolation_mode(name: str) -> InterpolationMode:
    """torchvision's interpolation for a timm ``interpolation`` name."""
    return _INTERPOLATION.get(name, InterpolationMode.BICUBIC)


def normalize(batch: torch.Tensor, pre: Preprocessing) -> torch.Tensor:
    """uint8 (B, 3, H, W) into float32 normalised by the model's mean and std."""
    mean = torch.tensor(pre.mean, device=batch.device).view(1, 3, 1, 1)
    std = torch.tensor(pre.std, device=batch.device).view(1, 3, 1, 1)
    return (batch.float() / 255.0 - mean) / std


def eval_image(image: bytes, pre: Preprocessing) -> torch.Tensor:
    """One image through Resize + CenterCrop, still uint8: (3, S, S)."""
    pixels = decode(image)
    pixels = F.resize(
        pixels,
        [pre.resize_size],
        interpolation=interpolation_mode(pre.interpolation),
        antialias=True,
    )
    return F.center_crop(pixels, [pre.input_size, pre.input_size])


def eval_batches(
    images: Sequence[bytes], pre: Preprocessing, batch_size: int
) -> Iterator[torch.Tensor]:
    """Yield normalised float32 batches (B, 3, S, S) of ``images`` in order."""
    for start in range(0, len(images), batch_size):
        chunk = images[start : start + batch_size]
        yield normalize(torch.stack([eval_image(image, pre) for image in chunk]), pre)


# Decoding threads: torchvision's decode and resize release the GIL, so a few threads keep
# the device fed while the main thread launches the forward passes.
DECODE_THREADS = 4


def decoded_batches(
    images: Sequence[bytes], pre: Preprocessing, batch_size: int, threads: int = DECODE_THREADS
) -> Iterator[torch.Tensor]:
    """:func:`eval_batches`, decoded ahead by a few threads (the same batches, in order).

    At most ``threads + 1`` batches are decoded and waiting at any time, so memory stays
    bounded however many images there are.
    """

    def decode(start: int) -> torch.Tensor:
        chunk = images[start : start + batch_size]
        return next(eval_batches(chunk, pre, len(chunk)))

    starts = iter(range(0, len(images), batch_size))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        # range first: zip stops on it without drawing (and losing) one more start.
        pending: list[Future[torch.Tensor]] = [
            pool.submit(decode, start) for _, start in zip(range(threads + 1), starts, strict=False)
        ]
        while pending:
            batch = pending.pop(0).result()
            start = next(starts, None)
            if start is not None:
                pending.append(pool.submit(decode, start))
            yield batch
