"""A real single-node SLURM for the tests, and helpers to run Snakemake against it.

The cluster is Debian's slurmctld/slurmd/slurmdbd (with MariaDB, so that `sacct` works),
installed and started by .ci/start_local_slurm.sh and stopped by .ci/stop_local_slurm.sh,
which kills exactly the daemons it recorded by PID. Starting needs root and apt-get; where
either is missing the SLURM tests skip with that reason, except in CI (CI=true) where they
must run and fail instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SLURM_BASE = REPO / ".slurm-local"
START_SCRIPT = REPO / ".ci" / "start_local_slurm.sh"
STOP_SCRIPT = REPO / ".ci" / "stop_local_slurm.sh"

# A test cluster should be polled often: the plugin's defaults (first poll after 40 s) are
# made for real queues.
FAST_POLLING = (
    "--slurm-init-seconds-before-status-checks",
    "1",
    "--seconds-between-status-checks",
    "1",
    "--max-status-checks-per-second",
    "5",
)


def snakemake_env() -> dict[str, str]:
    """The environment for a Snakemake subprocess: the venv's bin first on PATH."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("SLURM_CONF", None)  # clients find the configless copy (see the start script)
    return env


def slurm_responds() -> bool:
    """True when `sinfo` reaches a controller with an idle (or busy) node."""
    if shutil.which("sinfo") is None:
        return False
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10, check=False
        )
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mix", "alloc"))


def why_no_slurm() -> str | None:
    """Why a local SLURM cannot be started here, or None when it can (or already runs)."""
    if slurm_responds():
        return None
    if os.geteuid() != 0:
        return "local SLURM needs root to install and start its daemons (not root here)"
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        return "local SLURM needs Debian's packages: no apt-get and no slurmctld here"
    return None


@dataclass
class LocalSlurm:
    """A running local SLURM; `started_here` says whether stop() should stop its daemons."""

    base: Path = SLURM_BASE
    started_here: bool = False
    start_seconds: float = 0.0
    log: list[str] = field(default_factory=list)

    def start(self) -> None:
        """Start the daemons unless a responsive cluster is already up (idempotent)."""
        if slurm_responds():
            return
        t0 = time.monotonic()
        out = subprocess.run(
            ["bash", str(START_SCRIPT), str(self.base)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        self.start_seconds = time.monotonic() - t0
        self.log.append(out.stdout + out.stderr)
        if out.returncode != 0 or not slurm_responds():
            raise RuntimeError(f"could not start the local SLURM:\n{out.stdout}\n{out.stderr}")
        self.started_here = True

    def stop(self) -> None:
        """Stop the daemons this object started, by their recorded PIDs."""
        if self.started_here:
            subprocess.run(["bash", str(STOP_SCRIPT), str(self.base)], check=False, timeout=60)
            self.started_here = False


def sacct_jobs(job_name: str) -> list[dict[str, str]]:
    """Accounting rows (allocations only, not steps) of every job named `job_name`.

    The SLURM plugin names every job of one Snakemake invocation after its run UUID.
    """
    fields = ["JobID", "State", "ExitCode", "Submit", "Start", "End", "Timelimit", "Comment"]
    out = subprocess.run(
        ["sacct", "-X", "-P", "-n", "--name", job_name, "-o", ",".join(fields)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    rows = [dict(zip(fields, line.split("|"), strict=False)) for line in out.stdout.splitlines()]
    return [row for row in rows if row.get("JobID")]


def wait_for_accounting(job_name: str, expected: int, timeout: float = 30) -> list[dict[str, str]]:
    """sacct rows of `job_name` once `expected` of them have an End time (slurmdbd lags)."""
    deadline = time.monotonic() + timeout
    rows = sacct_jobs(job_name)
    while time.monotonic() < deadline:
        rows = sacct_jobs(job_name)
        if len(rows) >= expected and all(r["End"] not in ("", "Unknown") for r in rows):
            break
        time.sleep(0.5)
    return rows


def run_uuids(snakemake_output: str) -> list[str]:
    """The SLURM run IDs (job names) that the plugin printed, in order."""
    marker = "SLURM run ID: "
    return [
        line.split(marker, 1)[1].strip() for line in snakemake_output.splitlines() if marker in line
    ]


def run_snakemake(
    args: Sequence[str], cwd: Path, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `snakemake <args>` in `cwd`; its stdout and stderr together in `.stdout`."""
    proc = subprocess.run(
        [str(VENV_BIN / "snakemake"), *args],
        cwd=cwd,
        env=snakemake_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}"
        )
    return proc


def start_snakemake(args: Sequence[str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    """Start `snakemake <args>` in its own process group (to signal it and its jobs)."""
    handle = log.open("wb")
    return subprocess.Popen(
        [str(VENV_BIN / "snakemake"), *args],
        cwd=cwd,
        env=snakemake_env(),
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send `sig` to the process group that `start_snakemake` created for `proc`."""
    os.killpg(os.getpgid(proc.pid), sig)


def cpu_workflow_profile(dest: Path, mem_mb: int = 1000) -> Path:
    """The project's workflow profile for a cluster without GPUs, written into `dest`.

    Only two things change: `gpu: 0` (our local SLURM has no GPU gres), and memory requests
    capped at `mem_mb` (its node has a few GB). Everything else, runtime included, is the
    project's.
    """
    profile = yaml.safe_load((REPO / "workflow/profiles/default/profile.yaml").read_text())
    for resources in profile["set-resources"].values():
        if "gpu" in resources:
            resources["gpu"] = 0
            resources.pop("cpus_per_gpu", None)
        if "mem_mb" in resources:
            resources["mem_mb"] = mem_mb
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "profile.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    return dest


def slurm_args(jobs: int = 4) -> list[str]:
    """Command-line options that send a run to the local SLURM through the plugin."""
    return [
        "--executor",
        "slurm",
        "--jobs",
        str(jobs),
        "--latency-wait",
        "10",
        *FAST_POLLING,
        "--default-resources",
        "slurm_partition=debug",
        "mem_mb=500",
        "runtime=10",
    ]
