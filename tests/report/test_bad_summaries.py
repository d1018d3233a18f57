"""Issue 42: a summary.json that ``vitplasticity aggregate`` cannot use is refused with one
line naming the file and the field, and no table is written: NaN or Infinity where a number
must be, or a configuration that is no finetuning configuration. One row per case; a
diverged run's accuracies, dropped from every statistic, may be anything."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli_errors import refusal
from tests.helpers.report_inputs import write_run
from vitplasticity.cli import main
from vitplasticity.report.aggregate import read_summary

# (fields written over a sound summary.json, what the error line must say after the path)
ROWS = [
    pytest.param({"best_val_accuracy": math.nan}, "best_val_accuracy is nan", id="nan-val"),
    pytest.param({"test_accuracy": math.nan}, "test_accuracy is nan", id="nan-test"),
    pytest.param({"lr": math.nan}, "lr is nan", id="nan-lr"),
    pytest.param({"wall_seconds": math.inf}, "wall_seconds is inf", id="infinite-wall"),
    pytest.param({"steps_per_second": math.nan}, "steps_per_second is nan", id="nan-speed"),
    pytest.param(
        {"configuration": "mlp"},
        "configuration: unknown finetuning configuration 'mlp'",
        id="unknown-configuration",
    ),
    pytest.param(
        {"configuration": "mha+attn"},
        "configuration: unknown finetuning configuration 'mha+attn'",
        id="unknown-part-of-a-combination",
    ),
]


def aggregate(tmp_path: Path, summary: Path) -> list[str]:
    out = tmp_path / "out"
    return [
        "aggregate",
        "--experiment",
        "sgd",
        "--summaries",
        str(summary),
        "--runs-out",
        str(out / "runs.parquet"),
        "--selected-out",
        str(out / "selected.parquet"),
    ]


def overwritten(path: Path, fields: dict[str, Any]) -> Path:
    """``path``'s summary with ``fields`` over it (Python's json writes NaN and Infinity)."""
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
    return path


@pytest.mark.parametrize(("fields", "says"), ROWS)
def test_aggregate_refuses_a_summary_naming_its_field(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, fields: dict[str, Any], says: str
) -> None:
    summary = overwritten(write_run(tmp_path / "runs"), fields)
    message = refusal(aggregate(tmp_path, summary), caplog, outputs=tmp_path / "out")
    assert message.startswith(f"{summary}: {says}"), message
    with pytest.raises(ValueError) as error:  # every reader of summaries, not the CLI alone
        read_summary(summary)
    assert str(error.value) == message


def test_a_diverged_runs_nan_accuracy_is_dropped_not_refused(tmp_path: Path) -> None:
    summary = write_run(tmp_path / "runs", diverged=True)
    overwritten(summary, {"best_val_accuracy": math.nan, "test_accuracy": math.nan})
    assert main(aggregate(tmp_path, summary)) == 0
