"""The fast paths keep the numbers: bf16 autocast (on the CPU here, as on a GPU) within its
documented tolerance of fp32, and the device augmentation crops exactly the CPU path's boxes
(docs/benchmarks.md)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from tests.helpers.tiny_finetune import settings_for
from vitplasticity.data import loader, store
from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.finetune.identity import check_runs
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.precision import autocast, cpu_bf16_native, tf32_matmuls
from vitplasticity.finetune.setup import augment_on_device
from vitplasticity.finetune.step import training_step
from vitplasticity.finetune.train import train
from vitplasticity.models.spec import TimmSpec

# bf16 keeps 8 mantissa bits (relative rounding 2^-9 ~ 0.2%); through 3 blocks the loss moves
# by a few parts in a thousand. The documented tolerances (docs/benchmarks.md):
BF16_LOSS_RTOL = 2e-2
BF16_GRAD_NORM_RTOL = 5e-2
BF16_UPDATE_RTOL = 1e-1  # ||update_bf16 - update_fp32|| / ||update_fp32|| after 3 steps

PRE = Preprocessing(
    input_size=24, crop_pct=1.0, interpolation="bicubic", mean=(0.5,) * 3, std=(0.5,) * 3
)


# One intra-op thread per module (conftest.py: tiny models run fastest so).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# A 4-step run of the whole model (configuration full): no warmup, one micro-batch per step,
# every step logged.
full_settings = functools.partial(
    settings_for, configuration="full", steps=4, val_every=2, micro_batch_size=8,
    warmup_steps=0, log_every=1, checkpoint_every=100, num_workers=0,
)  # fmt: skip


def test_bf16_step_within_tolerance_of_fp32(tiny_spec: TimmSpec, demo_dataset: Path) -> None:
    splits = loader.load_finetune_splits(demo_dataset, seed=0, val_fraction=0.2)
    device = torch.device("cpu")
    outcomes = {}
    for precision in ("fp32", "bf16"):
        settings = full_settings(tiny_spec, precision=precision)
        run_model = build_run_model(settings, splits.num_classes, device)
        initial = {n: p.detach().clone() for n, p in run_model.trainable}
        optimizer = build_optimizer(run_model.trainable, settings)
        batches = loader.TrainBatches(
            loader.ImageBank(splits.train.images), splits.train.labels,
            run_model.preprocessing, settings.training.batch_size, settings.run.seed,
        )  # fmt: skip
        results = [
            training_step(run_model, optimizer, batches[s], s, settings, device) for s in range(3)
        ]
        update = torch.cat([(p.detach() - initial[n]).flatten() for n, p in run_model.trainable])
        outcomes[precision] = (results, update)
    (fp32, fp32_update), (bf16, bf16_update) = outcomes["fp32"], outcomes["bf16"]
    for exact, fast in zip(fp32, bf16, strict=True):
        assert fast.loss == pytest.approx(exact.loss, rel=BF16_LOSS_RTOL)
        assert fast.grad_norm == pytest.approx(exact.grad_norm, rel=BF16_GRAD_NORM_RTOL)
    assert fp32[0].loss != bf16[0].loss  # bf16 really ran in bf16
    drift = torch.linalg.vector_norm(bf16_update - fp32_update).double()
    assert drift / torch.linalg.vector_norm(fp32_update).double() < BF16_UPDATE_RTOL


def test_bf16_cpu_run_within_tolerance_of_fp32(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    # The whole run on the CPU (loader, autocast steps, evaluation under inference_mode):
    # every logged loss and gradient norm, and every validation loss, within the tolerances.
    metrics = {}
    for precision in ("fp32", "bf16"):
        settings = full_settings(tiny_spec, precision=precision, steps=6, val_every=3)
        summary = train(settings.run, settings.training, demo_dataset, tmp_path / precision)
        assert summary["status"] == "completed"
        assert summary["settings"]["precision"] == precision
        metrics[precision] = pl.read_parquet(tmp_path / precision / "metrics.parquet")
    fp32, bf16 = metrics["fp32"], metrics["bf16"]
    assert fp32.select("step", "kind").equals(bf16.select("step", "kind"))
    is_train = pl.col("kind") == "train"
    for column, rtol in (("train_loss", BF16_LOSS_RTOL), ("grad_norm", BF16_GRAD_NORM_RTOL)):
        exact, fast = fp32.filter(is_train)[column], bf16.filter(is_train)[column]
        assert len(exact) == 6
        np.testing.assert_allclose(fast.to_numpy(), exact.to_numpy(), rtol=rtol)
    exact, fast = fp32.filter(~is_train)["val_loss"], bf16.filter(~is_train)["val_loss"]
    assert len(exact) == 2
    np.testing.assert_allclose(fast.to_numpy(), exact.to_numpy(), rtol=BF16_LOSS_RTOL)
    assert not fp32["train_loss"].equals(bf16["train_loss"])  # bf16 really ran in bf16


def test_cpu_bf16_native_reads_the_cpu_flags() -> None:
    # Independently: the kernel's CPU flags (Linux x86), AVX512-BF16 or an AMX tile unit.
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists() or "flags" not in cpuinfo.read_text():
        pytest.skip("no x86 /proc/cpuinfo flags on this machine")
    flags = set(
        next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")).split()
    )
    assert cpu_bf16_native() == bool({"avx512_bf16", "amx_tile"} & flags)


def _bilinear_reference(image: np.ndarray, box: tuple[float, ...], size: int) -> np.ndarray:
    """float64 bilinear samples at the centres of a size x size grid over ``box`` (x1, y1,
    x2, y2, pixel-edge coordinates), one sample per output pixel (the box is enlarged):
    coordinates clamp to the image's border pixels, as roi_align does."""
    x1, y1, x2, y2 = box
    height, width = image.shape[-2:]

    def axis(start: float, length: float, limit: int) -> tuple[np.ndarray, ...]:
        centres = start + (np.arange(size) + 0.5) * length / size - 0.5  # pixel-centre coords
        centres = np.clip(centres, 0, limit - 1)
        low = np.floor(centres).astype(int)
        high = np.minimum(low + 1, limit - 1)
        return low, high, centres - low

    y0, y1_, wy = axis(y1, y2 - y1, height)
    x0, x1_, wx = axis(x1, x2 - x1, width)
    img = image.astype(np.float64)
    top = img[:, y0][:, :, x0] * (1 - wx) + img[:, y0][:, :, x1_] * wx
    bottom = img[:, y1_][:, :, x0] * (1 - wx) + img[:, y1_][:, :, x1_] * wx
    return top * (1 - wy)[:, None] + bottom * wy[:, None]


def test_device_crop_is_bilinear_resampling_of_the_box() -> None:
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (2, 3, 16, 16), dtype=np.uint8))
    boxes = torch.tensor([[2.0, 3.0, 12.0, 11.0], [0.0, 0.0, 16.0, 16.0]])
    sizes = torch.tensor([[16, 16], [16, 16]])
    plain = loader.augment_on_device(images, sizes, boxes, torch.tensor([False, False]), 32)
    flipped = loader.augment_on_device(images, sizes, boxes, torch.tensor([True, False]), 32)
    for index in range(2):
        expected = _bilinear_reference(images[index].numpy(), tuple(boxes[index].tolist()), 32)
        got = plain[index].numpy().astype(np.float64)
        assert np.abs(got - expected).max() <= 0.5 + 1e-3  # rounding to uint8 only
    assert torch.equal(flipped[0], plain[0].flip(-1))
    assert torch.equal(flipped[1], plain[1])


def test_device_batches_crop_the_cpu_paths_boxes(demo_dataset: Path) -> None:
    split = store.read_split(demo_dataset, "pool")
    bank = loader.ImageBank(split.images)
    cpu = loader.TrainBatches(bank, split.labels, PRE, batch_size=12, seed=5)
    device = loader.DeviceTrainBatches(bank, split.labels, PRE, batch_size=12, seed=5)
    for step in (0, 7):
        images, labels = cpu[step]
        canvas, sizes, boxes, flips, device_labels = device[step]
        assert torch.equal(labels, device_labels)
        # The draws, replayed independently: per image a box, then a flip, from one generator.
        rng = np.random.default_rng([5, 1, step])
        for index in range(12):
            top, left, h, w = loader.random_resized_crop_box(rng, 32, 32)
            assert boxes[index].tolist() == [left, top, left + w, top + h]
            assert bool(flips[index]) == (rng.random() < 0.5)
        crops = loader.augment_on_device(canvas, sizes, boxes, flips, PRE.input_size)
        assert crops.dtype == torch.uint8 and crops.shape == images.shape
        # Same boxes and flips, other interpolation (bilinear vs antialiased bicubic).
        assert (crops.float() - images.float()).abs().mean() < 12


def test_mixed_sizes_never_sample_the_padding() -> None:
    rng = np.random.default_rng(1)
    images = [
        torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
        for h, w in ((20, 30), (32, 16), (20, 30))
    ]
    canvas, sizes = loader.pad_to_canvas(images)
    assert canvas.shape == (3, 3, 32, 30) and sizes.tolist() == [[20, 30], [32, 16], [20, 30]]
    boxes = torch.tensor([[10.0, 4.0, 30.0, 20.0], [0.0, 16.0, 16.0, 32.0], [0, 0, 30, 20.0]])
    flips = torch.tensor([False, True, False])
    batch = loader.augment_on_device(canvas, sizes, boxes, flips, 24)
    for index, image in enumerate(images):
        alone = loader.augment_on_device(
            image[None], sizes[index : index + 1], boxes[index : index + 1],
            flips[index : index + 1], 24,
        )  # fmt: skip
        assert torch.equal(batch[index], alone[0])


def test_augment_setting(tiny_spec: TimmSpec) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not augment_on_device(full_settings(tiny_spec).training, cpu)
    assert augment_on_device(full_settings(tiny_spec).training, cuda)
    assert augment_on_device(full_settings(tiny_spec, augment="device").training, cpu)
    assert not augment_on_device(full_settings(tiny_spec, augment="cpu").training, cuda)
    with pytest.raises(ValueError, match=r"--augment \(finetune.augment\)"):
        bad = full_settings(tiny_spec, augment="gpu")
        check_runs([bad.run], bad.training)


def test_run_with_device_augmentation(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    settings = full_settings(tiny_spec, augment="device")
    summary = train(settings.run, settings.training, demo_dataset, tmp_path / "run")
    assert summary["status"] == "completed" and summary["final_step"] == 4
    assert 0 <= summary["test_accuracy"] <= 1


def test_tf32_runs_as_fp32_on_a_cpu(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    # tf32 switches only CUDA matmuls: a CPU run is fp32 bit for bit, and records tf32.
    frames = {}
    for precision in ("fp32", "tf32"):
        settings = full_settings(tiny_spec, precision=precision, steps=3, val_every=3)
        summary = train(settings.run, settings.training, demo_dataset, tmp_path / precision)
        assert summary["status"] == "completed"
        assert summary["settings"]["precision"] == precision
        frames[precision] = pl.read_parquet(tmp_path / precision / "metrics.parquet")
    assert frames["fp32"].equals(frames["tf32"])


def test_tf32_switches_cuda_matmuls_for_the_block_only() -> None:
    # What a GPU step sees inside the block (the flag is readable without a GPU).
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with tf32_matmuls():
        assert matmul.fp32_precision == "tf32"
    assert matmul.fp32_precision == before
    with autocast(torch.device("cpu"), "tf32"):
        assert matmul.fp32_precision == before  # a CPU block leaves CUDA's setting alone
