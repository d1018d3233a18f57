"""One GPU per local job. The workflow's GPU stages (``vitplasticity finetune``, ``plasticity``,
``recommend``, ``recommend-verify``, on images or text) take their slot first thing
(:func:`hold_slot`, called by the CLI); any other command can run on one through the launcher

    python -m vitplasticity.utils.gpu_slots -- COMMAND [ARG ...]

Snakemake gives local jobs no GPU ids (its issue #281), so on a workstation every job whose
``device: auto`` resolves to ``cuda`` would land on GPU 0. This launcher takes a free device
before COMMAND starts (before it imports torch): one lock file per device in a lock folder,
held with ``flock`` on a file descriptor that COMMAND inherits. The lock lasts exactly as long
as the job's processes, however they end: a killed job's lock is free at once, with no stale
file to clean up. With every device taken it waits, saying on stderr which processes hold them
(pid and host), at most :data:`WAIT_VARIABLE` seconds (default 6 hours), then gives up with
that message. It then sets ``CUDA_VISIBLE_DEVICES`` to
the device and :data:`SLOT_VARIABLE` to the same id (the results' provenance records it), and
replaces itself with COMMAND (``exec``): COMMAND gets the job's signals and gives its exit
status.

Nothing changes under SLURM (``SLURM_JOB_ID`` set: SLURM sets ``CUDA_VISIBLE_DEVICES`` per
job), where no device is found, or for a job whose ``--device`` is the CPU. A
``CUDA_VISIBLE_DEVICES`` entry that is neither a device index nor a GPU id is an error. ``snakemake --resources gpu=N`` keeps Snakemake from
starting more GPU jobs than devices (the workflow profile gives the GPU rules ``gpu: 1``);
the locks make sure that each of them gets its own.

Import-light on purpose (no torch): it runs before every GPU job.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

SLOT_VARIABLE = "VITPLASTICITY_GPU_SLOT"
"""The environment variable that tells a job which device id its slot gave it."""

LOCK_DIR_VARIABLE = "VITPLASTICITY_GPU_LOCK_DIR"
"""Where the lock files are; the default is per working directory (one workflow). Point
several workflows on one machine at the same folder to share its GPUs between them."""

DEFAULT_LOCK_DIR = ".snakemake/gpu-slots"

WAIT_VARIABLE = "VITPLASTICITY_GPU_WAIT_SECONDS"
"""How long a job waits for a free GPU before it gives up (seconds; docs/configuration.md)."""

DEFAULT_WAIT_SECONDS = 6 * 3600.0

# What CUDA_VISIBLE_DEVICES may list: device indices, or GPU and MIG ids as nvidia-smi -L
# prints them (GPU-<uuid>, MIG-<uuid> or MIG-GPU-<uuid>/<gi>/<ci>).
_DEVICE_ENTRY = re.compile(r"\d+|(GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")

# A loaded NVIDIA driver creates these; without them torch cannot see a GPU either, and the
# fallback query (which imports torch, seconds) is skipped.
DRIVER_NODES = ("/dev/nvidiactl", "/dev/kfd")

_DRIVER_LINE = re.compile(r"^GPU (\d+):", re.MULTILINE)
_TORCH_COUNT = "import torch; print(torch.cuda.device_count())"


def visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The devices ``CUDA_VISIBLE_DEVICES`` names, in order; None when it is unset.

    An empty value hides every GPU (``[]``). As in CUDA, a negative index ends the list.

    Raises:
        ValueError: naming the variable and the entry that is neither a device index nor a
            GPU id (CUDA would silently stop there; a job would take a slot named by it).
    """
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    devices = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry or re.fullmatch(r"-\d+", entry):
            break
        if not _DEVICE_ENTRY.fullmatch(entry):
            raise ValueError(
                f"CUDA_VISIBLE_DEVICES={value!r}: {entry!r} is neither a device index (0, 1,"
                " ...) nor a GPU id (GPU-... or MIG-..., as nvidia-smi -L lists them)"
            )
        devices.append(entry)
    return devices


def driver_devices(driver_nodes: Sequence[str] = DRIVER_NODES) -> list[str]:
    """The GPU indices the driver reports: ``nvidia-smi -L``, else torch's device count
    (queried in a subprocess, so that this process stays free of torch); [] without a driver."""
    try:
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        return _DRIVER_LINE.findall(listing)
    except (OSError, subprocess.SubprocessError):
        pass
    if not any(os.path.exists(node) for node in driver_nodes):
        return []
    try:
        count = subprocess.run(
            [sys.executable, "-c", _TORCH_COUNT],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.split()[-1]
        return [str(index) for index in range(int(count))]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []


def find_devices(environ: Mapping[str, str]) -> list[str]:
    """The devices a local job may take: ``CUDA_VISIBLE_DEVICES`` when set, else the driver's."""
    listed = visible_devices(environ)
    return driver_devices() if listed is None else listed


def lock_dir(environ: Mapping[str, str]) -> Path:
    """The folder of the lock files: :data:`LOCK_DIR_VARIABLE`, else :data:`DEFAULT_LOCK_DIR`."""
    return Path(environ.get(LOCK_DIR_VARIABLE) or DEFAULT_LOCK_DIR)


def lock_path(folder: Path, device: str) -> Path:
    """The lock file of ``device`` (an index or a UUID) in ``folder``."""
    return folder / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', device)}.lock"


def try_slot(folder: Path, device: str) -> int | None:
    """A descriptor holding ``device``'s lock (inheritable, with this process's id and host
    written in the file for whoever waits), or None when another process holds it."""
    fd = os.open(lock_path(folder, device), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    os.set_inheritable(fd, True)
    return fd


def holder(folder: Path, device: str) -> str:
    """Who holds ``device``'s lock, as its file records it: ``pid 42 on host h`` (the job
    that took it; a process it started may hold it now)."""
    try:
        pid, _, host = lock_path(folder, device).read_text().strip().partition(" ")
    except OSError:
        pid, host = "", ""
    if not pid:
        return "an unrecorded process"
    return f"pid {pid}" + (f" on host {host}" if host else "")


def wait_seconds(environ: Mapping[str, str]) -> float:
    """How long a job waits for a GPU: :data:`WAIT_VARIABLE`, else 6 hours.

    Raises:
        ValueError: naming the variable when it is not a number of seconds above 0.
    """
    value = environ.get(WAIT_VARIABLE)
    if not value:
        return DEFAULT_WAIT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0:
        raise ValueError(f"{WAIT_VARIABLE}={value!r}: expected a number of seconds above 0")
    return seconds


def _taken(devices: Sequence[str], folder: Path) -> str:
    """The devices and who holds each, for a job that waits."""
    held = "; ".join(f"GPU {device} by {holder(folder, device)}" for device in devices)
    return f"all {len(devices)} GPUs are taken by other jobs ({held}; locks in {folder})"


def take_slot(
    devices: Sequence[str],
    folder: Path,
    poll_seconds: float = 0.2,
    max_poll_seconds: float = 5.0,
    timeout_seconds: float = DEFAULT_WAIT_SECONDS,
) -> tuple[str, int]:
    """The first free device of ``devices`` and the descriptor that holds it, waiting (polls
    growing from ``poll_seconds`` to ``max_poll_seconds``, at most ``timeout_seconds``) while
    all are taken; on stderr, once, which processes hold them.

    Raises:
        TimeoutError: after ``timeout_seconds`` without a free device, naming the holders.
        OSError: when the lock folder cannot be created or written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_seconds
    wait, announced = poll_seconds, False
    while True:
        for device in devices:
            fd = try_slot(folder, device)
            if fd is not None:
                return device, fd
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"no GPU free after {timeout_seconds:g} s: {_taken(devices, folder)}; end the"
                f" holder if it is a leftover, or set {WAIT_VARIABLE} to wait longer"
            )
        if not announced:
            print(
                f"gpu_slots: {_taken(devices, folder)}; waiting for one, at most"
                f" {timeout_seconds:g} s ({WAIT_VARIABLE})",
                file=sys.stderr,
                flush=True,
            )
            announced = True
        time.sleep(min(wait, max(deadline - time.monotonic(), 0.0)))
        wait = min(wait * 1.5, max_poll_seconds)


def resources_advice(environ: Mapping[str, str], gpu_resource_given: bool) -> str | None:
    """What to tell someone who starts a local run on a machine with several GPUs without
    ``--resources gpu=N``; None where there is nothing to say (SLURM, 0 or 1 GPU, given)."""
    if gpu_resource_given or "SLURM_JOB_ID" in environ:
        return None
    devices = find_devices(environ)
    if len(devices) < 2:
        return None
    return (
        f"{len(devices)} GPUs found ({', '.join(devices)}). Each GPU job takes one of them;"
        f" to run {len(devices)} GPU jobs at once, each on its own GPU, add"
        f" `--resources gpu={len(devices)}` before the targets (e.g. snakemake --resources"
        f" gpu={len(devices)} --cores all all). Without it, GPU jobs beyond {len(devices)} wait"
        " for a free GPU while holding a core."
    )


def claim(env: dict[str, str]) -> int | None:
    """Take a free GPU slot for a job that runs with ``env``: set its ``CUDA_VISIBLE_DEVICES``
    and :data:`SLOT_VARIABLE` to the device, and return the descriptor holding the lock (the
    slot lasts as long as it stays open). None, ``env`` unchanged, under SLURM, where no device
    is found, or where ``env`` already names a slot (a job launched through :func:`launch`).

    Raises:
        ValueError: naming the variable, for a bad ``CUDA_VISIBLE_DEVICES`` or
            :data:`WAIT_VARIABLE`.
        TimeoutError: as :func:`take_slot`.
        OSError: naming the lock folder when it cannot be written.
    """
    if "SLURM_JOB_ID" in env or SLOT_VARIABLE in env:
        return None
    devices = find_devices(env)
    if not devices:
        return None
    folder, timeout = lock_dir(env), wait_seconds(env)
    try:
        device, held = take_slot(devices, folder, timeout_seconds=timeout)
    except TimeoutError:
        raise
    except OSError as error:
        raise OSError(
            f"GPU lock folder {folder}: {error}; set {LOCK_DIR_VARIABLE} to a writable folder"
        ) from error
    env["CUDA_VISIBLE_DEVICES"] = device
    env[SLOT_VARIABLE] = device
    return held


_HELD: list[int] = []  # the slot this process holds: open until the process ends


def runs_on_a_gpu(device: str | None) -> bool:
    """Whether a job asking for ``device`` (its ``--device``: auto, cuda, cuda:1, cpu, ...;
    None: not said) may run on a GPU, and so needs a slot."""
    return device is None or device == "auto" or device.split(":")[0] == "cuda"


def hold_slot(device: str | None = None) -> str | None:
    """Take a GPU slot for the rest of this process (:func:`claim` on ``os.environ``), before
    torch is imported; the device id, or None where no slot applies (also for a job whose
    ``device`` is not a GPU: it neither queues for one nor records one). What the GPU stages'
    commands call first, so that the workflow's rules need no launcher in their commands.

    Raises:
        ValueError, TimeoutError, OSError: as :func:`claim`.
    """
    if not runs_on_a_gpu(device):
        return None
    env = dict(os.environ)
    held = claim(env)
    if held is None:
        return None
    _HELD.append(held)
    os.environ["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]
    os.environ[SLOT_VARIABLE] = env[SLOT_VARIABLE]
    return env[SLOT_VARIABLE]


def launch(command: Sequence[str], environ: Mapping[str, str]) -> None:
    """Replace this process with ``command``, on a GPU slot of its own where one applies
    (for commands other than the workflow's own, which take theirs: :func:`hold_slot`).

    Raises:
        ValueError, TimeoutError: as :func:`claim`.
        OSError: naming the lock folder when it cannot be written, or ``command`` when it
            cannot be executed.
    """
    env = dict(environ)
    claim(env)
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as error:
        raise OSError(f"cannot run {command[0]!r}: {error.strerror or error}") from error


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``python -m vitplasticity.utils.gpu_slots -- COMMAND [ARG ...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(
            "usage: python -m vitplasticity.utils.gpu_slots -- COMMAND [ARG ...]", file=sys.stderr
        )
        return 2
    try:
        launch(args, os.environ)
    except (OSError, ValueError) as error:
        print(f"gpu_slots: {error}", file=sys.stderr)
        return 127
    return 0  # not reached: launch replaced this process


if __name__ == "__main__":
    sys.exit(main())
