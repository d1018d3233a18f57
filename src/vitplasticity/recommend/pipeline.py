"""The ``recommend`` stage: read a prepared dataset and a reference set, build the model,
measure every criterion (:mod:`.criteria`), rank and choose (:mod:`.ranking`), and write the
report, table and figure. The ``vitplasticity recommend`` command only parses its flags and
calls :func:`recommend` and :func:`write_outputs`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import torch

from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.data.reference import read_reference_images
from vitplasticity.data.store import Split, encode_png, read_meta, read_split
from vitplasticity.data.transforms import decoded_batches
from vitplasticity.models.architectures import ParameterMap, UnsupportedModel, architecture_for
from vitplasticity.models.build import build_model, pick_device, preprocessing
from vitplasticity.models.spec import ModelSpec
from vitplasticity.plasticity.measured_model import MeasuredModel, measured_model
from vitplasticity.provenance import provenance
from vitplasticity.recommend.criteria import Measurements, measure_criteria
from vitplasticity.recommend.export import build_export
from vitplasticity.recommend.ranking import (
    Recommendation,
    check_ranking,
    markdown,
    rank_and_choose,
    undefined_notes,
)
from vitplasticity.recommend.settings import (
    REFERENCE_FALLBACKS,
    RecommendImageSettings,
    RecommendTextSettings,
    check_dtype,
)
from vitplasticity.recommend.streamed import (
    check_streamed_criterion,
    measure_streamed_criteria,
    streamed_note,
)
from vitplasticity.settings.declaration import check_settings, recorded_settings
from vitplasticity.utils.io import atomic_path, write_json, write_parquet
from vitplasticity.utils.progress import ProgressReporter

if TYPE_CHECKING:
    from vitplasticity.recommend.text_inputs import TextResult

log = logging.getLogger(__name__)

_FALLBACK_CAVEAT = (
    "not the paper's ImageNet reference: plasticity then measures how the components respond "
    "to the difference between {what} and the downstream images, not the shift from "
    "pretraining data"
)
_SYNTHETIC_CLASSES = 8


@dataclass(frozen=True)
class RecommendInputs:
    """What one image recommendation is of, beside its declared settings
    (:class:`~vitplasticity.recommend.settings.RecommendImageSettings`): the model, the names
    the outputs give it and the dataset, the reference set, and the compute dtype (a flag the
    workflow leaves at float32, so no config key). Each field is the CLI flag of that name."""

    model: str
    dataset: str
    model_spec: ModelSpec
    reference: str | None = None
    reference_fallback: str | None = None
    dtype: str = "float32"

    def validate(self) -> None:
        """Check the reference set and the dtype before any compute.

        Raises:
            ValueError: naming the CLI flag of the first bad value.
            FileNotFoundError: for a reference set that does not exist.
        """
        if (self.reference is None) == (self.reference_fallback is None):
            raise ValueError("--reference / --reference-fallback: give exactly one")
        if self.reference_fallback not in (None, *REFERENCE_FALLBACKS):
            raise ValueError(
                f"--reference-fallback: {self.reference_fallback!r} not one of "
                f"{', '.join(REFERENCE_FALLBACKS)}"
            )
        if self.reference is not None and not Path(self.reference).is_file():
            raise FileNotFoundError(f"--reference: reference set not found: {self.reference}")
        check_dtype(self.dtype)


@dataclass(frozen=True)
class Result:
    """A recommendation and what it was made from."""

    inputs: RecommendInputs
    settings: RecommendImageSettings
    table: pl.DataFrame
    recommendation: Recommendation
    measurements: Measurements
    reference_label: str
    """The reference set in words (a fallback says so and why it differs from the paper)."""
    record: dict[str, Any]
    """The resolved settings and provenance, for the Parquet footer."""
    export: dict[str, Any]
    """The decision as data that applies without vitplasticity (:mod:`.export`)."""
    notes: tuple[str, ...] = ()
    """What the report says below the table beyond its own text (a text model's data, loss
    and head)."""


def checked_settings(
    inputs: RecommendInputs, settings: RecommendImageSettings
) -> RecommendImageSettings:
    """``settings`` checked and converted (:func:`check_settings`, the budget a number), after
    checking ``inputs`` and what the ranking needs of them together (:func:`check_ranking`).

    Raises:
        ValueError: naming the CLI flag of the first bad value.
        FileNotFoundError: for a reference set that does not exist.
    """
    inputs.validate()
    settings = check_settings(settings)
    check_ranking(settings)
    return settings


def read_dataset(dataset_dir: str | os.PathLike[str]) -> tuple[Split, Split, int]:
    """(pool, test, num_classes) of a prepared dataset.

    Raises:
        FileNotFoundError: when it is not a prepared dataset.
        ValueError: for an empty pool or test split, or fewer than 2 classes.
    """
    meta = read_meta(dataset_dir)
    pool, test = read_split(dataset_dir, "pool"), read_split(dataset_dir, "test")
    for name, split in (("pool", pool), ("test", test)):
        if not len(split):
            raise ValueError(f"{dataset_dir}: split {name!r} holds no images")
    num_classes = int(meta["num_classes"])
    if num_classes < 2:
        raise ValueError(f"{dataset_dir}: {num_classes} class; gradients need >= 2")
    return pool, test, num_classes


def labelled_batches(
    split: Split,
    pre: Preprocessing,
    batch_size: int,
    steps: range,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Eval-preprocessed (images, labels) batches of ``split`` for ``steps``: the batch of
    step s is :func:`vitplasticity.data.loader.batch_indices` (seeded epochs, no
    augmentation, so the criteria are deterministic)."""
    from vitplasticity.data.loader import batch_indices
    from vitplasticity.data.transforms import eval_image, normalize

    for step in steps:
        indices = batch_indices(step, batch_size, len(split), seed)
        images = normalize(torch.stack([eval_image(split.images[i], pre) for i in indices]), pre)
        labels = torch.as_tensor(split.labels[indices], dtype=torch.int64)
        yield images.to(device=device, dtype=dtype), labels.to(device)


def _reference_images(
    inputs: RecommendInputs, n_pairs: int, pool: Split
) -> tuple[list[bytes] | None, str]:
    """The first ``n_pairs`` reference images (None for the synthetic fallback, which is drawn
    at the model's resolution once the model is built) and how the outputs name them.

    Raises:
        ValueError: when the reference set holds fewer images than --n-pairs.
    """
    if inputs.reference_fallback == "synthetic":
        label = f"fallback `synthetic` ({_FALLBACK_CAVEAT.format(what='generated images')})"
        return None, label
    if inputs.reference is not None:
        images = read_reference_images(inputs.reference)
        source = f"--reference {inputs.reference}"
        label = f"`{Path(inputs.reference).name}` ({len(images):,} images)"
    else:
        images, source = pool.images, "--reference-fallback pool"
        label = f"fallback `pool` ({_FALLBACK_CAVEAT.format(what='images of the same dataset')})"
    if len(images) < n_pairs:
        raise ValueError(
            f"{source}: {len(images)} reference images, fewer than --n-pairs {n_pairs}"
        )
    return images[:n_pairs], label


def _synthetic_reference(n: int, pre: Preprocessing, seed: int) -> list[bytes]:
    """``n`` generated palette images at the model's input size, PNG-encoded."""
    from vitplasticity.data.synthetic import synthetic_images

    pixels, _ = synthetic_images("palette", _SYNTHETIC_CLASSES, n, pre.input_size, seed)
    return [encode_png(image) for image in pixels]


def recommend(
    inputs: RecommendInputs,
    settings: RecommendImageSettings,
    dataset_dir: str | os.PathLike[str],
) -> Result:
    """Measure, rank and choose for ``inputs.model`` on the prepared dataset ``dataset_dir``.

    The plasticity pairs are reference image i with test image i (cycled); the head warm-up
    and the gradient batches come from the pool split. Every input is checked before the
    model is built.

    Raises:
        ValueError: for a bad setting (naming its flag), an empty split, or too few reference
            images.
        UnsupportedModel: for a model no architecture knows (naming its class and the known
            families), one its architecture refuses to rank, or one with a parameter its
            architecture cannot account for.
        FileNotFoundError: for a missing dataset or reference set.
    """
    settings = checked_settings(inputs, settings)
    pool, test, num_classes = read_dataset(dataset_dir)
    reference, reference_label = _reference_images(inputs, settings.n_pairs, pool)
    device = pick_device(settings.device)
    dtype = getattr(torch, inputs.dtype)
    measured = _checked_model(inputs, settings, num_classes, device, dtype)
    pre = preprocessing(measured.model, inputs.model_spec)
    if reference is None:
        reference = _synthetic_reference(settings.n_pairs, pre, settings.seed)
    measurements = _measure(inputs, settings, measured, pre, reference, (pool, test), device, dtype)
    named = {"model": inputs.model, "dataset": inputs.dataset}
    table, recommendation, configurations = rank(settings, measurements, **named)
    resolved = {
        **asdict(inputs),
        **recorded_settings(settings, leave_out=()),
        "dataset_dir": str(dataset_dir),
        "protocol": "embedding",
        "configurations": configurations,
        "preprocessing": asdict(pre),
        "streamed": measured.streamed is not None,
    }
    record = footer_record(
        settings, resolved, device, reference_label, recommendation, measurements, **named
    )
    export = _export(inputs, measured.model, recommendation, measurements)
    notes = (streamed_note(measured.why),) if measured.streamed is not None else ()
    return Result(
        inputs,
        settings,
        table,
        recommendation,
        measurements,
        reference_label,
        record,
        export,
        notes,
    )


def _export(
    inputs: RecommendInputs,
    model: torch.nn.Module,
    recommendation: Recommendation,
    measurements: Measurements,
) -> dict[str, Any]:
    """The decision as data that applies without vitplasticity (:func:`.export.build_export`)."""
    return build_export(
        model,
        recommendation.configuration,
        model_name=inputs.model,
        model_entry=asdict(inputs.model_spec),
        dataset=inputs.dataset,
        recommendation=asdict(recommendation),
        matrices=measurements.matrices,
    )


def rank(
    settings: RecommendImageSettings | RecommendTextSettings,
    measurements: Measurements,
    *,
    model: str,
    dataset: str,
) -> tuple[pl.DataFrame, Recommendation, list[str]]:
    """:func:`.ranking.rank_and_choose` of ``measurements`` (of ``model`` on ``dataset``, as
    the outputs name them) with the configurations, criterion, budget and combine of either
    recommend's ``settings`` (checked: the budget a number)."""
    return rank_and_choose(
        measurements,
        settings.configurations,
        settings.criterion,
        settings.budget,
        settings.combine,
        model=model,
        dataset=dataset,
    )


def footer_record(
    settings: RecommendImageSettings | RecommendTextSettings,
    resolved: dict[str, Any],
    device: torch.device,
    reference_label: str,
    recommendation: Recommendation,
    measurements: Measurements,
    *,
    model: str,
    dataset: str,
) -> dict[str, Any]:
    """The Parquet footer's record of a recommendation of ``model`` on ``dataset``:
    provenance of the ``resolved`` settings, the demo label of ``settings``, the decision and
    the parameters each component (and no component) trains."""
    return {
        "provenance": provenance(resolved, device),
        "model": model,
        "dataset": dataset,
        "demo": settings.demo,
        "reference": reference_label,
        "recommendation": asdict(recommendation),
        "always_trained_parameters": measurements.always_trained,
        "component_parameters": measurements.component_parameters,
    }


def _checked_model(
    inputs: RecommendInputs,
    settings: RecommendImageSettings,
    num_classes: int,
    device: torch.device,
    dtype: torch.dtype,
) -> MeasuredModel:
    """The model of ``inputs`` with a ``num_classes`` head drawn from the settings' seed, in
    eval mode on ``device`` in ``dtype``, or streamed from its checkpoint as
    ``settings.stream`` decides (a streamed model's head stays unmeasured), once its
    architecture accepts it for recommend and the ranking's criterion is one it measures.

    Raises:
        UnsupportedModel: for a model no architecture knows, one its architecture refuses to
            rank, or one with a parameter its architecture cannot account for.
        ValueError: for a streamed model ranked by a criterion it leaves n/a.
    """
    spec = inputs.model_spec
    # The seed draws the new head (as a finetuning run's seed does); a random-init backbone
    # has its own seed (models.init_seed).
    torch.manual_seed(settings.seed)
    measured = measured_model(
        spec,
        settings.stream,
        device,
        dtype,
        lambda: build_model(spec, num_classes=num_classes).eval(),
        num_classes,
    )
    model = measured.model
    architecture = architecture_for(model)
    refusal = architecture.refusal("recommend", model)
    if refusal is not None:
        raise UnsupportedModel(f"recommend {spec.model_id}: {refusal}")
    ParameterMap(architecture, model)  # names a missing component before any compute
    if measured.streamed is not None:
        check_streamed_criterion(settings.criterion, measured.why)
    return measured


def _measure(
    inputs: RecommendInputs,
    settings: RecommendImageSettings,
    measured: MeasuredModel,
    pre: Preprocessing,
    reference: list[bytes],
    splits: tuple[Split, Split],
    device: torch.device,
    dtype: torch.dtype,
) -> Measurements:
    """Every criterion of the ``measured`` model: plasticity over the pairs (reference image
    i, test image i cycled), then the head warm-up and the gradient batches drawn from the
    pool (``splits``: pool, test); of a streamed model, what it gives block by block
    (:func:`.streamed.measure_streamed_criteria`)."""
    pool, test = splits
    n = settings.n_pairs
    cycled = [test.images[i % len(test)] for i in range(n)]
    log.info(
        "%s on %s: %d pairs, %d warm-up steps, %d gradient batches of %d, %s on %s",
        inputs.model,
        inputs.dataset,
        n,
        settings.warmup_steps,
        settings.batches,
        settings.batch_size,
        inputs.dtype,
        device,
    )

    def batches(steps: range) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return labelled_batches(pool, pre, settings.batch_size, steps, settings.seed, device, dtype)

    warmup = range(settings.warmup_steps)
    gradients = range(settings.warmup_steps, settings.warmup_steps + settings.batches)
    with ProgressReporter(n, f"plasticity {inputs.model}/{inputs.dataset}") as progress:
        if measured.streamed is not None:
            measurements = measure_streamed_criteria(
                measured.streamed,
                decoded_batches(reference, pre, settings.batch_size),
                decoded_batches(cycled, pre, settings.batch_size),
                n_pairs=n,
                batch_size=settings.batch_size,
                progress=progress,
            )
        else:
            measurements = measure_criteria(
                measured.model,
                decoded_batches(reference, pre, settings.batch_size),
                decoded_batches(cycled, pre, settings.batch_size),
                batches(warmup),
                batches(gradients),
                n_pairs=n,
                warmup_lr=settings.warmup_lr,
                batch_size=settings.batch_size,
                progress=progress,
            )
    measurements.check_finite(f"recommend criteria of model {inputs.model!r} on {inputs.dataset}")
    return measurements


def write_outputs(result: Result | TextResult, prefix: str | os.PathLike[str]) -> None:
    """Write ``prefix``.png/.pdf (figure), .md (report, with the result's notes), .json (the
    decision with its parameter names and PEFT configs) and .parquet (table, with the record
    in its footer), each atomically: the same files for an image and a text model."""
    from vitplasticity.recommend.figure import save_figure

    inputs = result.inputs
    # matplotlib's PDF backend has fontTools log every subset font at INFO.
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    save_figure(
        result.table,
        result.recommendation,
        [f"{prefix}.png", f"{prefix}.pdf"],
        title=f"Which components to finetune? {inputs.model} on {inputs.dataset}",
        demo=result.settings.demo,
    )
    write_report(result, prefix)
    log.info("wrote %s.{md,json,parquet,png,pdf}: %s", prefix, result.recommendation)


def write_report(result: Result | TextResult, prefix: str | os.PathLike[str]) -> None:
    """Write what both recommends write, each atomically: ``prefix``.md (the report, with the
    result's notes below it), .json (the decision with its parameter names and PEFT
    configs) and .parquet (the table, with the record in its footer)."""
    from vitplasticity.report.style import DEMO_NOTE

    text = markdown(
        result.table,
        result.recommendation,
        model=result.inputs.model,
        dataset=result.inputs.dataset,
        reference=result.reference_label,
        always_trained=result.measurements.always_trained,
        demo=result.settings.demo,
        demo_note=DEMO_NOTE,
    )
    measured = result.measurements
    notes = [*result.notes, *undefined_notes(measured.matrices, measured.features)]
    if notes:
        text = text.rstrip("\n") + "\n\n" + "\n\n".join(notes) + "\n"
    with atomic_path(f"{prefix}.md") as tmp:
        tmp.write_text(text)
    write_json(f"{prefix}.json", result.export)
    write_parquet(f"{prefix}.parquet", result.table, result.record)
