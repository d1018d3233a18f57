"""tests/compare_results.py: what it counts as the same and what as a difference."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.compare_results import compare_trees, main
from vitplasticity.utils.io import write_json, write_parquet


def _tree(root: Path, *, lr: float = 0.1, seconds: float = 1.0, created: str = "t0") -> Path:
    write_parquet(
        root / "finetune/run/metrics.parquet",
        pl.DataFrame({"step": [1, 2], "loss": [0.5, float("nan")]}),
        {"summary": {"lr": lr, "created": created}},
    )
    write_json(root / "finetune/run/summary.json", {"lr": lr, "wall_seconds": seconds})
    write_parquet(
        root / "aggregate/runs.parquet",
        pl.DataFrame({"lr": [lr], "wall_seconds": [seconds]}),
        {"provenance": {"git_commit": created, "host": created}},
    )
    (root / "tables").mkdir(parents=True)
    (root / "tables/t.tex").write_text(f"{lr}\n")
    (root / "figures").mkdir()
    (root / "figures/f.png").write_bytes(created.encode())
    (root / "logs").mkdir()
    (root / "logs/x.log").write_text(created)
    return root


def _verdicts(before: Path, after: Path) -> dict[str, str]:
    return {name: verdict for name, verdict in compare_trees(before, after) if verdict != "same"}


def test_volatile_fields_logs_and_figure_bytes_do_not_count(tmp_path: Path) -> None:
    before = _tree(tmp_path / "a")
    after = _tree(tmp_path / "b", seconds=7.5, created="t1")
    assert _verdicts(before, after) == {}
    assert main([str(before), str(after)]) == 0


def test_a_changed_number_anywhere_is_found(tmp_path: Path) -> None:
    before = _tree(tmp_path / "a")
    after = _tree(tmp_path / "b", lr=0.1000001)
    verdicts = _verdicts(before, after)
    assert set(verdicts) == {
        "finetune/run/metrics.parquet",  # its footer's summary
        "finetune/run/summary.json",
        "aggregate/runs.parquet",
        "tables/t.tex",
    }
    assert "lr" in verdicts["aggregate/runs.parquet"]
    assert main([str(before), str(after)]) == 1


def test_missing_and_added_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    before = _tree(tmp_path / "a")
    after = tmp_path / "b"
    shutil.copytree(before, after)
    (after / "figures/f.png").unlink()
    (after / "tables/t.csv").write_text("lr\n0.1\n")
    assert _verdicts(before, after) == {"figures/f.png": "missing", "tables/t.csv": "added"}
    assert main([str(before), str(after)]) == 1
    assert "1 added" in capsys.readouterr().out


def test_parquet_data_difference_names_the_column(tmp_path: Path) -> None:
    before = _tree(tmp_path / "a")
    after = tmp_path / "b"
    shutil.copytree(before, after)
    frame = pl.read_parquet(after / "finetune/run/metrics.parquet")
    write_parquet(
        after / "finetune/run/metrics.parquet",
        frame.with_columns(pl.col("loss").fill_nan(0.0)),
        {"summary": {"lr": 0.1, "created": "t0"}},
    )
    assert _verdicts(before, after) == {
        "finetune/run/metrics.parquet": "data differ in column(s) loss"
    }


def test_ignored_keys_are_left_out(tmp_path: Path) -> None:
    before = _tree(tmp_path / "a")
    after = tmp_path / "b"
    shutil.copytree(before, after)
    write_json(after / "finetune/run/summary.json", {"lr": 0.1, "weights": {"source": "x"}})
    assert main([str(before), str(after)]) == 1
    assert main([str(before), str(after), "--ignore", "weights"]) == 0
