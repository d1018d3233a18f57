"""finetune.pack_runs: several runs in one process give each run's own, identical results;
through the workflow, each packed rule (vitplasticity.workflow.packs) runs its runs once."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.helpers.tiny_finetune import cli_args
from tests.helpers.workflow import PRESETS, merged, planned_jobs, snakemake
from vitplasticity import cli
from vitplasticity.finetune.outputs import TIMING_FIELDS
from vitplasticity.models.spec import TimmSpec
from vitplasticity.workflow.packs import finetune_packs

RUN_FLAGS = ("configuration", "lr", "seed", "out-dir")


def packed_args(spec: TimmSpec, dataset: Path, runs: list[dict]) -> list[str]:
    argv = cli_args(spec, dataset, Path("unused"))
    for flag in RUN_FLAGS:  # drop the single-run flags and their values
        index = argv.index(f"--{flag}")
        del argv[index : index + 2]
    return [*argv, "--runs", json.dumps(runs)]


def comparable(out: Path) -> tuple[dict, pl.DataFrame]:
    summary = json.loads((out / "summary.json").read_text())
    for key in (*TIMING_FIELDS, "created"):
        summary.pop(key, None)
    return summary, pl.read_parquet(out / "metrics.parquet")


def test_packed_runs_equal_one_process_per_run(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    runs = [
        {"configuration": "mha", "lr": 0.05, "seed": 0, "out_dir": str(tmp_path / "packed/mha")},
        {"configuration": "ln1", "lr": 0.1, "seed": 3, "out_dir": str(tmp_path / "packed/ln1")},
    ]
    assert cli.main(packed_args(tiny_spec, demo_dataset, runs)) == 0
    for entry in runs:
        alone = tmp_path / "alone" / entry["configuration"]
        flags = {
            "configuration": entry["configuration"],
            "lr": str(entry["lr"]),
            "seed": str(entry["seed"]),
        }
        assert cli.main(cli_args(tiny_spec, demo_dataset, alone, **flags)) == 0
        packed_summary, packed_metrics = comparable(Path(entry["out_dir"]))
        alone_summary, alone_metrics = comparable(alone)
        assert packed_summary == alone_summary
        assert packed_metrics.equals(alone_metrics)


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        ([], "non-empty JSON list"),
        ([{"configuration": "mha", "lr": 0.1}], "--runs[1]: expected exactly the keys"),
        (
            [{"configuration": "mlp", "lr": 0.1, "seed": 0, "out_dir": "x"}],
            "unknown finetuning configuration 'mlp'",
        ),
    ],
)
def test_bad_runs_stop_before_any_run(
    tiny_spec: TimmSpec,
    demo_dataset: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    runs: list,
    message: str,
) -> None:
    good = {"configuration": "mha", "lr": 0.1, "seed": 0, "out_dir": str(tmp_path / "good")}
    assert cli.main(packed_args(tiny_spec, demo_dataset, [good, *runs] if runs else [])) == 2
    assert message in caplog.text
    assert not (tmp_path / "good").exists()


def test_runs_and_single_run_flags_are_exclusive(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = [*cli_args(tiny_spec, demo_dataset, tmp_path / "x"), "--runs", "[]"]
    assert cli.main(argv) == 2 and "either --runs or" in caplog.text


@pytest.mark.slow
def test_packed_rules_run_every_run_once_under_names_that_stay(tmp_path: Path) -> None:
    """Two packs of one experiment (one dataset with a grid of its own) through `snakemake`:
    every run's files with its exact LR, one job and one log per pack and dataset under the
    pack's name; then datasets reordered and another experiment added: the same rules, and
    nothing to redo."""
    long_lr = 0.0123456789
    sgd = {
        "datasets": ["demo-stripes", "demo-blobs"],
        "configurations": ["head", "mha"],
        "lrs": [0.05],
        "lrs_by_dataset": {"demo-stripes": [0.05, long_lr]},
        "seeds": [0],
    }
    edit = {"finetune": {"pack_runs": True}, "experiments": {"sgd": sgd}}
    edit_file = tmp_path / "edit.yaml"
    edit_file.write_text(yaml.safe_dump(edit))
    packs = [
        pack for pack in finetune_packs(merged(*PRESETS, edit=edit)) if pack.experiment == "sgd"
    ]
    assert [pack.datasets for pack in packs] == [("demo-stripes",), ("demo-blobs",)]
    cells = "results/demo/finetune/sgd/demo_vit"
    targets = [
        f"{cells}/{dataset}/{run_dir}/summary.json"
        for pack in packs
        for dataset in pack.datasets
        for run_dir in pack.run_dirs
    ]
    assert len(targets) == 4 + 2

    result = snakemake(tmp_path, *targets, extra_configfiles=(edit_file,))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    jobs = planned_jobs(result)
    assert {rule: jobs[rule] for rule in jobs if "finetune" in rule} == {
        pack.name: 1 for pack in packs
    }
    for pack in packs:
        (dataset,) = pack.datasets
        assert (
            tmp_path / f"results/demo/logs/finetune/sgd/demo_vit/{dataset}/{pack.name}.log"
        ).is_file()
        for configuration, lr, seed in pack.runs:
            run_dir = tmp_path / cells / dataset / f"{configuration}/lr{lr:g}_seed{seed}"
            summary = json.loads((run_dir / "summary.json").read_text())
            assert (summary["configuration"], summary["lr"], summary["seed"]) == (
                configuration,
                lr,
                seed,
            )
            assert (run_dir / "metrics.parquet").is_file()

    # The experiment's datasets reordered and another experiment added.
    sgd["datasets"] = ["demo-blobs", "demo-stripes"]
    edit["experiments"]["extra"] = {
        "optimizer": "sgd",
        "models": ["demo_vit"],
        "datasets": ["demo-palette"],
        "configurations": ["ln1"],
        "lrs": [0.1],
        "seeds": [0],
    }
    edit_file.write_text(yaml.safe_dump(edit))
    moved = [
        pack for pack in finetune_packs(merged(*PRESETS, edit=edit)) if pack.experiment == "sgd"
    ]
    assert sorted(pack.name for pack in moved) == sorted(pack.name for pack in packs)
    again = snakemake(tmp_path, "-n", *targets, extra_configfiles=(edit_file,))
    assert planned_jobs(again) == {}


@pytest.mark.slow
def test_packs_are_refused_on_a_cluster_executor_before_any_job(tmp_path: Path) -> None:
    """A pack's content-derived rule name gets none of the profile's GPU requests: on a
    cluster executor the workflow stops before its first submission, saying what to do."""
    packed = tmp_path / "packed.yaml"
    packed.write_text(yaml.safe_dump({"finetune": {"pack_runs": True}}))
    result = snakemake(
        tmp_path, "--executor", "slurm", "--jobs", "1", "all", extra_configfiles=(packed,)
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "finetune.pack_runs: true packs runs for one machine" in output
    assert "slurm/profile.yaml" in output
    assert 'File "' not in output, output[-3000:]  # the message alone, as a config error
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()
