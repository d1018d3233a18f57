"""A finetuning run logged to W&B (offline) and MLflow (a file store): the trackers hold
exactly what metrics.parquet and summary.json hold, read back with each package's own
reader (a resumed run in one tracker run, each step once), and a tracker changes nothing
the run writes, even when it fails."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
from pathlib import Path

import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers.tiny_finetune import settings_for
from tests.helpers.tiny_models import GPT2_TINY_CONFIG
from tests.helpers.wandb_records import offline_runs, read_offline_run
from vitplasticity.finetune import loop, text_run
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.loop import Preempted
from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
from vitplasticity.finetune.train import train, train_runs
from vitplasticity.models.spec import TimmSpec
from vitplasticity.settings.tracking import TrackingSettings
from vitplasticity.utils.tracking import mlflow_uri
from vitplasticity.workflow.config import Run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMED = ("steps_per_second", "images_per_second", "wall_seconds", "created")
"""Summary fields that differ between two identical runs."""


@pytest.fixture
def settings(tiny_spec: TimmSpec) -> FinetuneSettings:
    return settings_for(tiny_spec)


@pytest.fixture
def untracked(settings: FinetuneSettings, demo_dataset: Path, tmp_path: Path) -> Path:
    """The run trained without a tracker: its folder."""
    train(settings.run, settings.training, demo_dataset, tmp_path / "untracked")
    return tmp_path / "untracked"


def logged_values(metrics: pl.DataFrame) -> dict[str, list[tuple[int, float]]]:
    """Each column's (step, value) points as a tracker gets them: every row's set numbers."""
    points: dict[str, list[tuple[int, float]]] = {}
    for row in metrics.iter_rows(named=True):
        for name, value in row.items():
            if name not in ("step", "kind") and value is not None:
                points.setdefault(name, []).append((row["step"], value))
    return points


def assert_same_outputs(run: Path, reference: Path) -> None:
    """``run`` wrote what the untracked ``reference`` wrote (timings aside)."""
    assert pl.read_parquet(run / "metrics.parquet").equals(
        pl.read_parquet(reference / "metrics.parquet")
    )
    first, second = (json.loads((p / "summary.json").read_text()) for p in (run, reference))
    for key in TIMED:
        first.pop(key), second.pop(key)
    assert first == second
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in reference.iterdir())


def test_wandb_offline_holds_the_metrics_and_the_summary(
    settings: FinetuneSettings,
    demo_dataset: Path,
    untracked: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    (tmp_path / "wandb").mkdir()
    options = TrackingSettings(
        tracking_backend=("wandb",), tracking_project="tests", tracking_wandb_mode="offline"
    )
    out = tmp_path / "tracked"
    train(settings.run, settings.training, demo_dataset, out, tracking_options=options)
    assert_same_outputs(out, untracked)

    [path] = offline_runs(tmp_path / "wandb")
    logged = read_offline_run(path)
    metrics = pl.read_parquet(out / "metrics.parquet")
    # Every row at its step: a step's train and validation rows are one W&B history row.
    assert set(logged.history) == set(metrics["step"])
    for name, points in logged_values(metrics).items():
        for step, value in points:
            assert logged.history[step][name] == value, (name, step)
    columns = {c for row in logged.history.values() for c in row if not c.startswith("_")}
    assert columns == set(logged_values(metrics))
    summary = json.loads((out / "summary.json").read_text())
    for key in ("test_accuracy", "best_val_accuracy", "best_step", "final_step", "status"):
        assert logged.summary[key] == summary[key], key
    assert logged.summary["trainable_parameters"] == summary["trainable_parameters"]
    assert logged.config["configuration"] == "mha" and logged.config["lr"] == 0.05
    assert logged.config["steps"] == settings.training.steps
    assert logged.exit_code == 0


def test_mlflow_file_store_holds_the_metrics_and_the_summary(
    settings: FinetuneSettings, demo_dataset: Path, untracked: Path, tmp_path: Path
) -> None:
    store = tmp_path / "mlruns"  # a folder: the file store, made there
    options = TrackingSettings(
        tracking_backend=("mlflow",),
        tracking_project="tests",
        tracking_mlflow_tracking_uri=str(store),
    )
    out = tmp_path / "tracked"
    train(settings.run, settings.training, demo_dataset, out, tracking_options=options)
    assert_same_outputs(out, untracked)

    client = MlflowClient(tracking_uri=mlflow_uri(str(store)))
    [run] = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == settings.run.directory
    metrics = pl.read_parquet(out / "metrics.parquet")
    expected = logged_values(metrics)
    assert {k for k in run.data.metrics if not k.startswith("summary/")} == set(expected)
    for name, points in expected.items():
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted((m.step, m.value) for m in history) == sorted(points), name
    summary = json.loads((out / "summary.json").read_text())
    for key in ("test_accuracy", "best_val_accuracy", "best_step", "final_step"):
        assert run.data.metrics[f"summary/{key}"] == summary[key], key
    assert run.data.params["configuration"] == "mha"
    assert float(run.data.params["lr"]) == 0.05
    assert run.data.params["steps"] == str(settings.training.steps)


def closed_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_dead_server_warns_once_and_every_run_completes(
    tiny_spec: TimmSpec,
    demo_dataset: Path,
    untracked: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # MLflow's own retries (7, with back-off) would make the test wait minutes.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    options = TrackingSettings(
        tracking_backend=("mlflow",),
        tracking_mlflow_tracking_uri=f"http://127.0.0.1:{closed_port()}",
    )
    settings = settings_for(tiny_spec)
    other = settings_for(tiny_spec, seed=1)
    runs = [(settings.run, tmp_path / "a"), (other.run, tmp_path / "b")]
    with caplog.at_level(logging.WARNING):
        summaries = train_runs(runs, settings.training, demo_dataset, tracking_options=options)
    warnings = [r for r in caplog.records if r.name == "vitplasticity.utils.tracking"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "mlflow" in warnings[0].getMessage() and "127.0.0.1" in warnings[0].getMessage()
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert_same_outputs(tmp_path / "a", untracked)
    assert math.isfinite(summaries[1]["test_accuracy"])


def test_a_preempted_text_run_resumes_its_mlflow_run_with_each_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM after step 7 (checkpoint written there), then the rerun: one MLflow run, its
    curves those of metrics.parquet, no step twice."""
    text = tmp_path / "pattern.txt"
    text.write_text(("abcdefgh" * 3 + "\n") * 40)
    gpt2 = {
        "family": "transformers",
        "hf_id": "tiny-gpt2",
        "weights": "random",
        "config": {"model_type": "gpt2", **GPT2_TINY_CONFIG},
    }
    training = TrainingSettings(
        model_spec=gpt2, optimizer="adamw", steps=12, val_every=4, batch_size=4,
        micro_batch_size=2, warmup_steps=2, log_every=1, checkpoint_every=5, device="cpu",
        val_fraction=0.25,
    )  # fmt: skip
    store = str(tmp_path / "mlruns")
    options = TrackingSettings(tracking_backend=("mlflow",), tracking_mlflow_tracking_uri=store)
    arguments = (
        Run("text", "tiny", "pattern", "mha", 1e-2, 0),
        training,
        TextFinetuneSettings(sequence_length=12),
        text,
        tmp_path / "run",
    )
    step_batch, taken = loop._step_batch, []

    def stopped_at_seven(context, item):  # the signal as step 7's batch is taken
        taken.append(item)
        if len(taken) == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        return step_batch(context, item)

    monkeypatch.setattr(loop, "_step_batch", stopped_at_seven)
    with pytest.raises(Preempted, match="after step 7"):
        text_run.train_text_run(*arguments, tracking_options=options)
    monkeypatch.setattr(loop, "_step_batch", step_batch)
    summary = text_run.train_text_run(*arguments, tracking_options=options)
    assert summary["resumed"] is True

    client = MlflowClient(tracking_uri=mlflow_uri(store))
    [run] = client.search_runs([client.get_experiment_by_name("vitplasticity").experiment_id])
    assert run.info.status == "FINISHED"
    metrics = pl.read_parquet(tmp_path / "run/metrics.parquet")
    for name, points in logged_values(metrics).items():
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted((m.step, m.value) for m in history) == sorted(points), name
    assert run.data.metrics["summary/best_val_loss"] == summary["best_val_loss"]
