"""A SLURM group job (the profile's packing block: several finetuning runs in one SLURM job)
cancelled with scancel after some of its runs, then the same command again, on the local
SLURM of tests/helpers/slurm_harness.py.

Snakemake deletes the outputs of every job of a failed group job, the finished runs' too; each
finished run's verified copy (vitplasticity.finetune.finished, outside the declared outputs)
survives, so the rerun puts those runs back, resumes the interrupted one from its checkpoint
and trains the rest, and nothing else reruns (its SLURM jobs are the group's); the results equal
an uninterrupted run's."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.demo_workflow import summaries, tables, workflow_args
from tests.helpers.slurm_harness import (
    GLOBAL_PROFILE,
    REPO,
    LocalSlurm,
    packing_block,
    run_snakemake,
    run_uuids,
    shipped_profile_args,
    start_snakemake,
    wait_for_accounting,
)
from vitplasticity.finetune import finished

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CONFIGURATIONS = ["mha", "ln1", "fc1", "head"]
# Four runs, long enough to be caught mid-run (a checkpoint every 5 steps, then 55 steps to
# go: seconds, where the test polls every 0.05 s), short enough to keep CI's time down.
FOUR_RUNS = {
    "finetune": {"checkpoint_every": 5},
    "datasets": {"demo-stripes": {"steps": 60, "val_every": 30}},
    "experiments": {
        "sgd": {"configurations": CONFIGURATIONS, "lrs_by_dataset": {"demo-stripes": [0.05]}}
    },
}
CELL = "finetune/sgd/demo_vit/demo-stripes"


def freeze_processes_of(run_folder: Path) -> list[int]:
    """Stop (SIGSTOP) every process whose command line names `run_folder` (the run's finetune
    process and its shell) and wait until each is stopped; their PIDs."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run_folder).encode() in cmdline.read_bytes():
                pid = int(cmdline.parent.name)
                os.kill(pid, signal.SIGSTOP)
                pids.append(pid)
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
    deadline = time.monotonic() + 30
    while any(process_state(pid) not in ("T", None) for pid in pids):
        assert time.monotonic() < deadline, "a stopped process did not stop"
        time.sleep(0.01)
    return pids


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat ("T" when stopped), None once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def one_group_profile(folder: Path) -> Path:
    """The shipped profile with its packing block uncommented, the four runs in one group."""
    shipped = yaml.safe_load((GLOBAL_PROFILE / "profile.yaml").read_text())
    block = packing_block((GLOBAL_PROFILE / "profile.yaml").read_text())
    block["group-components"] = ["finetune_pack=4"]
    folder.mkdir()
    (folder / "profile.yaml").write_text(yaml.safe_dump({**shipped, **block}))
    return folder


def test_a_cancelled_group_job_keeps_its_finished_runs(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    profile = one_group_profile(tmp_path / "profile")
    # No retry, so that the cancelled group job fails the first run.
    args = [
        *workflow_args(tmp_path, FOUR_RUNS),
        *shipped_profile_args(jobs=2, profile=profile),
        "--retries",
        "0",
        "finetune_all",
    ]
    folders = {c: tmp_path / "results" / CELL / c / "lr0.05_seed0" for c in CONFIGURATIONS}
    logs = {c: tmp_path / f"results/logs/{CELL}/{c}/lr0.05_seed0.log" for c in CONFIGURATIONS}
    first_log = tmp_path / "first.log"
    proc = start_snakemake(args, REPO, first_log)

    def done() -> list[str]:
        return [c for c, f in folders.items() if (f / "summary.json").exists()]

    def caught() -> list[str]:  # the run in progress past a checkpoint, two runs done
        mid = [c for c, f in folders.items() if (f / "checkpoint.pt").exists()]
        return mid if len(done()) == 2 else []

    def group_job() -> str | None:  # the one SLURM job of the four runs, once it runs
        uuids = run_uuids(first_log.read_text())
        if not uuids:
            return None
        listed = subprocess.run(
            ["squeue", "-h", "--name", uuids[0], "-t", "RUNNING", "-o", "%i %k"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()
        running = [line.split()[0] for line in listed if "finetune_pack" in line]
        assert len(running) <= 1, listed
        return running[0] if running else None

    deadline = time.monotonic() + 900
    job, interrupted_runs = None, []
    while job is None or not interrupted_runs:  # frozen the moment it is caught
        assert proc.poll() is None, first_log.read_text()[-3000:]
        assert len(done()) <= 2, "the group ran past its third run before it was caught"
        assert time.monotonic() < deadline, "the group's third run wrote no checkpoint"
        job = job or group_job()
        interrupted_runs = caught() if job else []
        time.sleep(0.05)
    (interrupted,) = interrupted_runs
    # The run is stopped (SIGSTOP) before it is looked at and cancelled: scancel reaches it
    # after a delay that a loaded machine stretches past the run's remaining steps (CI saw the
    # caught run finish before its cancel). Stopped, it cannot finish; scancel's SIGCONT and
    # SIGTERM then let it write its checkpoint and stop.
    stopped = freeze_processes_of(folders[interrupted])
    assert stopped, f"no process of {folders[interrupted]} to stop"
    # What was caught is kept as it was seen: once cancelled, Snakemake deletes the group's
    # outputs, so a second look finds no run done.
    finished_first = done()
    assert len(finished_first) == 2 and interrupted not in finished_first, finished_first
    subprocess.run(["scancel", job], check=True)
    assert proc.wait(timeout=300) != 0
    # Snakemake deleted the outputs of the whole group, the finished runs' too; their copies
    # stay, outside the outputs.
    assert done() == [], first_log.read_text()[-3000:]
    for name in finished_first:
        assert (folders[name] / finished.KEPT_DIR / finished.RECORD).is_file()
    assert (folders[interrupted] / "checkpoint.pt").is_file()

    rerun = run_snakemake(args, REPO, timeout=900)  # the same command
    assert "Error" not in rerun.stdout, rerun.stdout[-3000:]
    # Nothing else reruns: the rerun's SLURM jobs are the group's alone (not the prepare job).
    (rerun_uuid,) = run_uuids(rerun.stdout)
    submitted = rerun.stdout.count("has been submitted with SLURM jobid")
    rerun_rows = wait_for_accounting(rerun_uuid, submitted)
    assert rerun_rows and all("finetune_pack" in r["Comment"] for r in rerun_rows), rerun_rows
    texts = {c: logs[c].read_text() for c in CONFIGURATIONS}
    trained = sorted(c for c, text in texts.items() if "finetune.setup: run " in text)
    put_back = sorted(c for c, text in texts.items() if "finished by an earlier job" in text)
    assert trained == sorted(set(CONFIGURATIONS) - set(finished_first)), texts
    assert put_back == sorted(finished_first), texts
    assert f"resuming {folders[interrupted]}/checkpoint.pt from step" in texts[interrupted]

    clean = tmp_path / "uninterrupted"
    clean.mkdir()
    run_snakemake([*workflow_args(clean, FOUR_RUNS), "--cores", "2", "finetune_all"], REPO)
    assert summaries(tmp_path / "results") == summaries(clean / "results")
    ours, theirs = tables(tmp_path / "results"), tables(clean / "results")
    assert sorted(ours) == sorted(theirs) and all(ours[n].equals(theirs[n]) for n in ours)
    print(
        f"\ngroup job {job} cancelled after {sorted(finished_first)}, during"
        f" {interrupted}; the rerun trained {trained} and put back {put_back}"
    )
