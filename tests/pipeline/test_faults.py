"""Fault tolerance of a Snakemake run, on a tiny workflow of trivial jobs (tests/slurm/Snakefile)
run locally: injected failures with retries, keep-going, an interrupted (SIGINT) and a killed
(SIGKILL) workflow. The same options are what slurm/profile.yaml sets for the cluster
(retries, keep-going, rerun-incomplete); tests/pipeline/test_slurm.py repeats the kill on the real
finetune rule through SLURM. And the real workflow, run locally as a user would (its workflow
profile found by Snakemake), interrupted by Ctrl-C, then rerun with the same command.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.demo_workflow import workflow_args
from tests.helpers.slurm_harness import REPO, run_snakemake, signal_group, start_snakemake

TINY_SNAKEFILE = REPO / "tests" / "slurm" / "Snakefile"

pytestmark = pytest.mark.slow


def tiny_workflow(tmp_path: Path) -> Path:
    """A fresh directory holding the tiny workflow."""
    shutil.copy(TINY_SNAKEFILE, tmp_path / "Snakefile")
    (tmp_path / "markers").mkdir()
    return tmp_path


def ran(workdir: Path) -> list[int]:
    """Job ids in the order their jobs started (each job appends its id to runs.log)."""
    log = workdir / "runs.log"
    return [int(x) for x in log.read_text().split()] if log.exists() else []


def complete_outputs(workdir: Path, n: int) -> list[int]:
    """Ids whose output holds both lines that a finished job writes."""
    return [
        i
        for i in range(n)
        if (workdir / f"out/{i}.txt").exists()
        and (workdir / f"out/{i}.txt").read_text().split() == ["start", "done"]
    ]


def wait_until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)


def test_a_job_failing_once_is_retried_and_the_workflow_completes(tmp_path: Path) -> None:
    wf = tiny_workflow(tmp_path)
    (wf / "markers/fail_once_2").touch()
    # Control: without retries the injected failure fails the run.
    failed = run_snakemake(["--cores", "1", "--config", "count=4"], wf, check=False)
    assert failed.returncode != 0
    assert 2 not in complete_outputs(wf, 4)

    shutil.rmtree(wf / "out", ignore_errors=True)
    (wf / "runs.log").unlink()
    (wf / "markers/fail_once_2").touch()
    run_snakemake(["--cores", "1", "--config", "count=4", "--retries", "1"], wf)
    assert complete_outputs(wf, 4) == [0, 1, 2, 3]
    assert sorted(ran(wf)) == [0, 1, 2, 2, 3]  # job 2 ran twice, every other once
    assert not (wf / "markers/fail_once_2").exists()


def test_keep_going_leaves_the_others_completed_and_a_rerun_does_only_the_failed_one(
    tmp_path: Path,
) -> None:
    wf = tiny_workflow(tmp_path)
    (wf / "markers/fail_3").touch()
    first = run_snakemake(["--cores", "2", "--config", "count=6", "--keep-going"], wf, check=False)
    assert first.returncode != 0
    assert complete_outputs(wf, 6) == [0, 1, 2, 4, 5]
    assert sorted(ran(wf)) == [0, 1, 2, 3, 4, 5]

    (wf / "markers/fail_3").unlink()  # the cause is fixed
    before = len(ran(wf))
    run_snakemake(["--cores", "2", "--config", "count=6", "--keep-going"], wf)
    assert ran(wf)[before:] == [3]
    assert complete_outputs(wf, 6) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_an_interrupted_workflow_continues_cleanly_on_the_next_invocation(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGINT (Ctrl-C) lets Snakemake clean up; SIGKILL (a lost login node) does not: after
    `--unlock`, --rerun-incomplete (set in slurm/profile.yaml) redoes the job it left half-done."""
    wf = tiny_workflow(tmp_path)
    args = ["--cores", "1", "--config", "count=4", "seconds=1"]
    proc = start_snakemake(args, wf, tmp_path / "first.log")

    def second_job_mid_run() -> bool:
        started = ran(wf)
        return len(started) == 2 and (wf / f"out/{started[1]}.txt").exists()

    # Interrupt while the second job is mid-run: the first is complete, its output half-written.
    wait_until(second_job_mid_run)
    signal_group(proc, sig)
    assert proc.wait(timeout=60) != 0
    first, second = ran(wf)
    assert complete_outputs(wf, 4) == [first]
    if sig == signal.SIGKILL:
        assert (wf / f"out/{second}.txt").read_text().split() == ["start"]  # left half-written

    if sig == signal.SIGKILL:  # a killed Snakemake leaves its lock: docs/slurm.md, "Resume"
        run_snakemake([*args, "--unlock"], wf)
    rerun = run_snakemake([*args, "--rerun-incomplete"], wf)
    assert "Error" not in rerun.stdout
    assert sorted(ran(wf)[2:]) == sorted({0, 1, 2, 3} - {first})  # the first is not redone
    assert complete_outputs(wf, 4) == [0, 1, 2, 3]


# One finetuning run of the demo, long enough to be interrupted mid-run.
ONE_RUN = {
    "datasets": {"demo-stripes": {"steps": 400, "val_every": 100}},
    "finetune": {"checkpoint_every": 10},
    "experiments": {
        "sgd": {"configurations": ["head"], "lrs_by_dataset": {"demo-stripes": [0.05]}}
    },
}


@pytest.mark.parametrize("whom", ["process_group", "snakemake"])
def test_a_local_run_interrupted_by_ctrl_c_completes_when_the_same_command_is_rerun(
    tmp_path: Path, whom: str
) -> None:
    """Ctrl-C in a terminal sends SIGINT to Snakemake and its jobs (process_group); `kill -INT`
    to Snakemake alone lets the jobs end while their outputs stay marked incomplete, which
    Snakemake refuses to build on unless told to rerun them (the workflow profile does)."""
    args = [*workflow_args(tmp_path, ONE_RUN), "--cores", "2", "finetune_all"]
    run_dir = tmp_path / "results/finetune/sgd/demo_vit/demo-stripes/head/lr0.05_seed0"
    proc = start_snakemake(args, REPO, tmp_path / "first.log")
    wait_until(lambda: (run_dir / "checkpoint.pt").exists() or proc.poll() is not None, 300)
    assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    if whom == "process_group":
        signal_group(proc, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=300) != 0
    if whom == "snakemake":
        assert list((tmp_path / ".snakemake/incomplete").iterdir()), "nothing left incomplete"

    rerun = run_snakemake(args, REPO, timeout=600)  # the same command
    stats = rerun.stdout[rerun.stdout.index("Job stats:") :].split("\n\n")[0]
    assert "prepare" not in stats, stats  # the finished dataset is kept
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_step"] == 400, summary
