"""Atomic writes: the file appears whole or not at all, with the mode of any new file; a
write the system refuses names the file. Reads: a damaged file is named with the remedy."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from tests.helpers.repo import REPO
from tests.helpers.report_inputs import write_grid
from vitplasticity.utils import io


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_get_the_umask_mode(tmp_path, mask):
    previous = os.umask(mask)
    try:
        io.write_json(tmp_path / "a.json", {"x": 1})
        io.write_parquet(tmp_path / "a.parquet", pl.DataFrame({"x": [1]}))
        plain = tmp_path / "plain"
        plain.write_text("")  # what open() gives a new file under this umask
    finally:
        os.umask(previous)
    expected = stat.S_IMODE(plain.stat().st_mode)
    assert expected == 0o666 & ~mask
    for name in ("a.json", "a.parquet"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []


# --- writes the system refuses: one line naming the file, nothing left behind ---------------


def _limit_file_size() -> None:
    """In the child: files may grow to 100 bytes (writes past that fail with EFBIG, as on a
    full disk; Python ignores the SIGXFSZ that comes with it)."""
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))


def _aggregate(tmp_path: Path, out: Path, **popen: Any) -> subprocess.CompletedProcess:
    summaries = write_grid(tmp_path / "runs", datasets=("a",), lrs=(0.01,), seeds=(0,))
    argv = ["aggregate", "--experiment", "sgd", "--summaries", *map(str, summaries)]
    argv += ["--runs-out", str(out / "runs.parquet"), "--selected-out", str(out / "s.parquet")]
    return subprocess.run(
        [sys.executable, "-m", "vitplasticity.cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        **popen,
    )


def test_cli_on_a_full_disk_names_the_file_and_leaves_nothing(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    run = _aggregate(tmp_path, out, preexec_fn=_limit_file_size)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, run.stderr
    assert errors[0].endswith(
        f"cannot write {out / 'runs.parquet'}: disk full (File too large): free space, or "
        "write elsewhere"
    ), errors
    assert list(out.iterdir()) == []


# Issue 42: the writers that make their own temporary files say "disk full" too, naming the
# file, and leave nothing of it: a prepared dataset (vitplasticity prepare) and a finetuning
# checkpoint (save_checkpoint). One row per writer.
def run_limited(argv: list[str]) -> subprocess.CompletedProcess:
    """``python argv`` in a child whose files may not grow past 100 bytes."""
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_file_size,
    )


def prepare(out: Path) -> tuple[list[str], Path]:
    """``vitplasticity prepare`` of the demo's synthetic dataset into ``out/demo``: its first
    split, pool.parquet, is the first file past the limit."""
    spec = yaml.safe_load((REPO / "config/demo.yaml").read_text())["datasets"]["demo-stripes"]
    argv = ["-m", "vitplasticity.cli", "prepare", "--dataset", "demo-stripes"]
    argv += ["--spec", json.dumps(spec), "--out", str(out / "demo")]
    return argv, out / "demo" / "pool.parquet"


CHECKPOINT = """
import sys, torch
from vitplasticity.finetune.checkpoint import save_checkpoint
try:
    save_checkpoint(sys.argv[1], {"trainable": {"w": torch.zeros(100_000)}}, "key")
except OSError as error:
    print(f"ERROR {error}", file=sys.stderr)
    sys.exit(2)
"""


def checkpoint(out: Path) -> tuple[list[str], Path]:
    """A finetuning checkpoint of 400 kB written to ``out/run/checkpoint.pt``."""
    target = out / "run" / "checkpoint.pt"
    return ["-c", CHECKPOINT, str(target)], target


@pytest.mark.parametrize("writer", [prepare, checkpoint])
def test_a_full_disk_names_the_file_and_leaves_nothing(
    tmp_path: Path, writer: Callable[[Path], tuple[list[str], Path]]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    argv, target = writer(out)
    run = run_limited(argv)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, run.stderr
    assert f"cannot write {target}: disk full" in errors[0], errors
    leftovers = [p for p in out.rglob("*") if p.is_file()]
    assert leftovers == [], leftovers


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_cli_on_a_read_only_folder_names_the_file_and_leaves_nothing(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    out.chmod(0o555)
    try:
        run = _aggregate(tmp_path, out)
    finally:
        out.chmod(0o755)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    errors = [line for line in run.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, run.stderr
    assert f"cannot write {out / 'runs.parquet'}: Permission denied" in errors[0]
    assert list(out.iterdir()) == []


def test_failed_write_names_the_target_not_the_temporary_file(tmp_path):
    target = tmp_path / "a" / "out.json"
    (tmp_path / "a").write_text("a file where the folder should be")
    with pytest.raises(io.WriteError) as error:
        io.write_json(target, {"x": 1})
    assert str(error.value).startswith(f"cannot write {target}: ")
    assert (tmp_path / "a").read_text() == "a file where the folder should be"


# --- reading: one error naming the file, what is wrong and the remedy ----------------------


def test_read_parquet_names_a_truncated_file(tmp_path):
    path = tmp_path / "t.parquet"
    io.write_parquet(path, pl.DataFrame({"x": list(range(100))}))
    path.write_bytes(path.read_bytes()[:-50])
    with pytest.raises(io.UnreadableFileError) as error:
        io.read_parquet(path)
    assert str(error.value) == (
        f"{path}: a truncated Parquet file (its footer is missing); "
        f"delete {path} and rerun: the workflow writes it again"
    )
    with pytest.raises(io.UnreadableFileError, match=r"footer is missing\); do this"):
        io.read_parquet_table(path, remedy="do this")
    with pytest.raises(io.UnreadableFileError, match="footer is missing"):
        io.read_parquet_metadata(path)


def test_read_parquet_names_an_html_page_a_folder_a_missing_file_and_columns(tmp_path):
    page = tmp_path / "page.parquet"
    page.write_bytes(b"<!DOCTYPE html><html><body>404</body></html>")
    with pytest.raises(io.UnreadableFileError, match="not a Parquet file: it is an HTML page"):
        io.read_parquet(page)
    with pytest.raises(io.UnreadableFileError, match="not a file; give the path of a file"):
        io.read_parquet(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"absent\.parquet: not found"):
        io.read_parquet(tmp_path / "absent.parquet")
    good = tmp_path / "good.parquet"
    io.write_parquet(good, pl.DataFrame({"x": [1]}))
    with pytest.raises(io.UnreadableFileError, match=r"good.parquet: no column\(s\) y"):
        io.read_parquet_table(good, ["x", "y"])
    assert io.read_parquet(good, ["x"]).to_dict(as_series=False) == {"x": [1]}


def test_read_json_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text('{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(io.UnreadableFileError) as error:
        io.read_json(path, remedy="replace it")
    message = str(error.value)
    assert message.startswith(f"{path}: not valid JSON (Expecting value: line 4 column 1")
    assert message.endswith("; replace it")
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(io.UnreadableFileError, match="not valid JSON"):
        io.read_json(path)


def test_stale_temporaries_are_the_files_atomic_path_names(tmp_path: Path) -> None:
    """A process killed inside atomic_path leaves its temporary file: removed, and only it."""
    target = tmp_path / "checkpoint.pt"
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        left = tmp.with_name(tmp.name)  # what a SIGKILL here would leave
        raise RuntimeError("killed")
    left.write_bytes(b"half")  # atomic_path cleans up an exception; a SIGKILL does not
    kept = [tmp_path / name for name in ("summary.json", ".hidden", "x.tmp", ".a.b.tmp")]
    for path in kept:
        path.write_text("{}")
    assert io.remove_stale_temporaries(tmp_path) == [left]
    assert sorted(tmp_path.iterdir()) == sorted(kept)
