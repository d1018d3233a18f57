"""The plasticity summaries pooled for the report: per (protocol, block, component) over
datasets (the figures' :func:`pool_plasticity`) and per (model, protocol, component) over
blocks and datasets with a rank (the tables' and the criteria's :func:`plasticity_ranking`).
Computations on polars frames; the tables and figures only lay them out."""

from __future__ import annotations

import polars as pl

Z95 = 1.96  # normal quantile of a two-sided 95% interval, as the reference code


def pool_plasticity(summaries: pl.DataFrame) -> pl.DataFrame:
    """Per (protocol, block, component): the statistics of all datasets' pairs taken together.

    Each summary row holds ``n_pairs``, ``mean`` and ``std`` (sample std, ddof 1) of the ratios
    of one dataset; pooling gives the mean and sample std of the union of the pairs exactly
    (within-dataset plus between-dataset sums of squares), and ``ci95 = 1.96 std / sqrt(N)``.
    """
    n, m, s = pl.col("n_pairs").cast(pl.Float64), pl.col("mean"), pl.col("std").fill_null(0.0)
    keys = ("protocol", "block", "component")
    pooled = summaries.group_by(*keys).agg(
        N=n.sum(),
        total=(n * m).sum(),
        within=((n - 1) * s**2).sum(),
        sq=(n * m**2).sum(),
        relative_depth=pl.col("relative_depth").first(),
        n_datasets=pl.col("dataset").n_unique(),
    )
    mean = pl.col("total") / pl.col("N")
    between = pl.col("sq") - pl.col("N") * mean**2  # = sum n_i (m_i - M)^2
    std = ((pl.col("within") + between).clip(lower_bound=0.0) / (pl.col("N") - 1)).sqrt()
    return (
        pooled.with_columns(mean=mean)
        .with_columns(std=std)
        .with_columns(ci95=Z95 * pl.col("std") / pl.col("N").sqrt())
        .select(
            *keys, "relative_depth", "n_datasets", n_pairs="N", mean="mean", std="std", ci95="ci95"
        )
        .sort(*keys)
    )


def plasticity_ranking(summaries: pl.DataFrame) -> pl.DataFrame:
    """Per model, protocol and component: mean plasticity over blocks and datasets, and rank.

    The mean pools every pair of every block and dataset (each block-dataset mean weighted by
    its ``n_pairs``); rank 1 is the most plastic component of that model and protocol.
    """
    missing = {"model", "protocol", "component", "mean", "n_pairs"} - set(summaries.columns)
    if missing:
        raise ValueError(f"plasticity summary misses column(s) {', '.join(sorted(missing))}")
    return (
        summaries.group_by("model", "protocol", "component", maintain_order=True)
        .agg(
            mean=(pl.col("mean") * pl.col("n_pairs")).sum() / pl.col("n_pairs").sum(),
            n_datasets=pl.col("dataset").n_unique(),
            n_blocks=pl.col("block").n_unique(),
        )
        .with_columns(
            rank=pl.col("mean").rank(method="min", descending=True).over("model", "protocol")
        )
        .with_columns(pl.col("rank").cast(pl.Int64))
    )
