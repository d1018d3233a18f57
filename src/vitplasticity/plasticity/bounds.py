"""The workflow's ``bounds`` stage: a model's config entry, the reference set file and the
measured plasticity files in, the theoretical upper bounds of every component
(:mod:`vitplasticity.plasticity.upper_bounds`, paper Section 4) beside the measurements out.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl
import torch
from torch import nn

from vitplasticity.data.reference import read_reference_images
from vitplasticity.data.transforms import decoded_batches
from vitplasticity.models.architectures import Architecture
from vitplasticity.models.build import build_model, pick_device, preprocessing
from vitplasticity.models.spec import ModelSpec
from vitplasticity.plasticity.finite import check_finite_rows
from vitplasticity.plasticity.measure import PAIR_SCHEMA
from vitplasticity.plasticity.settings import BoundsSettings
from vitplasticity.plasticity.upper_bounds import (
    BOUND_SCHEMA,
    TokenStatistics,
    bound_rows,
    bounds_architecture,
    log_undefined,
    undefined_bounds,
)
from vitplasticity.provenance import provenance
from vitplasticity.settings.declaration import check_settings, recorded_settings
from vitplasticity.utils.io import TableKind, read_result_table
from vitplasticity.utils.progress import ProgressReporter

log = logging.getLogger(__name__)

COMPARED_PROTOCOL = "embedding"
"""The measurement the bounds are compared with: they are stated for the embedding protocol's
inputs (every component fed the embedding output)."""


PAIRS_TABLE = TableKind("a plasticity pairs file (plasticity --out)", PAIR_SCHEMA)
"""What the bounds stage reads of the plasticity stage (:data:`PAIR_SCHEMA`)."""

_MEASURED_SCHEMA: dict[str, pl.DataType] = {
    "measured_mean": pl.Float64(),
    "measured_max": pl.Float64(),
    "n_datasets": pl.UInt32(),
}

BOUNDS_TABLE = TableKind(
    "a bounds table (bounds --out)",
    {"model": pl.String(), **BOUND_SCHEMA, **_MEASURED_SCHEMA},
)
"""What :func:`model_bounds` gives: the model, its bounds, the plasticity measured there."""


def measured_plasticity(files: Sequence[str | os.PathLike[str]]) -> pl.DataFrame:
    """Mean and largest measured ratio per (block, component), pooled over ``files``.

    Only the embedding protocol's rows count; empty when no file has them.

    Raises:
        FileNotFoundError: naming a missing file.
        UnreadableFileError: naming a file that is not a plasticity pairs file (a column
            missing or of another type, no rows).
    """
    needed = ["protocol", "block", "component", "ratio"]
    frames = []
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"plasticity file not found: {path}")
        frames.append(
            read_result_table(path, PAIRS_TABLE, needed)
            .lazy()
            .select(needed)
            .filter(pl.col("protocol") == COMPARED_PROTOCOL)
            .with_columns(pl.lit(path.stem).alias("dataset"))
        )
    if not frames:
        return pl.DataFrame(schema={"block": pl.Int64, "component": pl.String, **_MEASURED_SCHEMA})
    grouped = (
        pl.concat(frames)
        .group_by("block", "component")
        .agg(
            pl.col("ratio"),
            pl.col("ratio").max().alias("measured_max"),
            pl.col("dataset").n_unique().alias("n_datasets"),
        )
        .collect()
    )
    # math.fsum is the exactly rounded sum whatever order the rows come in: polars' parallel
    # mean over several files moved in the last bit from one run to the next.
    means = [math.fsum(ratios) / len(ratios) for ratios in grouped["ratio"].to_list()]
    return grouped.select(
        "block",
        "component",
        pl.Series("measured_mean", means, dtype=pl.Float64),
        "measured_max",
        "n_datasets",
    )


@dataclass(frozen=True)
class BoundsResult:
    """The ``bounds`` stage's table with its footer metadata, and the token statistics used.

    ``metadata["undefined"]`` (present only when a component's bound is not defined for the
    model) maps each such component to the reason (:func:`undefined_bounds`). Its bounds are
    finite: a result of NaN or inf is refused, naming the model, block and component."""

    table: pl.DataFrame
    metadata: dict[str, Any]
    stats: TokenStatistics

    def __post_init__(self) -> None:
        measured = [name for name, kind in BOUND_SCHEMA.items() if kind == pl.Float64()]
        check_finite_rows(self.table, measured, f"bounds of model {self.metadata['model']!r}")

    @property
    def undefined(self) -> dict[str, str]:
        """Per component without a bound, why (empty when every bound is defined)."""
        return dict(self.metadata.get("undefined", {}))


def model_bounds(
    model_name: str,
    model_spec: dict[str, Any],
    reference: str | os.PathLike[str],
    settings: BoundsSettings,
    plasticity_files: Sequence[str | os.PathLike[str]] = (),
) -> BoundsResult:
    """The bounds of model ``model_name`` (its config entry ``model_spec``) for the embedding
    outputs of the first ``n_images`` reference images, joined with the plasticity measured
    in ``plasticity_files`` (:func:`measured_plasticity`): the ``bounds`` stage. A component
    whose bound is not defined (:func:`undefined_bounds`) gets no rows, only its reason in the
    log and the metadata's ``undefined``.

    Raises:
        ValueError: for a bad setting (naming its CLI flag and config key) or too few
            reference images, before the model is built.
        FileNotFoundError: for a missing reference set or plasticity file.
        UnsupportedModel, UndefinedStage: for a model without bounds (no known family, or a
            family that refuses the stage), before any image is decoded.
    """
    settings = check_settings(settings)
    spec = ModelSpec.from_config(model_spec)
    images = _reference_images(reference, settings.n_images)
    measured = measured_plasticity(plasticity_files)  # checks the files before compute
    target = pick_device(settings.device)

    # float64 throughout: the bounds' extreme values come from these tokens.
    model = build_model(spec, inputs="images").eval().to(device=target, dtype=torch.float64)
    # Refusals (no bounds in the family, a part it cannot account for, an undefined bound)
    # are known before any image is decoded.
    architecture = bounds_architecture(model)
    undefined = undefined_bounds(model, architecture)
    log_undefined(model, undefined)
    pre = preprocessing(model, spec)
    batches = decoded_batches(images, pre, settings.batch_size)
    embedded = _embedded_tokens(architecture, model, batches, target)
    with ProgressReporter(settings.n_images, f"bounds {model_name}: embedding") as progress:
        stats = TokenStatistics.from_tokens(counted(embedded, progress))
    table = beside_measured(bound_rows(architecture, model.cpu(), stats, undefined), measured)
    recorded: dict[str, Any] = {
        "model_spec": model_spec,
        "reference": str(reference),
        **recorded_settings(settings),
        "plasticity": [str(p) for p in plasticity_files],
        "token_statistics": asdict(stats),
        "preprocessing": asdict(pre),
    }
    metadata = bounds_metadata(model_name, provenance(recorded, target), settings.demo, undefined)
    table = table.select(pl.lit(model_name).alias("model"), pl.all())
    return BoundsResult(table, metadata, stats)


def bounds_metadata(
    model_name: str, record: dict[str, Any], demo: bool, undefined: dict[str, str]
) -> dict[str, Any]:
    """The bounds table's footer: the provenance ``record``, the model, the demo label, and the
    components without a bound (``undefined``, with why) where there are any."""
    metadata = {"provenance": record, "model": model_name, "demo": bool(demo)}
    if undefined:  # absent when every bound is defined: the paper's outputs stay as they were
        metadata["undefined"] = undefined
    return metadata


def beside_measured(bounds: pl.DataFrame, measured: pl.DataFrame) -> pl.DataFrame:
    """The ``bounds`` joined with the ``measured`` plasticity of each (block, component),
    logging where a measurement exceeds its bound."""
    table = bounds.join(measured, on=["block", "component"], how="left")
    _warn_above_bounds(table, measured)
    return table


def _reference_images(reference: str | os.PathLike[str], n_images: int) -> list[bytes]:
    """The first ``n_images`` images of the reference set file, encoded.

    Raises:
        ValueError: when it holds fewer.
        FileNotFoundError: for a missing file.
    """
    images = read_reference_images(reference)
    if len(images) < n_images:
        raise ValueError(
            f"{reference}: {len(images)} reference images, fewer than --n-images {n_images}"
        )
    return images[:n_images]


def _embedded_tokens(
    architecture: Architecture,
    model: nn.Module,
    batches: Iterable[torch.Tensor],
    device: torch.device,
) -> Iterator[torch.Tensor]:
    """The embedding outputs (N, n, d) of each batch of preprocessed images, in float64."""
    with torch.inference_mode():
        for batch in batches:
            yield architecture.embed(model, batch.to(device=device, dtype=torch.float64)).tokens


def counted(batches: Iterator[torch.Tensor], progress: ProgressReporter) -> Iterator[torch.Tensor]:
    """``batches`` as they are, telling ``progress`` how many sequences are done after each."""
    done = 0
    for batch in batches:
        yield batch
        done += len(batch)
        progress(done)


def _warn_above_bounds(table: pl.DataFrame, measured: pl.DataFrame) -> None:
    """Log where a measured plasticity exceeds its bound (or that nothing was measured)."""
    if not measured.height:
        log.warning("no %s-protocol plasticity given: bounds only", COMPARED_PROTOCOL)
        return
    over = table.filter(pl.col("measured_max") > pl.col("bound"))
    if over.height:
        # The reference tokens set sigma, r and E; a downstream image outside them can
        # exceed the bound legitimately. Said loudly, not hidden.
        log.warning(
            "measured plasticity above the bound (downstream tokens outside the reference "
            "set's sigma/r?) at %s",
            over.select("block", "component").rows(),
        )
