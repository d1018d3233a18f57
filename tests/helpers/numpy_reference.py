"""Pieces of the independent float64 computations the plasticity tests write in numpy from a
model's state dict (never from its modules), and the comparison with a measured frame."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
import pytest


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis (biased variance, as torch)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Softmax of each row, shifted by its maximum."""
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    return weights / weights.sum(axis=1, keepdims=True)


def norm_ratio(f, u: np.ndarray, v: np.ndarray) -> tuple[float, float]:
    """(||f(u) - f(v)||_F, ||u - v||_F): one plasticity ratio's numerator and denominator."""
    return float(np.linalg.norm(f(u) - f(v))), float(np.linalg.norm(u - v))


def pair_ratios(computation: Any, reference, downstream, protocol: str, **options: Any) -> dict:
    """Every (block, component, pair) ratio of a direct computation over token sequences: pair
    i is reference sequence i with downstream sequence i (cycled), as the stage pairs them.
    ``computation`` has ``embed(ids)`` and ``ratios(x, y, protocol, **options)``, keyed by
    (block, component)."""
    found = {}
    for pair in range(len(reference)):
        x = computation.embed(reference[pair].numpy())
        y = computation.embed(downstream[pair % len(downstream)].numpy())
        for (block, component), value in computation.ratios(x, y, protocol, **options).items():
            found[(block, component, pair)] = value
    return found


def check_against(frame: pl.DataFrame, expected: dict, rtol: float) -> None:
    """Every (block, component, pair) of a measured frame has the expected numerator and
    denominator within ``rtol``, and no other row exists."""
    got = {
        (r["block"], r["component"], r["pair"]): (r["numerator"], r["denominator"])
        for r in frame.iter_rows(named=True)
    }
    assert got.keys() == expected.keys()
    for key, (numerator, denominator) in expected.items():
        assert got[key][0] == pytest.approx(numerator, rel=rtol), key
        assert got[key][1] == pytest.approx(denominator, rel=rtol), key


def embedding_protocol(
    x: np.ndarray,
    y: np.ndarray,
    *,
    ln1: Callable[[np.ndarray], np.ndarray],
    mha: Callable[[np.ndarray], np.ndarray],
    ln2: Callable[[np.ndarray], np.ndarray],
    fc1: Callable[[np.ndarray], np.ndarray],
    fc2: Callable[[np.ndarray], np.ndarray],
    fc2_width: int,
) -> dict[str, tuple[float, float]]:
    """Each component's :func:`norm_ratio` under the embedding protocol (docs/protocol.md):
    every component is fed the pair's token embeddings ``x`` and ``y``; fc2, whose input is
    the MLP's hidden width ``fc2_width``, is fed them zero-padded to it."""

    def padded(t: np.ndarray) -> np.ndarray:
        return np.hstack([t, np.zeros((t.shape[0], fc2_width - t.shape[1]))])

    return {
        "ln1": norm_ratio(ln1, x, y),
        "mha": norm_ratio(mha, x, y),
        "ln2": norm_ratio(ln2, x, y),
        "fc1": norm_ratio(fc1, x, y),
        "fc2": norm_ratio(lambda t: fc2(padded(t)), x, y),
    }
