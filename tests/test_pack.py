"""finetune.pack_runs: several runs in one process give each run's own, identical results."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from vitplasticity import cli
from vitplasticity.finetune import TIMING_FIELDS
from vitplasticity.models import ModelSpec

from .test_finetune import cli_args

RUN_FLAGS = ("configuration", "lr", "seed", "out-dir")


def packed_args(spec: ModelSpec, dataset: Path, runs: list[dict]) -> list[str]:
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
    tiny_spec: ModelSpec, demo_dataset: Path, tmp_path: Path
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
    tiny_spec: ModelSpec,
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
    tiny_spec: ModelSpec, demo_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = [*cli_args(tiny_spec, demo_dataset, tmp_path / "x"), "--runs", "[]"]
    assert cli.main(argv) == 2 and "either --runs or" in caplog.text
