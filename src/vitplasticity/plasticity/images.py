"""The workflow's ``plasticity`` stage: a model's config entry, a reference set file and a
prepared dataset in, a :class:`~vitplasticity.plasticity.summary.Measurement` out.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import polars as pl
import torch

from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.data.reference import read_reference_images
from vitplasticity.data.store import read_split
from vitplasticity.data.transforms import decoded_batches
from vitplasticity.models.architectures import architecture_for
from vitplasticity.models.build import build_model, check_inputs, pick_device, preprocessing
from vitplasticity.models.spec import ModelSpec
from vitplasticity.plasticity.measured_model import MeasuredModel, measured_model
from vitplasticity.plasticity.protocols import fc1_mode_matters
from vitplasticity.plasticity.settings import PlasticitySettings
from vitplasticity.plasticity.summary import Measurement, measurement
from vitplasticity.settings.declaration import check_settings, recorded_settings
from vitplasticity.utils.progress import ProgressReporter

log = logging.getLogger(__name__)


def measure_dataset(
    model_name: str,
    model_spec: dict[str, Any],
    reference: str | Path,
    dataset_dir: str | Path,
    settings: PlasticitySettings,
) -> Measurement:
    """The plasticity of model ``model_name`` (its config entry ``model_spec``) between a
    reference set file and a prepared downstream dataset: the ``plasticity`` stage.

    Pair i is reference image i with downstream image i mod the split's size; images are
    decoded a batch ahead by a few threads.

    Raises:
        ValueError: for a bad setting (naming its CLI flag and config key), a reference set
            with fewer than ``n_pairs`` images or an empty split, before the model is built.
        FileNotFoundError: for a missing reference set or dataset.
    """
    # Every input is checked before the model is built or an image decoded.
    settings = check_settings(settings)
    spec = ModelSpec.from_config(model_spec)
    images, cycled, n_downstream = _paired_images(reference, dataset_dir, settings)
    target = pick_device(settings.device)
    dataset = Path(dataset_dir).name

    measured = measured_model(
        spec,
        settings.stream,
        target,
        getattr(torch, settings.dtype),
        lambda: build_model(spec, num_classes=0).eval(),
    )
    model = measured.model
    check_inputs(model, spec, "images")  # the built model's, or the streamed skeleton's
    architecture = architecture_for(model)
    gated = fc1_mode_matters(architecture, architecture.blocks(model))  # refusals named here
    pre = preprocessing(model, spec)
    label = (model_name, dataset)
    pairs = _measure_pairs(measured, pre, (images, cycled), settings, label, n_downstream, target)
    recorded = {
        "model_spec": model_spec,
        "reference": str(reference),
        "dataset_dir": str(dataset_dir),
        **_recorded(settings, gated),
        "streamed": measured.streamed is not None,
        "preprocessing": asdict(pre),
    }
    named = {"model": model_name, "dataset": dataset}
    return measurement(pairs, **named, settings=recorded, device=target, demo=settings.demo)


def _measure_pairs(
    measured: MeasuredModel,
    pre: Preprocessing,
    images: tuple[list[bytes], list[bytes]],
    settings: PlasticitySettings,
    label: tuple[str, str],
    n_downstream: int,
    device: torch.device,
) -> pl.DataFrame:
    """The per-pair plasticity of the ``measured`` model (on ``device``) over the encoded ``images``
    (reference, downstream cycled from a split of ``n_downstream``), decoded a batch ahead;
    ``label`` (model, dataset) names them in the log and the progress line."""
    reference, downstream = images
    log.info(
        "%s on %s (%s, %d images, cycled to %d): protocols %s, %s on %s",
        *label,
        settings.split,
        n_downstream,
        settings.n_pairs,
        ", ".join(settings.protocols),
        settings.dtype,
        device,
    )
    with ProgressReporter(settings.n_pairs, f"plasticity {'/'.join(label)}") as progress:
        return measured.measure(
            decoded_batches(reference, pre, settings.batch_size),
            decoded_batches(downstream, pre, settings.batch_size),
            protocols=settings.protocols,
            batch_size=settings.batch_size,
            n_pairs=settings.n_pairs,
            progress=progress,
            fc1=settings.fc1,
        )


def _recorded(settings: PlasticitySettings, gated: bool) -> dict[str, Any]:
    """The settings as the provenance records them: ``fc1`` only for a model with a gated MLP
    (what its FC1 measured; a plain MLP has one fc1 whatever the mode)."""
    recorded = recorded_settings(settings, leave_out=("demo", "fc1"))
    return {**recorded, "fc1": settings.fc1} if gated else recorded


def _paired_images(
    reference: str | Path, dataset_dir: str | Path, settings: PlasticitySettings
) -> tuple[list[bytes], list[bytes], int]:
    """The encoded images of the ``n_pairs`` pairs: (reference images, downstream images),
    and how many images the downstream split holds.

    Pair i is reference i with downstream i mod len(downstream), cycled here by reference so
    that every image is decoded only when its batch comes up.

    Raises:
        ValueError: for fewer reference images than pairs, or an empty split.
        FileNotFoundError: for a missing reference set or dataset.
    """
    n_pairs = settings.n_pairs
    images = read_reference_images(reference)
    if len(images) < n_pairs:
        raise ValueError(
            f"{reference}: {len(images)} reference images, fewer than --n-pairs {n_pairs}"
        )
    downstream = read_split(dataset_dir, settings.split)
    if len(downstream) == 0:
        raise ValueError(f"{dataset_dir}: split {settings.split!r} holds no images")
    cycled = [downstream.images[i % len(downstream)] for i in range(n_pairs)]
    return images[:n_pairs], cycled, len(downstream)
