"""The loop's deferred read-back (finetune.loop): the same run with every step read back (the
old per-step synchronisation, MAX_DEFERRED_STEPS = 1) and with the default deferral writes
identical metrics and summaries, diverged or not; and it reads the device back only at the
steps that log, validate, checkpoint or end the run."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch

from tests.helpers.tiny_finetune import settings_for
from vitplasticity.finetune import loop
from vitplasticity.finetune.outputs import TIMING_FIELDS
from vitplasticity.finetune.train import train
from vitplasticity.models.spec import TimmSpec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# 12 steps of the whole model: logged at 1, 5, 10, 12, validated at 6 and 12.
run_settings = functools.partial(
    settings_for, configuration="full", steps=12, log_every=5, val_every=6,
    checkpoint_every=100, warmup_steps=2, num_workers=0,
)  # fmt: skip

# Tensor-to-Python conversions: each one waits for the device.
CONVERSIONS = ("tolist", "item", "__float__", "__int__", "__bool__")


def _run(
    spec: TimmSpec, dataset: Path, out: Path, deferred: int, monkeypatch: pytest.MonkeyPatch,
    **overrides: Any,
) -> tuple[pl.DataFrame, dict[str, Any]]:  # fmt: skip
    monkeypatch.setattr(loop, "MAX_DEFERRED_STEPS", deferred)
    settings = run_settings(spec, **overrides)
    summary = train(settings.run, settings.training, dataset, out)
    return pl.read_parquet(out / "metrics.parquet"), summary


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.columns == b.columns and a.height == b.height
    for column in a.columns:  # NaN equal to NaN, every other value bit for bit
        np.testing.assert_array_equal(a[column].to_numpy(), b[column].to_numpy(), strict=True)


def _comparable(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in (*TIMING_FIELDS, "git_commit", "created")}


@pytest.mark.parametrize("lr", [0.05, 1e30], ids=["converges", "diverges"])
def test_deferred_read_back_changes_no_result(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    lr: float,
) -> None:  # fmt: skip
    every_step = _run(tiny_spec, demo_dataset, tmp_path / "a", 1, monkeypatch, lr=lr)
    deferred = _run(tiny_spec, demo_dataset, tmp_path / "b", 100, monkeypatch, lr=lr)
    _same(every_step[0], deferred[0])
    assert _comparable(every_step[1]) == _comparable(deferred[1])
    if lr > 1:  # diverged between read-backs: stopped at the same step with the same row
        assert deferred[1]["diverged"] and deferred[1]["final_step"] < 5
    else:
        assert deferred[1]["status"] == "completed"
        assert deferred[0].filter(pl.col("kind") == "train")["step"].to_list() == [1, 5, 10, 12]


# What the loop calls per step: the step itself, the device crop, the joint read-back.
STEP_FUNCTIONS = ("training_step", "deferred_training_step", "_first_nonfinite", "_step_batch")


@contextlib.contextmanager
def _counted_conversions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every tensor-to-Python conversion made inside the loop's per-step functions."""
    seen: list[str] = []
    counting = [False]
    for name in CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            if counting[0]:
                seen.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    for name in STEP_FUNCTIONS:
        function = getattr(loop, name)

        def inside(*args: Any, _function: Any = function, **kwargs: Any) -> Any:
            counting[0] = True
            try:
                return _function(*args, **kwargs)
            finally:
                counting[0] = False

        monkeypatch.setattr(loop, name, inside)
    yield seen


@pytest.mark.parametrize(("deferred", "expected"), [(1, 12), (100, 3)])
def test_host_reads_per_run(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    deferred: int, expected: int,
) -> None:  # fmt: skip
    # 12 steps, logged and validated at 1 and 12 only. Every step read back (the old loop):
    # 12 reads of the loss and norm. Deferred: step 1's, one joint read of steps 2-11, step
    # 12's. Besides, each logged step reads its per-group gradient norms (one float each).
    monkeypatch.setattr(loop, "MAX_DEFERRED_STEPS", deferred)
    settings = run_settings(tiny_spec, val_every=12, log_every=12)
    with _counted_conversions(monkeypatch) as seen:
        train(settings.run, settings.training, demo_dataset, tmp_path / "run")
    assert seen.count("tolist") == expected
    metrics = pl.read_parquet(tmp_path / "run" / "metrics.parquet")
    train_rows = metrics.filter(pl.col("kind") == "train")
    assert train_rows["step"].to_list() == [1, 12]
    groups = [
        c for c in metrics.columns if c.startswith("grad_norm_") and train_rows[c].null_count() == 0
    ]
    assert groups  # the full configuration has gradients in every group
    assert sorted(seen) == sorted(["tolist"] * expected + ["__float__"] * 2 * len(groups))
