"""A real single-node SLURM for the tests, and helpers to run Snakemake against it.

The cluster is Debian's slurmctld/slurmd/slurmdbd (with MariaDB, so that `sacct` works),
installed and started by .ci/start_local_slurm.sh and stopped by .ci/stop_local_slurm.sh,
which kills exactly the daemons it recorded by PID. Its node advertises a GPU node's shape
(stand-in GPUs as a GRES, more CPUs and memory than the machine has; see the start script),
so the workflow runs there with the shipped profiles unmodified. Starting needs root and
apt-get; where either is missing the SLURM tests skip with that reason, except in CI
(CI=true) where they must run and fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.repo import REPO

VENV_BIN = Path(sys.executable).parent
SLURM_BASE = REPO / ".slurm-local"
GLOBAL_PROFILE = REPO / "slurm"  # slurm/profile.yaml; the workflow profile is found by Snakemake
WORKFLOW_PROFILE = REPO / "workflow" / "profiles" / "default" / "profile.yaml"
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


def node_gpus() -> int:
    """GPUs (gres/gpu) that the local cluster's nodes advertise, summed (0: none)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%G"], capture_output=True, text=True, timeout=10, check=True
    )
    # %G is e.g. "gpu:2", "gpu:a100:2(S:0)" or "(null)".
    return sum(int(match[1]) for match in re.finditer(r"gpu(?::[\w-]+)?:(\d+)", out.stdout))


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
        """Start the daemons unless a responsive cluster is already up (idempotent).

        Raises:
            RuntimeError: the daemons did not start, or the running cluster has no GPU GRES
                (one started by an older start script: restart it).
        """
        if slurm_responds():
            if node_gpus() == 0:
                raise RuntimeError(
                    "the running local SLURM advertises no GPU GRES (sinfo -o %G); restart it: "
                    f"{STOP_SCRIPT} {self.base} && {START_SCRIPT} {self.base}"
                )
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
    """Accounting rows (allocations only, not steps) of every job named `job_name`: what each
    job asked for (ReqTRES) and got (AllocTRES), its state, times and comment.

    The SLURM plugin names every job of one Snakemake invocation after its run UUID.
    """
    fields = [
        "JobID",
        "State",
        "ExitCode",
        "Submit",
        "Start",
        "End",
        "Timelimit",
        "AllocTRES",
        "ReqTRES",
        "Comment",
    ]
    out = subprocess.run(
        ["sacct", "-X", "-P", "-n", "--name", job_name, "-o", ",".join(fields)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    rows = [dict(zip(fields, line.split("|"), strict=False)) for line in out.stdout.splitlines()]
    return [row for row in rows if row.get("JobID")]


def alloc_tres(row: dict[str, str], column: str = "AllocTRES") -> dict[str, float]:
    """A sacct row's AllocTRES (or another TRES `column`, e.g. ReqTRES) as numbers:
    {"cpu": 8, "gres/gpu": 1, "mem": 48000 (MB), ...}."""
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}
    tres = {}
    for item in filter(None, row[column].split(",")):
        name, value = item.split("=", 1)
        scale = units.get(value[-1], 1)
        tres[name] = float(value.rstrip("KMGT")) * scale
    return tres


def timelimit_minutes(timelimit: str) -> int:
    """sacct's Timelimit ("[D-]HH:MM:SS", "MM:SS") in minutes."""
    days, _, clock = timelimit.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    hours, minutes, seconds = [0] * (3 - len(parts)) + parts
    return (int(days or 0) * 24 + hours) * 60 + minutes + seconds // 60


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


def shipped_profile_args(jobs: int, profile: Path = GLOBAL_PROFILE) -> list[str]:
    """Options running through the shipped slurm/profile.yaml (or `profile`, a folder) and,
    found by Snakemake, the shipped workflow profile, changed only where a test cluster needs
    it: `jobs` at once, status polls every second, a short latency-wait. No partition or
    account: the cluster's default partition takes the jobs."""
    return [
        "--profile",
        str(profile),
        "--jobs",
        str(jobs),
        "--latency-wait",
        "10",
        *FAST_POLLING,
    ]


def node_memory_mb() -> int:
    """The memory (MB) the local cluster's node offers to jobs (sinfo's RealMemory)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%m"], capture_output=True, text=True, timeout=10, check=True
    )
    return min(int(line) for line in out.stdout.split())


def running_jobs(job_name: str, comment_prefix: str) -> list[str]:
    """IDs of the RUNNING jobs named `job_name` whose comment starts with `comment_prefix`
    (the plugin's comment: rule_<rule>_wildcards_...)."""
    out = subprocess.run(
        ["squeue", "-h", "--name", job_name, "-t", "RUNNING", "-o", "%i %k"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows = [line.split(maxsplit=1) for line in out.stdout.splitlines() if line.strip()]
    return [row[0] for row in rows if len(row) == 2 and row[1].startswith(comment_prefix)]
