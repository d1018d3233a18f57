"""The workflow end to end through `snakemake`, on the mini preset, in a temporary directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[1]
PRESETS = [
    REPO / "config.yaml",
    REPO / "workflow/presets/demo.yaml",
    REPO / "tests/presets/mini.yaml",
]

pytestmark = pytest.mark.slow


def snakemake(
    workdir: Path, *args: str, extra_configfiles: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess:
    """Run snakemake on the repository's Snakefile inside ``workdir``."""
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    command = [
        str(bindir / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        *map(str, PRESETS),
        *map(str, extra_configfiles),
        "--cores",
        "2",
        *args,
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Job counts of a dry run ({} when nothing is to be done)."""
    text = result.stdout + result.stderr
    if "Job stats:" not in text:
        return {}
    table = text[text.index("Job stats:") :].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The mini preset run to completion once for the module's tests."""
    workdir = tmp_path_factory.mktemp("workflow")
    result = snakemake(workdir, "all")
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    return workdir


def test_every_stage_produced_its_files(finished_run: Path) -> None:
    results = finished_run / "results/demo"
    pairs = pl.read_parquet(results / "plasticity/demo_vit/demo-stripes.parquet")
    assert set(pairs["component"]) == {"ln1", "mha", "ln2", "fc1", "fc2"}
    assert pairs.height == 64 * 3 * 5  # pairs x blocks x components, embedding protocol
    summary = json.loads(
        next(
            (results / "finetune/sgd/demo_vit/demo-stripes/mha").glob("*/summary.json")
        ).read_text()
    )
    assert summary["demo"] is True and summary["status"] in {"completed", "diverged"}
    runs = pl.read_parquet(results / "aggregate/runs.parquet")
    assert runs.height == 2 * 3 + 2  # sgd: 2 datasets x 3 configurations; adam: 1 x 2


def test_nothing_reruns_on_an_unchanged_config(finished_run: Path) -> None:
    assert planned_jobs(snakemake(finished_run, "-n", "all")) == {}


def test_editing_one_key_reruns_only_what_depends_on_it(finished_run: Path, tmp_path: Path) -> None:
    edit = tmp_path / "edit.yaml"
    edit.write_text("plasticity:\n  n_pairs: 32\n")
    jobs = planned_jobs(snakemake(finished_run, "-n", "all", extra_configfiles=(edit,)))
    assert jobs.get("plasticity") == 2
    assert "finetune" not in jobs and "prepare" not in jobs and "reference" not in jobs

    edit.write_text("datasets:\n  demo-blobs:\n    steps: 12\n")
    jobs = planned_jobs(snakemake(finished_run, "-n", "all", extra_configfiles=(edit,)))
    assert jobs.get("finetune") == 3  # the sgd runs on demo-blobs; adam runs only on demo-stripes
    assert "plasticity" not in jobs and "prepare" not in jobs
