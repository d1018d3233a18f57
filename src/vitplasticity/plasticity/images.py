"""The workflow's ``plasticity`` stage: a model's config entry, a reference set file and a
prepared dataset in, a :class:`~vitplasticity.plasticity.summary.Measurement` out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from vitplasticity.data.reference import read_reference_images
from vitplasticity.data.store import read_split
from vitplasticity.data.transforms import decoded_batches
from vitplasticity.models.architectures import architecture_for
from vitplasticity.models.architectures.base import check_fc1_mode
from vitplasticity.models.build import build_model, pick_device, preprocessing
from vitplasticity.models.spec import ModelSpec
from vitplasticity.plasticity.measure import measure_protocols
from vitplasticity.plasticity.protocols import check_protocols, fc1_mode_matters
from vitplasticity.plasticity.summary import Measurement, measurement
from vitplasticity.utils.progress import ProgressReporter

log = logging.getLogger(__name__)


def measure_dataset(
    model_name: str,
    model_spec: dict[str, Any],
    reference: str | Path,
    dataset_dir: str | Path,
    *,
    split: str = "test",
    protocols: Sequence[str] = ("embedding",),
    n_pairs: int,
    batch_size: int = 64,
    device: str = "auto",
    dtype: str = "float32",
    fc1: str = "stage",
    demo: bool = False,
) -> Measurement:
    """The plasticity of model ``model_name`` (its config entry ``model_spec``) between a
    reference set file and a prepared downstream dataset: the ``plasticity`` stage.

    Pair i is reference image i with downstream image i mod the split's size; images are
    decoded a batch ahead by a few threads.

    Raises:
        ValueError: for a bad argument (naming its CLI flag), a reference set with fewer
            than ``n_pairs`` images or an empty split, before the model is built.
        FileNotFoundError: for a missing reference set or dataset.
    """
    # Every input is checked before the model is built or an image decoded.
    protocols = check_protocols(protocols)
    fc1 = check_fc1_mode(fc1)
    if n_pairs < 1:
        raise ValueError(f"--n-pairs must be >= 1, got {n_pairs}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    spec = ModelSpec.from_config(model_spec)
    images = read_reference_images(reference)
    if len(images) < n_pairs:
        raise ValueError(
            f"{reference}: {len(images)} reference images, fewer than --n-pairs {n_pairs}"
        )
    downstream = read_split(dataset_dir, split)
    if len(downstream) == 0:
        raise ValueError(f"{dataset_dir}: split {split!r} holds no images")
    target = pick_device(device)
    dataset = Path(dataset_dir).name

    model = build_model(spec, num_classes=0).eval()
    architecture = architecture_for(model)
    gated = fc1_mode_matters(architecture, architecture.blocks(model))  # refusals named here
    model = model.to(device=target, dtype=getattr(torch, dtype))
    pre = preprocessing(model, spec)
    # Pair i: reference i with downstream i mod len(downstream), cycled here by reference so
    # that every image is decoded only when its batch comes up.
    cycled = [downstream.images[i % len(downstream)] for i in range(n_pairs)]
    log.info(
        "%s on %s (%s, %d images, cycled to %d): protocols %s, %s on %s",
        model_name,
        dataset,
        split,
        len(downstream),
        n_pairs,
        ", ".join(protocols),
        dtype,
        target,
    )
    with ProgressReporter(n_pairs, f"plasticity {model_name}/{dataset}") as progress:
        pairs = measure_protocols(
            model,
            decoded_batches(images[:n_pairs], pre, batch_size),
            decoded_batches(cycled, pre, batch_size),
            protocols=protocols,
            batch_size=batch_size,
            n_pairs=n_pairs,
            progress=progress,
            fc1=fc1,
        )
    settings: dict[str, Any] = {
        "model_spec": model_spec,
        "reference": str(reference),
        "dataset_dir": str(dataset_dir),
        "split": split,
        "protocols": list(protocols),
        "n_pairs": n_pairs,
        "batch_size": batch_size,
        "device": device,
        "dtype": dtype,
        "preprocessing": asdict(pre),
    }
    if gated:  # what FC1 measured; a plain MLP has one fc1 whatever the mode
        settings["fc1"] = fc1
    return measurement(
        pairs, model=model_name, dataset=dataset, settings=settings, device=target, demo=demo
    )
