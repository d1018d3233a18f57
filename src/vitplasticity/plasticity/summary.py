"""A measurement's summary (mean, spread and 95% interval per protocol, block and
component) and the :class:`Measurement` a stage writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from vitplasticity.components import COMPONENTS
from vitplasticity.plasticity.finite import PAIR_MEASURED, check_finite_rows
from vitplasticity.provenance import provenance
from vitplasticity.utils.io import TableKind

if TYPE_CHECKING:  # the report stage reads summaries (SUMMARY_TABLE) without torch
    import torch

SUMMARY_TABLE = TableKind(
    "plasticity summary files (plasticity --summary)",
    {
        "model": pl.String(),
        "dataset": pl.String(),
        "protocol": pl.String(),
        "block": pl.Int64(),
        "component": pl.String(),
        "relative_depth": pl.Float64(),
        "n_pairs": pl.Int64(),
        "mean": pl.Float64(),
        "std": pl.Float64(),
        "ci95": pl.Float64(),
    },
)
"""A stage's summary file: :func:`summarize`'s columns after the model's and dataset's."""


def summarize(pairs: pl.DataFrame) -> pl.DataFrame:
    """Mean plasticity per (protocol, block, component) with its spread.

    Columns: protocol, block, component, relative_depth = (block + 1) / depth (depth: the
    number of blocks in ``pairs``), n_pairs, mean, std (ddof=1), ci95 = 1.96 std / sqrt(n)
    (the paper's 95% interval). Rows sorted by protocol, block and component in forward order.

    Raises:
        ValueError: when a column of :data:`~vitplasticity.plasticity.measure.PAIR_SCHEMA` is missing, naming it.
    """
    missing = [name for name in ("protocol", "block", "component", "ratio") if name not in pairs]
    if missing:
        raise ValueError(f"pairs frame lacks columns {missing}")
    depth = pairs.group_by("protocol").agg((pl.col("block").max() + 1).alias("depth"))
    order = pl.DataFrame({"component": list(COMPONENTS), "_order": range(len(COMPONENTS))})
    return (
        pairs.group_by("protocol", "block", "component")
        .agg(
            pl.len().cast(pl.Int64).alias("n_pairs"),
            pl.col("ratio").mean().alias("mean"),
            pl.col("ratio").std(ddof=1).alias("std"),
        )
        .join(depth, on="protocol")
        .join(order, on="component", how="left")
        .with_columns(
            ((pl.col("block") + 1) / pl.col("depth")).alias("relative_depth"),
            (1.96 * pl.col("std") / pl.col("n_pairs").sqrt()).alias("ci95"),
        )
        .sort("protocol", "block", "_order")
        .select(
            "protocol",
            "block",
            "component",
            "relative_depth",
            "n_pairs",
            "mean",
            "std",
            "ci95",
        )
    )


def summary_scalars(summary: pl.DataFrame) -> dict[str, float]:
    """A summary's means as one tracker summary: ``<protocol>/<component>`` (the mean over
    blocks of the block means) and ``<protocol>/block<b>/<component>`` (each block's)."""
    scalars = {}
    for (protocol, component), rows in summary.group_by("protocol", "component"):
        scalars[f"{protocol}/{component}"] = float(rows["mean"].mean())
        for block, mean in zip(rows["block"], rows["mean"], strict=True):
            scalars[f"{protocol}/block{block}/{component}"] = float(mean)
    return dict(sorted(scalars.items()))


@dataclass(frozen=True)
class Measurement:
    """A stage's result, ready to write: the per-pair rows, their per-(protocol, block,
    component) summary, and the footer metadata both files carry (provenance, model,
    dataset, demo flag)."""

    pairs: pl.DataFrame
    summary: pl.DataFrame
    metadata: dict[str, Any]


def measurement(
    pairs: pl.DataFrame,
    *,
    model: str,
    dataset: str,
    settings: dict[str, Any],
    device: torch.device,
    demo: bool,
) -> Measurement:
    """``pairs`` with its summary (labelled with ``model`` and ``dataset``) and its metadata.

    Raises:
        ValueError: naming the model, dataset, block and component of a pair whose numerator
            or denominator is not finite (:func:`check_finite_rows`).
    """
    check_finite_rows(pairs, PAIR_MEASURED, f"plasticity of model {model!r} on {dataset}")
    metadata = {
        "provenance": provenance(settings, device),
        "model": model,
        "dataset": dataset,
        "demo": bool(demo),
    }
    summary = summarize(pairs).select(
        pl.lit(model).alias("model"), pl.lit(dataset).alias("dataset"), pl.all()
    )
    return Measurement(pairs, summary, metadata)
