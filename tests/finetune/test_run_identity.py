"""A run's identity (finetune.run.Run) apart from its training settings, and one exact LR per run:
a run packed with others and a run of its own train with the grid's float, to the last bit,
whatever its digits (the run folder's label keeps 6 significant digits)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.helpers.tiny_vit import TINY_SPEC
from tests.helpers.workflow import REPO, snakemake
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.outputs import TIMING_FIELDS
from vitplasticity.finetune.run import Run, lr_label
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.train import train_runs
from vitplasticity.workflow.config import ConfigError, grid_lr
from vitplasticity.workflow.config_check import check_config

LONG_LR = 0.0123456789  # lr_label: 0.0123457, another float


@pytest.fixture(scope="module")
def demo_config() -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    demo = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    for key, value in demo.items():  # the demo's experiments: what the tests below edit
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    return config


def test_settings_compose_the_run_and_its_training_settings() -> None:
    training = TrainingSettings(model_spec=dataclasses.asdict(TINY_SPEC), steps=4, val_every=2)
    run = Run("sgd", "tiny", "demo-stripes", "mha+fc1", LONG_LR, 3)
    settings = FinetuneSettings(run, training)
    # The two parts, each declared once: no field of Run is re-declared beside them.
    assert [field.name for field in dataclasses.fields(FinetuneSettings)] == ["run", "training"]
    identity = [field.name for field in dataclasses.fields(Run)]
    shared = [field.name for field in dataclasses.fields(TrainingSettings)]
    assert not set(identity) & set(shared)
    # The flat record (provenance) is the training fields, then the run's, in order.
    assert list(settings.record()) == shared + identity
    assert settings.record()["lr"] == LONG_LR and settings.record()["steps"] == 4


def test_every_run_of_a_job_is_checked_before_the_first_starts(
    demo_dataset: Path, tmp_path: Path
) -> None:
    training = TrainingSettings(
        model_spec=dataclasses.asdict(TINY_SPEC), steps=2, val_every=2, batch_size=8,
        micro_batch_size=8, warmup_steps=0, device="cpu", num_workers=0,
    )  # fmt: skip
    good = Run("sgd", "tiny", "demo-stripes", "mha", 0.05, 0)
    bad = dataclasses.replace(good, lr=-1.0)
    with pytest.raises(ValueError, match=r"--lr \(experiments\.<name>\.lrs\)"):
        train_runs([(good, tmp_path / "good"), (bad, tmp_path / "bad")], training, demo_dataset)
    assert not (tmp_path / "good").exists()  # nothing trained, nothing half-written


def test_lr_label_round_trips() -> None:
    for lr in (1e-3, 3e-3, 0.06, 1e-5, 3e-05, 0.0006):
        assert float(lr_label(lr)) == lr
    assert lr_label(0.001) == "0.001" and lr_label(3e-5) == "3e-05"


def test_grid_lr_gives_the_exact_value_of_a_label(demo_config: dict) -> None:
    config = copy.deepcopy(demo_config)
    config["experiments"]["sgd"]["lrs_by_dataset"] = {"demo-stripes": [LONG_LR, 0.1]}
    assert lr_label(LONG_LR) == "0.0123457" and float(lr_label(LONG_LR)) != LONG_LR
    assert grid_lr(config, "sgd", "demo-stripes", "0.0123457") == LONG_LR
    assert grid_lr(config, "sgd", "demo-blobs", "0.05") == 0.05
    with pytest.raises(ConfigError, match=r"experiments\.sgd: 0 learning rates .* lr0\.3"):
        grid_lr(config, "sgd", "demo-stripes", "0.3")


def test_lrs_that_share_a_label_are_rejected(demo_config: dict) -> None:
    config = copy.deepcopy(demo_config)
    config["experiments"]["sgd"]["lrs_by_dataset"] = {"demo-stripes": [LONG_LR, 0.01234568]}
    with pytest.raises(ConfigError, match=r"0\.0123456789 and 0\.01234568 .* lr0\.0123457"):
        check_config(config)


@pytest.mark.slow
def test_packed_and_single_runs_train_with_the_grids_exact_lr(tmp_path: Path) -> None:
    """The same one-run grid through the one-run rule and through a packed rule."""
    run_dir = f"finetune/sgd/demo_vit/demo-stripes/head/lr{lr_label(LONG_LR)}_seed0"
    target = f"results/demo/{run_dir}/summary.json"
    outcomes = []
    for pack in (False, True):
        workdir = tmp_path / f"pack_{pack}"
        workdir.mkdir()
        edit = workdir / "edit.yaml"
        edit.write_text(
            yaml.safe_dump(
                {
                    "datasets": {"demo-stripes": {"steps": 4, "val_every": 2}},
                    "finetune": {"pack_runs": pack},
                    "experiments": {
                        "sgd": {
                            "datasets": ["demo-stripes"],
                            "configurations": ["head"],
                            "lrs": [LONG_LR],
                            "lrs_by_dataset": {"demo-stripes": [LONG_LR]},
                        }
                    },
                }
            )
        )
        result = snakemake(workdir, target, extra_configfiles=(edit,))
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        summary = json.loads((workdir / target).read_text())
        assert summary["lr"] == LONG_LR and summary["settings"]["lr"] == LONG_LR
        for key in (*TIMING_FIELDS, "created", "git_commit"):
            summary.pop(key)
        metrics = pl.read_parquet(workdir / "results/demo" / run_dir / "metrics.parquet")
        outcomes.append((summary, metrics))
    (single, single_metrics), (packed, packed_metrics) = outcomes
    assert single == packed
    assert single_metrics.equals(packed_metrics)
