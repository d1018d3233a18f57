"""The tracking: block through `snakemake`: the jobs log to the tracker it names (reached
through the environment), and editing it, or dropping it, schedules no job."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers.workflow import planned_jobs, snakemake
from vitplasticity.utils.tracking import mlflow_uri

pytestmark = pytest.mark.slow

RUN = "results/demo/finetune/sgd/demo_vit/demo-stripes/mha/lr0.05_seed0"
TARGETS = (f"{RUN}/summary.json", "results/demo/plasticity/demo_vit/demo-stripes.parquet")


def config_file(workdir: Path, name: str, block: dict) -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(block))
    return path


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finetuning run and one plasticity job of the mini preset, logged to an MLflow
    folder in the workdir."""
    workdir = tmp_path_factory.mktemp("tracked")
    tracked = config_file(
        workdir,
        "tracked",
        {"tracking": {"backend": "mlflow", "project": "mini", "mlflow_tracking_uri": "mlruns"}},
    )
    result = snakemake(workdir, *TARGETS, extra_configfiles=(tracked,))
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    return workdir


def test_the_jobs_log_to_the_tracker_the_block_names(
    tracked_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store so
    client = MlflowClient(tracking_uri=mlflow_uri(str(tracked_run / "mlruns")))
    experiment = client.get_experiment_by_name("mini")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {
        "sgd/demo_vit/demo-stripes/mha/lr0.05_seed0",
        "plasticity/demo_vit/demo-stripes",
    }
    finetune = runs["sgd/demo_vit/demo-stripes/mha/lr0.05_seed0"]
    assert finetune.info.status == "FINISHED"
    assert finetune.data.params["configuration"] == "mha"
    assert "summary/test_accuracy" in finetune.data.metrics
    plasticity = runs["plasticity/demo_vit/demo-stripes"].data.metrics
    assert set(plasticity) >= {f"summary/embedding/{c}" for c in ("ln1", "mha", "ln2")}


@pytest.mark.parametrize(
    "edit",
    [
        {},  # the block dropped: tracking off
        {
            "tracking": {
                "backend": ["wandb", "mlflow"],
                "project": "another",
                "wandb_mode": "offline",
                "mlflow_tracking_uri": "http://127.0.0.1:9",
            }
        },
    ],
    ids=["dropped", "edited"],
)
def test_editing_the_block_schedules_no_job(tracked_run: Path, edit: dict) -> None:
    edited = config_file(tracked_run, "edit", edit)
    assert planned_jobs(snakemake(tracked_run, "-n", *TARGETS, extra_configfiles=(edited,))) == {}


def test_a_setting_of_the_run_does_reschedule_it(tracked_run: Path) -> None:
    """The dry run above would have seen a change: a training setting reruns the run."""
    edited = config_file(tracked_run, "warmup", {"finetune": {"warmup_steps": 3}})
    jobs = planned_jobs(snakemake(tracked_run, "-n", *TARGETS, extra_configfiles=(edited,)))
    assert jobs.get("finetune") == 1 and "plasticity" not in jobs
