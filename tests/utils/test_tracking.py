"""The tracker interface on its own: no backend does nothing, a resumed MLflow run continues
without sending a step twice, and a missing package is one warning."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.wandb_records import offline_runs, read_offline_run
from vitplasticity.settings.tracking import TrackingSettings
from vitplasticity.utils import tracking as tracking_module
from vitplasticity.utils.tracking import (
    NO_TRACKER,
    TrackedJob,
    mlflow_uri,
    open_tracker,
    row_metrics,
    tracking,
)

JOB = TrackedJob("sgd/tiny/stripes/mha/lr0.05_seed0", "sgd/tiny/stripes", "finetune", {"a": 1})


def rows(steps: range) -> list[dict]:
    """Metrics rows as a run records them: a train row per step, a validation row every 3."""
    out = []
    for step in steps:
        out.append({"step": step, "kind": "train", "lr": 0.1 * step, "train_loss": 1 / step})
        if step % 3 == 0:
            out.append({"step": step, "kind": "val", "lr": 0.1 * step, "val_accuracy": 0.5})
    return out


def test_no_backend_is_the_tracker_that_does_nothing() -> None:
    assert open_tracker(None, JOB) is NO_TRACKER
    assert open_tracker(TrackingSettings(), JOB) is NO_TRACKER
    assert NO_TRACKER.run_ids() == {}


def test_a_row_logs_its_set_numbers_only() -> None:
    row = {"step": 4, "kind": "val", "lr": 0.5, "val_loss": None, "val_accuracy": 1, "x": True}
    assert row_metrics(row) == {"lr": 0.5, "val_accuracy": 1.0}


def test_a_resumed_mlflow_run_continues_without_a_step_twice(tmp_path: Path) -> None:
    options = TrackingSettings(
        tracking_backend=("mlflow",), tracking_mlflow_tracking_uri=str(tmp_path / "store")
    )
    # The first process logs steps 1-5 and is killed; its checkpoint was at step 3.
    with pytest.raises(KeyboardInterrupt), tracking(options, JOB) as first:
        for row in rows(range(1, 6)):
            first.log_row(row)
        ids = first.run_ids()
        raise KeyboardInterrupt
    # The next resumes from step 3: steps 4 and 5 are computed again, then 6 and 7.
    with tracking(options, JOB, ids) as second:
        assert second.run_ids() == ids
        for row in rows(range(4, 8)):
            second.log_row(row)
        second.log_summary({"best": 0.5, "status": "completed"})
    client = MlflowClient(tracking_uri=mlflow_uri(str(tmp_path / "store")))
    [run] = client.search_runs([client.get_experiment_by_name("vitplasticity").experiment_id])
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    expected = rows(range(1, 8))
    for name in ("lr", "train_loss", "val_accuracy"):
        history = client.get_metric_history(run.info.run_id, name)
        points = sorted((m.step, m.value) for m in history)
        assert points == sorted((r["step"], float(r[name])) for r in expected if name in r)
    assert run.data.metrics["summary/best"] == 0.5


def test_a_missing_package_is_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an uninstalled package imports as
    # The switch-off is for the process: this test's must not outlive it.
    monkeypatch.setattr(tracking_module, "_switched_off", {})
    options = TrackingSettings(tracking_backend=("wandb",), tracking_wandb_mode="offline")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # a packed job's two runs
            with tracking(options, JOB) as tracker:
                tracker.log_row({"step": 1, "lr": 0.1})
                tracker.log_summary({"status": "completed"})
            assert tracker is NO_TRACKER
    [warning] = [r.getMessage() for r in caplog.records if r.name == "vitplasticity.utils.tracking"]
    assert "wandb" in warning and "vitplasticity[tracking]" in warning


def test_a_resumed_offline_wandb_run_keeps_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    options = TrackingSettings(tracking_backend=("wandb",), tracking_wandb_mode="offline")
    with pytest.raises(KeyboardInterrupt), tracking(options, JOB) as first:
        for row in rows(range(1, 4)):
            first.log_row(row)
        ids = first.run_ids()
        raise KeyboardInterrupt
    with tracking(options, JOB, ids) as second:
        for row in rows(range(4, 6)):
            second.log_row(row)
    runs = [read_offline_run(path) for path in offline_runs(tmp_path)]
    assert [run.run_id for run in runs] == [ids["wandb"]] * 2
    assert [run.exit_code for run in runs] == [1, 0]  # the stopped process's run failed
    assert [sorted(run.history) for run in runs] == [[1, 2, 3], [4, 5]]
