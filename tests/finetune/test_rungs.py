"""Rungs of successive halving: a run paused at a rung (``--stop-at-step``) and continued
later ends bit-identical (on CPU) to the same run never paused, its full-grid twin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch

from tests.helpers.cli_errors import refusal
from tests.helpers.tiny_finetune import cli_args, settings_for
from vitplasticity import cli
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.outputs import TIMING_FIELDS
from vitplasticity.finetune.train import train
from vitplasticity.models.spec import TimmSpec

STEPS = 24
VAL_EVERY = 6
# Fields a continued run may differ in: timing, when, and the resumed flag itself.
VOLATILE = (*TIMING_FIELDS, "created", "resumed")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rung_settings(spec: TimmSpec) -> FinetuneSettings:
    """An SGD run whose warmup and cosine span 24 steps; checkpoints every 5 steps, so that
    no rung below falls on a periodic checkpoint (the pause writes its own)."""
    return settings_for(
        spec,
        experiment="verify",
        configuration="mha+fc2",
        lr=0.05,
        seed=3,
        steps=STEPS,
        val_every=VAL_EVERY,
        warmup_steps=5,
        log_every=5,
        checkpoint_every=5,
        num_workers=0,
    )


def best_val_up_to(metrics: pl.DataFrame, step: int) -> tuple[int, float]:
    """The earliest step with the highest val accuracy at or before ``step``."""
    val = metrics.filter((pl.col("kind") == "val") & (pl.col("step") <= step))
    best = val.sort(["val_accuracy", "step"], descending=[True, False]).row(0, named=True)
    return best["step"], best["val_accuracy"]


@pytest.fixture(scope="module")
def twin(demo_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Any]:
    """The full-grid twin: the same run, never paused."""
    from tests.helpers.tiny_vit import TINY_SPEC

    folder = tmp_path_factory.mktemp("twin")
    settings = rung_settings(TINY_SPEC)
    summary = train(settings.run, settings.training, demo_dataset, folder)
    return summary, pl.read_parquet(folder / "metrics.parquet")


def test_a_run_paused_at_two_rungs_ends_equal_to_its_full_grid_twin(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, twin
) -> None:
    settings = rung_settings(tiny_spec)
    twin_summary, twin_metrics = twin
    out = tmp_path / "run"
    flags = {
        "experiment": "verify",
        "configuration": "mha+fc2",
        "seed": "3",
        "steps": str(STEPS),
        "val-every": str(VAL_EVERY),
        "warmup-steps": "5",
        "log-every": "5",
        "checkpoint-every": "5",
    }
    # Rung 1 through the CLI, as the workflow's rule runs it.
    assert cli.main([*cli_args(tiny_spec, demo_dataset, out, **flags), "--stop-at-step", "6"]) == 0
    assert not (out / "summary.json").exists() and not (out / "metrics.parquet").exists()
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 6
    first = json.loads((out / "rung_step6.json").read_text())
    assert first["status"] == "paused" and first["final_step"] == 6
    assert (first["best_step"], first["best_val_accuracy"]) == best_val_up_to(twin_metrics, 6)

    # Rung 2 in-process, from the rung-1 checkpoint.
    second = train(settings.run, settings.training, demo_dataset, out, stop_at=12)
    assert second["status"] == "paused" and second["final_step"] == 12
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 12
    assert (second["best_step"], second["best_val_accuracy"]) == best_val_up_to(twin_metrics, 12)

    # The survivor continues to the full budget: its twin's numbers, to the bit.
    summary = train(settings.run, settings.training, demo_dataset, out)
    metrics = pl.read_parquet(out / "metrics.parquet")
    assert metrics.equals(twin_metrics)  # polars compares floats exactly
    strip = lambda s: {k: v for k, v in s.items() if k not in VOLATILE}  # noqa: E731
    assert strip(summary) == strip(twin_summary)
    assert summary["resumed"] is True and summary["final_step"] == STEPS
    assert not (out / "checkpoint.pt").exists()


def test_a_rung_at_or_past_the_budget_finishes_the_run_and_records_it(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, twin
) -> None:
    settings = rung_settings(tiny_spec)
    out = tmp_path / "run"
    summary = train(settings.run, settings.training, demo_dataset, out, stop_at=STEPS + 6)
    assert summary["status"] == "completed" and (out / "summary.json").exists()
    record = json.loads((out / f"rung_step{STEPS + 6}.json").read_text())
    assert record["status"] == "completed" and record["final_step"] == STEPS
    assert record["best_val_accuracy"] == twin[0]["best_val_accuracy"]


def test_a_stop_below_one_is_refused_before_anything_is_written(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    argv = [*cli_args(tiny_spec, demo_dataset, out), "--stop-at-step", "0"]
    message = refusal(argv, caplog, outputs=out)
    assert "--stop-at-step" in message and "got 0" in message
