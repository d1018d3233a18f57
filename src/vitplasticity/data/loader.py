"""Finetuning batches from the prepared store: the train/val/test splits of a run, seeded
data order, train augmentation, and eval sets.

Everything random here is a pure function of (run seed, epoch) or (run seed, step): the
order of epoch ``e`` is a permutation seeded by ``(seed, e)``, and the augmentation of the
batch of step ``s`` is drawn from a generator seeded by ``(seed, s)``. The batch of any step
can therefore be rebuilt on its own, so a resumed run (or a worker process) reproduces
exactly the batches of an uninterrupted one, and the loader state in a checkpoint is just
the step.

Train augmentation (docs/protocol.md): RandomResizedCrop (scale 0.08-1, ratio 3/4-4/3) to the
model's resolution + horizontal flip with probability 0.5, on uint8 images decoded once.
Eval: Resize + CenterCrop (:mod:`vitplasticity.data.transforms`), computed once per image.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torchvision.transforms.v2 import functional as F

from vitplasticity.data import store
from vitplasticity.data.decode import decode
from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.data.transforms import eval_image, interpolation_mode

log = logging.getLogger(__name__)

CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
DECODED_BUDGET_BYTES = 8 * 2**30
"""Decoded train images above this size stay encoded and are decoded when drawn."""

# Stream tags keep the data order and the augmentation draws independent for one seed.
_ORDER_STREAM = 0
_AUGMENT_STREAM = 1


@dataclass(frozen=True)
class FinetuneSplits:
    """The three splits of one run and where its validation set came from."""

    train: store.Split
    val: store.Split
    test: store.Split
    num_classes: int
    val_source: str  # "pool" (seeded split of the pool) or "fixed" (the dataset's val split)


def load_finetune_splits(
    dataset_dir: str | os.PathLike[str], seed: int, val_fraction: float
) -> FinetuneSplits:
    """Read a prepared dataset and split it for a run seeded by ``seed``.

    When the dataset ships a ``val`` split (flowers102) the pool is the train set;
    otherwise the pool is split into train/val by :func:`store.split_pool` with the run seed.
    """
    meta = store.read_meta(dataset_dir)
    pool = store.read_split(dataset_dir, "pool")
    test = store.read_split(dataset_dir, "test")
    fixed_val = store.read_split(dataset_dir, "val") if store.has_fixed_val(dataset_dir) else None
    stored = {"pool": pool, "test": test, **({"val": fixed_val} if fixed_val is not None else {})}
    store.check_labels(dataset_dir, meta["num_classes"], stored)
    if fixed_val is not None:
        train, val, source = pool, fixed_val, "fixed"
    else:
        train_idx, val_idx = store.split_pool(len(pool), seed, val_fraction)
        train, val, source = pool.subset(train_idx), pool.subset(val_idx), "pool"
    if not len(train) or not len(val) or not len(test):
        raise ValueError(
            f"{dataset_dir}: empty split (train {len(train)}, val {len(val)}, test {len(test)})"
        )
    return FinetuneSplits(train, val, test, int(meta["num_classes"]), source)


class ImageBank:
    """Train images as uint8 (3, H, W) tensors at their stored size.

    Decoded once up front when they fit in ``budget_bytes`` (estimated from a sample);
    otherwise kept encoded and decoded each time they are drawn.
    """

    def __init__(self, images: list[bytes], budget_bytes: int = DECODED_BUDGET_BYTES) -> None:
        sample = [decode(image) for image in images[:64]]
        per_image = sum(pixels.numel() for pixels in sample) / max(1, len(sample))
        estimate = per_image * len(images)
        self.decoded = estimate <= budget_bytes
        if self.decoded:
            self._items: list[torch.Tensor] | list[bytes] = sample + [
                decode(image) for image in images[len(sample) :]
            ]
        else:
            log.info("train images (~%.1f GiB decoded) are decoded on the fly", estimate / 2**30)
            self._items = images

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> torch.Tensor:
        item = self._items[index]
        return item if isinstance(item, torch.Tensor) else decode(item)


def _rng(seed: int, stream: int, counter: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream, counter])


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the ``n`` train images in epoch ``epoch`` of a run seeded by ``seed``."""
    return _rng(seed, _ORDER_STREAM, epoch).permutation(n)


def loader_position(step: int, batch_size: int, n: int) -> tuple[int, int]:
    """(epoch, position within the epoch) where the batch of step ``step`` starts."""
    epoch, position = divmod(step * batch_size, n)
    return epoch, position


def batch_indices(step: int, batch_size: int, n: int, seed: int) -> np.ndarray:
    """Indices of the train images in the batch of step ``step`` (0-based).

    Batches tile the sequence of epoch permutations without gaps, so a batch may span the
    end of one epoch and the start of the next.
    """
    epoch, position = loader_position(step, batch_size, n)
    parts: list[np.ndarray] = []
    needed = batch_size
    while needed:
        order = epoch_permutation(n, seed, epoch)
        part = order[position : position + needed]
        parts.append(part)
        needed -= len(part)
        epoch, position = epoch + 1, 0
    return np.concatenate(parts)


def random_resized_crop_box(
    rng: np.random.Generator,
    height: int,
    width: int,
    scale: tuple[float, float] = CROP_SCALE,
    ratio: tuple[float, float] = CROP_RATIO,
) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a RandomResizedCrop box, torchvision's algorithm.

    Up to 10 tries of an area fraction uniform in ``scale`` and a log-uniform aspect ratio
    in ``ratio``; then the largest central box within ``ratio``.
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def augment(pixels: torch.Tensor, rng: np.random.Generator, pre: Preprocessing) -> torch.Tensor:
    """RandomResizedCrop to ``pre.input_size`` + horizontal flip (p 0.5) of a uint8 image."""
    top, left, h, w = random_resized_crop_box(rng, pixels.shape[-2], pixels.shape[-1])
    size = [pre.input_size, pre.input_size]
    out = F.resized_crop(
        pixels,
        top,
        left,
        h,
        w,
        size,
        interpolation=interpolation_mode(pre.interpolation),
        antialias=True,
    )
    return F.horizontal_flip(out) if rng.random() < 0.5 else out


class TrainBatches(torch.utils.data.Dataset):
    """Map-style dataset whose item ``s`` is the augmented batch of step ``s``.

    Items: uint8 images (B, 3, S, S) and int64 labels (B,). Any worker process can build any
    step's batch, in any order, with the same result.
    """

    def __init__(
        self,
        bank: ImageBank,
        labels: np.ndarray,
        pre: Preprocessing,
        batch_size: int,
        seed: int,
    ) -> None:
        if len(bank) != len(labels):
            raise ValueError(f"{len(bank)} train images but {len(labels)} labels")
        self.bank, self.labels, self.pre = bank, torch.as_tensor(labels, dtype=torch.int64), pre
        self.batch_size, self.seed = batch_size, seed

    def __len__(self) -> int:
        # Any step is a valid item; len only serves samplers, which we pass explicitly.
        return 2**62

    def __getitem__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        indices = batch_indices(step, self.batch_size, len(self.bank), self.seed)
        rng = _rng(self.seed, _AUGMENT_STREAM, step)
        images = torch.stack([augment(self.bank[int(i)], rng, self.pre) for i in indices])
        return images, self.labels[torch.from_numpy(indices)]


def train_batches(
    batches: TrainBatches, start_step: int, steps: int, num_workers: int, pin_memory: bool
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield the batches of steps ``start_step, ..., steps - 1`` in order.

    With ``num_workers`` > 0, worker processes build them ahead of the training loop.
    """
    if num_workers == 0:
        for step in range(start_step, steps):
            yield batches[step]
        return
    loader = torch.utils.data.DataLoader(
        batches,
        batch_size=None,
        sampler=range(start_step, steps),
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=2,
        worker_init_fn=_ignore_sigterm,
    )
    yield from loader


def _ignore_sigterm(worker_id: int) -> None:
    # SLURM signals every process of the job; the main process checkpoints and then stops
    # the workers itself. A worker dying of SIGTERM first would abort the loop instead.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@dataclass(frozen=True)
class EvalSet:
    """An eval split preprocessed once: uint8 (N, 3, S, S) images and int64 labels."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def batches(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yield (uint8 images, labels) chunks in order."""
        for start in range(0, len(self), batch_size):
            yield self.images[start : start + batch_size], self.labels[start : start + batch_size]


def eval_set(split: store.Split, pre: Preprocessing) -> EvalSet:
    """Resize + CenterCrop every image of ``split`` once (deterministic, so done once)."""
    images = torch.stack([eval_image(image, pre) for image in split.images])
    return EvalSet(images, torch.as_tensor(split.labels, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------
# Augmentation on the device (the GPU path): workers only gather decoded uint8 images and draw
# the boxes; the crops, resizes and flips of a whole batch run on the accelerator.


def crop_and_flip_draws(
    rng: np.random.Generator, sizes: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Per image of sizes (H, W): its RandomResizedCrop box and whether it is flipped.

    The draws are those :func:`augment` makes, in its order (box, then flip, image after
    image), so the device path crops exactly the boxes the CPU path would.

    Returns:
        boxes (B, 4) float32 as (x1, y1, x2, y2) pixel-edge coordinates; flips (B,) bool.
    """
    boxes = np.empty((len(sizes), 4), dtype=np.float32)
    flips = np.empty(len(sizes), dtype=bool)
    for index, (height, width) in enumerate(sizes):
        top, left, h, w = random_resized_crop_box(rng, height, width)
        boxes[index] = (left, top, left + w, top + h)
        flips[index] = rng.random() < 0.5
    return boxes, flips


def pad_to_canvas(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack uint8 (3, H_i, W_i) images into one (B, 3, H_max, W_max) canvas (zero padded).

    Returns:
        The canvas and the (B, 2) int64 sizes (H_i, W_i) of the images in it.
    """
    sizes = torch.tensor([image.shape[-2:] for image in images], dtype=torch.int64)
    if bool((sizes == sizes[0]).all()):
        return torch.stack(images), sizes
    height, width = (int(v) for v in sizes.max(dim=0).values)
    canvas = torch.zeros((len(images), 3, height, width), dtype=torch.uint8)
    for index, image in enumerate(images):
        canvas[index, :, : image.shape[-2], : image.shape[-1]] = image
    return canvas, sizes


def augment_on_device(
    canvas: torch.Tensor,
    sizes: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    size: int,
) -> torch.Tensor:
    """RandomResizedCrop + flip of a batch where the batch lives (one call, no host loop).

    Each box is resampled to ``size`` x ``size`` by ``torchvision.ops.roi_align`` (bilinear
    samples averaged over each output pixel's footprint: plain bilinear when enlarging, an
    area-style antialiased filter when shrinking), so the result differs from the CPU path's
    antialiased bicubic resize by interpolation only; the boxes and flips are the same.

    Args:
        canvas: uint8 (B, 3, H, W) images, each in the top-left (H_i, W_i) of its slot.
        sizes: (B, 2) image sizes (H_i, W_i); images of another size than the canvas are
            resampled one size group at a time so that no padding is ever interpolated in.
        boxes: (B, 4) float (x1, y1, x2, y2) crop boxes in pixel-edge coordinates.
        flips: (B,) bool, which crops to mirror horizontally.
        size: the output resolution.

    Returns:
        uint8 (B, 3, size, size) crops on the canvas's device.
    """
    from torchvision.ops import roi_align

    device = canvas.device
    boxes = boxes.to(device=device, dtype=torch.float32)
    flips = flips.to(device)
    out = torch.empty((len(canvas), 3, size, size), dtype=torch.float32, device=device)
    for members in _size_groups(sizes, canvas.shape[-2:]):
        height, width = (int(v) for v in sizes[members[0]])
        images = canvas[members.to(device), :, :height, :width].float()  # (g, 3, h, w)
        rois = torch.cat(
            [
                torch.arange(len(members), device=device, dtype=torch.float32)[:, None],
                boxes[members.to(device)],
            ],
            dim=1,
        )  # (g, 5): batch index, x1, y1, x2, y2
        out[members.to(device)] = roi_align(
            images, rois, output_size=size, spatial_scale=1.0, sampling_ratio=-1, aligned=True
        )
    out = torch.where(flips[:, None, None, None], out.flip(-1), out)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _size_groups(sizes: torch.Tensor, canvas_size: torch.Size) -> list[torch.Tensor]:
    """The batch indices of each group of images with one size: the whole batch when every
    image fills the canvas (CIFAR, CIFAR-10-C), otherwise one group per distinct size."""
    full = (sizes[:, 0] == canvas_size[0]) & (sizes[:, 1] == canvas_size[1])
    if bool(full.all()):
        return [full.nonzero().flatten()]
    return [
        ((sizes[:, 0] == height) & (sizes[:, 1] == width)).nonzero().flatten()
        for height, width in sizes.unique(dim=0).tolist()
    ]


class DeviceTrainBatches(TrainBatches):
    """Like :class:`TrainBatches`, but item ``s`` leaves the augmentation to the device.

    Items: uint8 canvas (B, 3, H, W), sizes (B, 2), boxes (B, 4), flips (B,) and int64 labels
    (B,); :func:`augment_on_device` turns the first four into the batch's uint8 crops.
    """

    def __getitem__(self, step: int) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        indices = batch_indices(step, self.batch_size, len(self.bank), self.seed)
        rng = _rng(self.seed, _AUGMENT_STREAM, step)
        images = [self.bank[int(i)] for i in indices]
        canvas, sizes = pad_to_canvas(images)
        boxes, flips = crop_and_flip_draws(rng, [tuple(image.shape[-2:]) for image in images])
        labels = self.labels[torch.from_numpy(indices)]
        return canvas, sizes, torch.from_numpy(boxes), torch.from_numpy(flips), labels
