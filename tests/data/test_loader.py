"""Finetuning data: splits, seeded order, RandomResizedCrop boxes, augmentation, eval sets."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.transforms import RandomResizedCrop

from vitplasticity.data import loader, store
from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.data.transforms import eval_image

PRE = Preprocessing(
    input_size=32, crop_pct=0.9, interpolation="bicubic", mean=(0.5,) * 3, std=(0.5,) * 3
)


def test_pool_split_by_run_seed(demo_dataset: Path) -> None:
    pool = store.read_split(demo_dataset, "pool")
    splits = loader.load_finetune_splits(demo_dataset, seed=3, val_fraction=0.25)
    assert splits.val_source == "pool"
    assert (len(splits.train), len(splits.val)) == (48, 16)
    assert set(splits.train.files).isdisjoint(splits.val.files)
    assert set(splits.train.files) | set(splits.val.files) == set(pool.files)
    other = loader.load_finetune_splits(demo_dataset, seed=4, val_fraction=0.25)
    assert set(other.val.files) != set(splits.val.files)
    assert splits.num_classes == 4


def test_fixed_val_split_is_used_as_is(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = [store.encode_png(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(6)]
    with store.PreparedDatasetWriter(tmp_path / "fixed") as writer:
        writer.add_split("pool", images[:3], [0, 1, 0], ["p0", "p1", "p2"])
        writer.add_split("val", images[3:5], [1, 0], ["v0", "v1"])
        writer.add_split("test", images[5:], [1], ["t0"])
        writer.finish({"name": "fixed", "num_classes": 2})
    splits = loader.load_finetune_splits(tmp_path / "fixed", seed=0, val_fraction=0.2)
    assert splits.val_source == "fixed"
    assert splits.train.files == ["p0", "p1", "p2"]
    assert splits.val.files == ["v0", "v1"]


def test_batches_tile_each_epoch_exactly_once() -> None:
    n, batch = 10, 4
    drawn = np.concatenate([loader.batch_indices(s, batch, n, seed=7) for s in range(5)])  # 20
    for epoch in range(2):
        chunk = drawn[epoch * n : (epoch + 1) * n]
        assert sorted(chunk.tolist()) == list(range(n))
        np.testing.assert_array_equal(chunk, loader.epoch_permutation(n, 7, epoch))
    assert not np.array_equal(drawn[:n], drawn[n:])  # each epoch its own order
    assert loader.loader_position(3, batch, n) == (1, 2)
    # The batch of a step does not depend on the steps drawn before it.
    np.testing.assert_array_equal(loader.batch_indices(3, batch, n, 7), drawn[12:16])
    assert not np.array_equal(
        loader.batch_indices(0, batch, n, 7), loader.batch_indices(0, batch, n, 8)
    )


def test_random_resized_crop_boxes_respect_scale_and_ratio() -> None:
    rng = np.random.default_rng(0)
    height, width = 40, 60
    fractions, ratios = [], []
    for _ in range(2000):
        top, left, h, w = loader.random_resized_crop_box(rng, height, width)
        assert top >= 0 and top + h <= height and left >= 0 and left + w <= width
        fractions.append(h * w / (height * width))
        ratios.append(w / h)
    # Rounding to whole pixels moves area and ratio a little beyond the nominal bounds.
    assert min(fractions) >= 0.08 * 0.8 and max(fractions) <= 1.0
    assert min(ratios) >= 0.75 * 0.85 and max(ratios) <= 4 / 3 / 0.85
    # Same distribution as torchvision's own RandomResizedCrop (an independent implementation
    # drawing from the global torch RNG): compare the mean area fraction and ratio.
    torch.manual_seed(0)
    image = torch.zeros(3, height, width)
    reference = [
        RandomResizedCrop.get_params(image, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(2000)
    ]
    ref_fractions = [h * w / (height * width) for _, _, h, w in reference]
    ref_ratios = [w / h for _, _, h, w in reference]
    assert float(np.mean(fractions)) == pytest.approx(float(np.mean(ref_fractions)), abs=0.03)
    assert float(np.mean(ratios)) == pytest.approx(float(np.mean(ref_ratios)), abs=0.03)


def test_random_resized_crop_falls_back_to_central_box() -> None:
    # A 2 x 100 strip admits no box of ratio 3/4..4/3 with area >= 8%: the fallback is the
    # largest central box of ratio 4/3.
    box = loader.random_resized_crop_box(np.random.default_rng(0), 2, 100)
    assert box == (0, (100 - round(2 * 4 / 3)) // 2, 2, round(2 * 4 / 3))


def test_augment_is_seeded_and_flips() -> None:
    image = torch.arange(3 * 32 * 32, dtype=torch.int64).remainder(256).to(torch.uint8)
    image = image.view(3, 32, 32)
    first = loader.augment(image, np.random.default_rng(5), PRE)
    again = loader.augment(image, np.random.default_rng(5), PRE)
    assert first.dtype == torch.uint8 and first.shape == (3, 32, 32)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    # A left-right ramp: a flip makes it decrease along the width.
    ramp = torch.linspace(0, 255, 32).round().to(torch.uint8).expand(3, 32, 32).contiguous()
    slopes = set()
    for seed in range(20):
        out = loader.augment(ramp, np.random.default_rng(seed), PRE).float()
        slopes.add(bool(out[0, 16, -1] > out[0, 16, 0]))
    assert slopes == {True, False}


def test_train_batches_rebuild_identically_in_any_order(demo_dataset: Path) -> None:
    splits = loader.load_finetune_splits(demo_dataset, seed=0, val_fraction=0.2)
    bank = loader.ImageBank(splits.train.images)
    assert bank.decoded
    batches = loader.TrainBatches(bank, splits.train.labels, PRE, batch_size=8, seed=0)
    later_images, later_labels = batches[5]
    first = list(loader.train_batches(batches, 0, 6, num_workers=0, pin_memory=False))
    torch.testing.assert_close(first[5][0], later_images, rtol=0, atol=0)
    torch.testing.assert_close(first[5][1], later_labels, rtol=0, atol=0)
    indices = loader.batch_indices(5, 8, len(bank), 0)
    assert later_labels.tolist() == splits.train.labels[indices].tolist()
    # Worker processes build the same batches.
    with_workers = list(loader.train_batches(batches, 2, 6, num_workers=2, pin_memory=False))
    for (a, la), (b, lb) in zip(first[2:], with_workers, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(la, lb, rtol=0, atol=0)


def test_image_bank_decodes_lazily_over_budget(demo_dataset: Path) -> None:
    split = store.read_split(demo_dataset, "test")
    eager, lazy = loader.ImageBank(split.images), loader.ImageBank(split.images, budget_bytes=1)
    assert eager.decoded and not lazy.decoded
    torch.testing.assert_close(eager[3], lazy[3], rtol=0, atol=0)
    assert eager[3].shape == (3, 32, 32) and eager[3].dtype == torch.uint8


def test_eval_set_is_the_eval_transform(demo_dataset: Path) -> None:
    split = store.read_split(demo_dataset, "test")
    data = loader.eval_set(split, PRE)
    assert data.images.shape == (32, 3, 32, 32) and len(data) == 32
    torch.testing.assert_close(data.images[7], eval_image(split.images[7], PRE), rtol=0, atol=0)
    chunks = list(data.batches(10))
    assert [len(labels) for _, labels in chunks] == [10, 10, 10, 2]
    assert torch.cat([labels for _, labels in chunks]).tolist() == split.labels.tolist()


@pytest.mark.parametrize("n", [1, 7])
def test_loader_position(n: int) -> None:
    for step in range(5):
        epoch, position = loader.loader_position(step, 3, n)
        assert epoch * n + position == step * 3 and 0 <= position < n
        assert math.floor(step * 3 / n) == epoch
