"""The ``recommend`` stage: read a prepared dataset and a reference set, build the model,
measure every criterion (:mod:`.criteria`), rank and choose (:mod:`.ranking`), and write the
report, table and figure. The ``vitplasticity recommend`` command only parses its flags and
calls :func:`recommend` and :func:`write_outputs`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import polars as pl
import torch

from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.data.reference import read_reference_images
from vitplasticity.data.store import Split, encode_png, read_meta, read_split
from vitplasticity.data.transforms import decoded_batches
from vitplasticity.models.architectures import ParameterMap, UnsupportedModel, architecture_for
from vitplasticity.models.build import build_model, pick_device, preprocessing
from vitplasticity.models.spec import ModelSpec
from vitplasticity.provenance import provenance
from vitplasticity.recommend.criteria import (
    CRITERIA,
    Measurements,
    configuration_components,
    measure_criteria,
)
from vitplasticity.recommend.export import build_export
from vitplasticity.recommend.ranking import (
    Recommendation,
    markdown,
    rank_and_choose,
)
from vitplasticity.settings.stages import (
    DTYPES,
    REFERENCE_FALLBACKS,
    RecommendImageSettings,
)
from vitplasticity.utils.io import atomic_path, write_json, write_parquet
from vitplasticity.utils.progress import ProgressReporter

log = logging.getLogger(__name__)

_DECLARED = RecommendImageSettings()

_FALLBACK_CAVEAT = (
    "not the paper's ImageNet reference: plasticity then measures how the components respond "
    "to the difference between {what} and the downstream images, not the shift from "
    "pretraining data"
)
_SYNTHETIC_CLASSES = 8


@dataclass(frozen=True)
class RecommendSettings:
    """The settings of one recommendation; each field is the CLI flag of that name. The
    defaults are the declared ones (:class:`vitplasticity.settings.stages.RecommendImageSettings`);
    ``budget`` here is parsed into a number of parameters."""

    model: str
    dataset: str
    model_spec: ModelSpec
    reference: str | None = None
    reference_fallback: str | None = None
    n_pairs: int = _DECLARED.n_pairs
    batch_size: int = _DECLARED.batch_size
    batches: int = _DECLARED.batches
    warmup_steps: int = _DECLARED.warmup_steps
    warmup_lr: float = _DECLARED.warmup_lr
    budget: int | None = None
    criterion: str = _DECLARED.criterion
    combine: bool = _DECLARED.combine
    configurations: tuple[str, ...] = _DECLARED.configurations
    seed: int = _DECLARED.seed
    device: str = _DECLARED.device
    dtype: str = "float32"
    demo: bool = _DECLARED.demo

    def validate(self) -> None:
        """Check every value before any compute.

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
        check_ranking(self.configurations, self.criterion, self.budget, self.combine)
        for flag, value, least in (
            ("--n-pairs", self.n_pairs, 1),
            ("--batch-size", self.batch_size, 1),
            ("--batches", self.batches, 2),
            ("--warmup-steps", self.warmup_steps, 0),
            ("--seed", self.seed, 0),
        ):
            if value < least:
                raise ValueError(f"{flag} must be >= {least}, got {value}")
        if not self.warmup_lr > 0:
            raise ValueError(f"--warmup-lr must be > 0, got {self.warmup_lr}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: {self.dtype!r} not float32 or float64")


@dataclass(frozen=True)
class Result:
    """A recommendation and what it was made from."""

    settings: RecommendSettings
    table: pl.DataFrame
    recommendation: Recommendation
    measurements: Measurements
    reference_label: str
    """The reference set in words (a fallback says so and why it differs from the paper)."""
    record: dict[str, Any]
    """The resolved settings and provenance, for the Parquet footer."""
    export: dict[str, Any]
    """The decision as data that applies without vitplasticity (:mod:`.export`)."""


def check_ranking(
    configurations: Sequence[str], criterion: str, budget: int | None, combine: bool
) -> None:
    """Check what both recommends (images, text) rank and how they choose, naming the flag.

    Raises:
        ValueError: for no configuration, one not made of the five components or named twice,
            an unknown criterion, a negative budget, or --combine without a budget.
    """
    if not configurations:
        raise ValueError("--configurations: none given")
    for configuration in configurations:
        try:
            configuration_components(configuration)
        except ValueError as error:
            raise ValueError(f"--configurations: {error}") from None
    if len(set(configurations)) != len(configurations):
        raise ValueError(
            f"--configurations: a configuration is named twice: {list(configurations)}"
        )
    if criterion not in CRITERIA:
        raise ValueError(f"--criterion: {criterion!r} not one of {', '.join(CRITERIA)}")
    if budget is not None and budget < 0:
        raise ValueError(f"--budget must be >= 0, got {budget}")
    if combine and budget is None:
        raise ValueError("--combine needs --budget (without one the union is every component)")


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


def _reference_images(settings: RecommendSettings, pool: Split) -> tuple[list[bytes] | None, str]:
    """The reference images (None for the synthetic fallback, which is drawn at the model's
    resolution once the model is built) and how the outputs name them.

    Raises:
        ValueError: when the reference set holds fewer images than --n-pairs.
    """
    if settings.reference_fallback == "synthetic":
        label = f"fallback `synthetic` ({_FALLBACK_CAVEAT.format(what='generated images')})"
        return None, label
    if settings.reference is not None:
        images = read_reference_images(settings.reference)
        source = f"--reference {settings.reference}"
        label = f"`{Path(settings.reference).name}` ({len(images):,} images)"
    else:
        images, source = pool.images, "--reference-fallback pool"
        label = f"fallback `pool` ({_FALLBACK_CAVEAT.format(what='images of the same dataset')})"
    if len(images) < settings.n_pairs:
        raise ValueError(
            f"{source}: {len(images)} reference images, fewer than --n-pairs {settings.n_pairs}"
        )
    return images[: settings.n_pairs], label


def _synthetic_reference(n: int, pre: Preprocessing, seed: int) -> list[bytes]:
    """``n`` generated palette images at the model's input size, PNG-encoded."""
    from vitplasticity.data.synthetic import synthetic_images

    pixels, _ = synthetic_images("palette", _SYNTHETIC_CLASSES, n, pre.input_size, seed)
    return [encode_png(image) for image in pixels]


def recommend(settings: RecommendSettings, dataset_dir: str | os.PathLike[str]) -> Result:
    """Measure, rank and choose for ``settings.model`` on the prepared dataset ``dataset_dir``.

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
    settings.validate()
    pool, test, num_classes = read_dataset(dataset_dir)
    reference, reference_label = _reference_images(settings, pool)
    device = pick_device(settings.device)
    dtype = getattr(torch, settings.dtype)
    model = _checked_model(settings, num_classes, device, dtype)
    pre = preprocessing(model, settings.model_spec)
    if reference is None:
        reference = _synthetic_reference(settings.n_pairs, pre, settings.seed)
    measurements = _measure(settings, model, pre, reference, pool, test, device, dtype)
    table, recommendation, configurations = rank(settings, measurements)
    resolved = {
        **asdict(settings),
        "dataset_dir": str(dataset_dir),
        "protocol": "embedding",
        "configurations": configurations,
        "preprocessing": asdict(pre),
    }
    record = footer_record(
        settings, resolved, device, reference_label, recommendation, measurements
    )
    export = build_export(
        model,
        recommendation.configuration,
        model_name=settings.model,
        model_entry=asdict(settings.model_spec),
        dataset=settings.dataset,
        recommendation=asdict(recommendation),
    )
    return Result(settings, table, recommendation, measurements, reference_label, record, export)


class RankingSettings(Protocol):
    """What :func:`rank` and :func:`footer_record` read of a recommend's settings (images:
    :class:`RecommendSettings`, text: :class:`.text.TextRecommendSettings`)."""

    @property
    def model(self) -> str: ...
    @property
    def dataset(self) -> str: ...
    @property
    def demo(self) -> bool: ...
    @property
    def configurations(self) -> tuple[str, ...]: ...
    @property
    def criterion(self) -> str: ...
    @property
    def budget(self) -> int | None: ...
    @property
    def combine(self) -> bool: ...


def rank(
    settings: RankingSettings, measurements: Measurements
) -> tuple[pl.DataFrame, Recommendation, list[str]]:
    """:func:`.ranking.rank_and_choose` of ``measurements`` with the configurations,
    criterion, budget and combine of ``settings``."""
    return rank_and_choose(
        measurements,
        settings.configurations,
        settings.criterion,
        settings.budget,
        settings.combine,
        model=settings.model,
        dataset=settings.dataset,
    )


def footer_record(
    settings: RankingSettings,
    resolved: dict[str, Any],
    device: torch.device,
    reference_label: str,
    recommendation: Recommendation,
    measurements: Measurements,
) -> dict[str, Any]:
    """The Parquet footer's record: provenance of the ``resolved`` settings, the decision and
    the parameters each component (and no component) trains."""
    return {
        "provenance": provenance(resolved, device),
        "model": settings.model,
        "dataset": settings.dataset,
        "demo": settings.demo,
        "reference": reference_label,
        "recommendation": asdict(recommendation),
        "always_trained_parameters": measurements.always_trained,
        "component_parameters": measurements.component_parameters,
    }


def _checked_model(
    settings: RecommendSettings, num_classes: int, device: torch.device, dtype: torch.dtype
) -> torch.nn.Module:
    """The model of ``settings`` with a ``num_classes`` head, in eval mode on ``device`` in
    ``dtype``, once its architecture accepts it for recommend.

    Raises:
        UnsupportedModel: for a model no architecture knows, one its architecture refuses to
            rank, or one with a parameter its architecture cannot account for.
    """
    spec = settings.model_spec
    # The seed draws the new head (as a finetuning run's seed does); a random-init backbone
    # has its own seed (models.init_seed).
    torch.manual_seed(settings.seed)
    model = build_model(spec, num_classes=num_classes).eval()
    architecture = architecture_for(model)
    refusal = architecture.refusal("recommend", model)
    if refusal is not None:
        raise UnsupportedModel(f"recommend {spec.model_id}: {refusal}")
    ParameterMap(architecture, model)  # names a missing component before any compute
    return model.to(device=device, dtype=dtype)


def _measure(
    settings: RecommendSettings,
    model: torch.nn.Module,
    pre: Preprocessing,
    reference: list[bytes],
    pool: Split,
    test: Split,
    device: torch.device,
    dtype: torch.dtype,
) -> Measurements:
    """Every criterion of ``model``: plasticity over the pairs (reference image i, test image
    i cycled), then the head warm-up and the gradient batches drawn from the pool."""
    n = settings.n_pairs
    cycled = [test.images[i % len(test)] for i in range(n)]
    log.info(
        "%s on %s: %d pairs, %d warm-up steps, %d gradient batches of %d, %s on %s",
        settings.model,
        settings.dataset,
        n,
        settings.warmup_steps,
        settings.batches,
        settings.batch_size,
        settings.dtype,
        device,
    )

    def batches(steps: range) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return labelled_batches(pool, pre, settings.batch_size, steps, settings.seed, device, dtype)

    warmup = range(settings.warmup_steps)
    gradients = range(settings.warmup_steps, settings.warmup_steps + settings.batches)
    with ProgressReporter(n, f"plasticity {settings.model}/{settings.dataset}") as progress:
        return measure_criteria(
            model,
            decoded_batches(reference, pre, settings.batch_size),
            decoded_batches(cycled, pre, settings.batch_size),
            batches(warmup),
            batches(gradients),
            n_pairs=n,
            warmup_lr=settings.warmup_lr,
            batch_size=settings.batch_size,
            progress=progress,
        )


def write_outputs(result: Result, prefix: str | os.PathLike[str]) -> None:
    """Write ``prefix``.png/.pdf (figure), .md (report), .json (the decision with its
    parameter names and PEFT configs) and .parquet (table, with the record in its footer),
    each atomically."""
    from vitplasticity.recommend.figure import save_figure
    from vitplasticity.report.style import DEMO_NOTE

    settings = result.settings
    # matplotlib's PDF backend has fontTools log every subset font at INFO.
    logging.getLogger("fontTools").setLevel(logging.WARNING)
    save_figure(
        result.table,
        result.recommendation,
        [f"{prefix}.png", f"{prefix}.pdf"],
        title=f"Which components to finetune? {settings.model} on {settings.dataset}",
        demo=settings.demo,
    )
    text = markdown(
        result.table,
        result.recommendation,
        model=settings.model,
        dataset=settings.dataset,
        reference=result.reference_label,
        always_trained=result.measurements.always_trained,
        demo=settings.demo,
        demo_note=DEMO_NOTE,
    )
    with atomic_path(f"{prefix}.md") as tmp:
        tmp.write_text(text)
    write_json(f"{prefix}.json", result.export)
    write_parquet(f"{prefix}.parquet", result.table, result.record)
    log.info("wrote %s.{md,json,parquet,png,pdf}: %s", prefix, result.recommendation)
