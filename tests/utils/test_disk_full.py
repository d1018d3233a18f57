"""Issue 42: a write that fails for lack of space ends with one line naming the file and
"disk full", and leaves nothing of it behind: a prepared dataset (``vitplasticity prepare``)
and a finetuning checkpoint (``save_checkpoint``). The writes fail for real: each runs in a
child whose files may not grow past a few bytes (RLIMIT_FSIZE: a write past it fails with
EFBIG, as on a full disk; Python ignores the SIGXFSZ that comes with it). One row per
writer."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.helpers.repo import REPO

LIMIT = 2_000  # bytes: less than a prepared split or a checkpoint, more than the code needs


def _limit_file_size() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def run_limited(argv: list[str]) -> subprocess.CompletedProcess:
    """``python argv`` in a child whose files may not grow past LIMIT bytes."""
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
