"""The measured plasticity the bounds are compared with: the same numbers on every call, in
every file order, equal to an exactly rounded mean (math.fsum)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl

from vitplasticity.components import COMPONENTS
from vitplasticity.plasticity.bounds import measured_plasticity
from vitplasticity.utils.io import write_parquet


def _pairs_file(path: Path, seed: int, n: int = 5000) -> Path:
    rng = np.random.default_rng(seed)
    rows = [
        {"protocol": protocol, "block": b, "component": c, "pair": i, "ratio": ratio}
        for protocol in ("embedding", "in_situ")
        for b in range(2)
        for c in COMPONENTS
        for i, ratio in enumerate(rng.lognormal(0.0, 2.0, n))
    ]
    write_parquet(path, pl.DataFrame(rows))
    return path


def test_measured_means_are_exact_and_repeatable(tmp_path: Path) -> None:
    files = [_pairs_file(tmp_path / f"d{i}.parquet", i) for i in range(3)]
    runs = [measured_plasticity(files).sort("block", "component") for _ in range(8)]
    runs.append(measured_plasticity(files[::-1]).sort("block", "component"))
    for other in runs[1:]:
        assert other.equals(runs[0])
    pairs = pl.concat([pl.read_parquet(f) for f in files]).filter(pl.col("protocol") == "embedding")
    for row in runs[0].iter_rows(named=True):
        ratios = pairs.filter(
            (pl.col("block") == row["block"]) & (pl.col("component") == row["component"])
        )["ratio"].to_list()
        assert len(ratios) == 3 * 5000  # the embedding protocol's rows of every file only
        assert row["measured_mean"] == math.fsum(ratios) / len(ratios)
        assert row["measured_max"] == max(ratios) and row["n_datasets"] == 3
