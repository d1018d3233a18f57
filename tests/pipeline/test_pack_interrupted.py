"""The demo's packed finetuning (finetune.pack_runs: one job runs a cell's runs) interrupted
locally after some of its runs, the job group killed (SIGKILL to Snakemake and its jobs, the
case that leaves most behind: Snakemake's lock, its incomplete markers, half-written
temporaries), then the same command again: the interrupted job's outputs are deleted, the
pack puts back the runs it had finished (vitplasticity.finetune.finished) and trains only the
others, the interrupted one from its checkpoint; the results equal an uninterrupted run's.

Ctrl-C and SIGTERM are tested on the pack's own process in tests/finetune/test_pack.py (the
same command after each, without Snakemake): through Snakemake they differ only in what
Snakemake does to the outputs, which that test does by hand."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.demo_workflow import summaries, tables, workflow_args
from tests.helpers.slurm_harness import REPO, run_snakemake, signal_group, start_snakemake

pytestmark = pytest.mark.slow

CONFIGURATIONS = ["mha", "ln1", "fc1", "head"]
# One pack of four runs, each long enough to be caught mid-run (a checkpoint every 5 steps).
FOUR_RUNS = {
    "finetune": {"pack_runs": True, "checkpoint_every": 5},
    "datasets": {"demo-stripes": {"steps": 60, "val_every": 30}},
    "experiments": {
        "sgd": {"configurations": CONFIGURATIONS, "lrs_by_dataset": {"demo-stripes": [0.05]}}
    },
}
CELL = "results/finetune/sgd/demo_vit/demo-stripes"
TRAINED = re.compile(r"finetune\.setup: run (\S+):")


def pack_log(workdir: Path) -> Path:
    (log,) = (workdir / "results/logs/finetune/sgd/demo_vit/demo-stripes").glob("*.log")
    return log


def test_a_rerun_trains_only_the_runs_the_killed_pack_did_not_finish(tmp_path: Path) -> None:
    args = [*workflow_args(tmp_path, FOUR_RUNS), "--cores", "2", "finetune_all"]
    folders = [tmp_path / CELL / f"{c}/lr0.05_seed0" for c in CONFIGURATIONS]
    proc = start_snakemake(args, REPO, tmp_path / "first.log")
    deadline = time.monotonic() + 600
    while not (folders[2] / "checkpoint.pt").exists():
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the third run wrote no checkpoint"
        time.sleep(0.05)
    signal_group(proc, signal.SIGKILL)
    assert proc.wait(timeout=300) != 0
    assert all((f / "finished/record.json").is_file() for f in folders[:2])
    assert not (folders[3] / "summary.json").exists()
    run_snakemake([*args, "--unlock"], REPO)  # a killed Snakemake leaves its lock

    rerun = run_snakemake(args, REPO, timeout=600)  # the same command
    assert "Error" not in rerun.stdout, rerun.stdout[-3000:]
    log = pack_log(tmp_path).read_text()
    assert TRAINED.findall(log) == [str(f) for f in folders[2:]], log[-3000:]
    assert log.count("finished by an earlier job") == 2
    assert re.search(rf"resuming {re.escape(str(folders[2]))}/checkpoint.pt from step", log)

    uninterrupted = tmp_path / "uninterrupted"
    uninterrupted.mkdir()
    run_snakemake([*workflow_args(uninterrupted, FOUR_RUNS), "--cores", "2", "finetune_all"], REPO)
    assert summaries(tmp_path / "results") == summaries(uninterrupted / "results")
    ours, theirs = tables(tmp_path / "results"), tables(uninterrupted / "results")
    assert sorted(ours) == sorted(theirs) and all(ours[n].equals(theirs[n]) for n in ours)
    for folder in folders:  # as an uninterrupted run leaves it: no checkpoint, no temporary
        listing = sorted(p.name for p in folder.iterdir())
        assert listing == ["finished", "metrics.parquet", "summary.json"]
