"""``dtype: bfloat16``: the layers compute in bfloat16, every norm in float64
(vitplasticity.plasticity.norms). Against float64 on tiny random models of five families, both
protocols, 32 pairs: per pair the ratio moved by at most 0.7% and each (block, component) mean
by at most 0.05% (measured 2026-12-07; docs/protocol.md 1.3 states it). The bounds below are a
few times those: a change that makes bfloat16 drift further (a layer run in another dtype than
asked, a norm accumulated in bfloat16 over many tokens) fails them."""

from __future__ import annotations

import polars as pl
import pytest
import torch

from tests.helpers.tiny_models import TINY_MODELS
from vitplasticity.plasticity.measure import measure_protocols

CASES = ["vit_tiny_patch16_224", "vit_small_patch16_dinov3", "llama_tiny", "gpt2_tiny", "bert_tiny"]


@pytest.mark.parametrize("case", CASES)
def test_bfloat16_stays_within_its_stated_deviation_from_float64(case: str) -> None:
    tiny = next(t for t in TINY_MODELS if t.id == case)
    model = tiny.build().eval().double()
    inputs = tiny.inputs(64)
    found = {}
    for dtype in (torch.float64, torch.bfloat16):
        found[dtype] = measure_protocols(
            model.to(dtype), inputs[:32], inputs[32:], protocols=("embedding", "in_situ"),
            batch_size=16, n_pairs=32,
        )  # fmt: skip
    exact, rounded = found[torch.float64], found[torch.bfloat16]
    per_pair = ((rounded["ratio"] - exact["ratio"]).abs() / exact["ratio"]).max()
    keys = ["protocol", "block", "component"]
    means = [
        table.group_by(keys).agg(pl.col("ratio").mean()).sort(keys)["ratio"]
        for table in (exact, rounded)
    ]
    per_mean = ((means[1] - means[0]).abs() / means[0]).max()
    assert per_pair < 0.02, per_pair
    assert per_mean < 0.002, per_mean
