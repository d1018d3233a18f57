"""When a measurement streams its model (``stream: auto``): the model's weights against the
free memory of the device it is measured on, and of the host, where the whole model is built
before it moves to a GPU. A GPU's free memory is its own; the host's is the kernel's available
memory capped by the process's cgroup limit (a SLURM job's: the workflow's memory request,
vitplasticity.workflow.memory, which derives it from the same checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from vitplasticity.models.checkpoint_tensors import (
    NotStreamable,
    checkpoint_bytes,
    checkpoint_files,
)
from vitplasticity.models.spec import ModelSpec

CPU = torch.device("cpu")

STREAM_FRACTION = 0.5
"""``stream: auto`` streams a model whose weights would take more than this fraction of the free
memory of the host or of the GPU it is measured on (the rest is for activations and the copies
a build makes)."""

BUILD_DTYPE = torch.float32
"""The dtype the families build a whole model in on the host (timm's float32 parameters; the
transformers loader's float32, :mod:`.hf_build`) before it is cast to the measurement's dtype:
the host holds the weights in this dtype, or in the measurement's when that is wider (a float64
measurement on the CPU; on a GPU the cast happens as the weights move, so that this counts twice
what a float64 GPU measurement's host holds: the safe side)."""


def host_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a whole model's weights take on the host, measured in ``dtype``: the wider
    of :data:`BUILD_DTYPE` and ``dtype``."""
    size = torch.empty((), dtype=dtype).element_size()
    return dtype if size > torch.empty((), dtype=BUILD_DTYPE).element_size() else BUILD_DTYPE


def stream_decision(
    mode: str, spec: ModelSpec, device: torch.device, dtype: torch.dtype
) -> tuple[bool, str]:
    """Whether a measurement of ``spec`` on ``device`` in ``dtype`` streams (``mode``: auto,
    always, never), and why (the reason alone: the log and the report say the verdict in
    their own words, :func:`verdict`).

    ``auto`` streams when the weights would take more than :data:`STREAM_FRACTION` of the
    host's free memory (in :func:`host_dtype`), or, on a GPU, of the GPU's (in ``dtype``); the
    log names the memory that decided.

    Raises:
        ValueError: for an unknown mode.
    """
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"stream: expected auto, always or never, got {mode!r}")
    if mode != "auto":
        return mode == "always", f"stream: {mode}"
    try:
        files = checkpoint_files(spec)
    except (NotStreamable, FileNotFoundError) as why:
        return False, str(why)
    # The host first: a GPU measurement builds the whole model there before moving it.
    memories = [(CPU, host_dtype(dtype), "the host")]
    if device.type != "cpu":
        memories.append((device, dtype, str(device)))
    stated = []
    for memory, held, where in memories:
        size, free = checkpoint_bytes(files, held), free_memory(memory)
        streams = size > STREAM_FRACTION * free
        share = "more than half" if streams else "at most half"
        stated.append(f"{_gib(size)} in {_name(held)}, {share} of {_gib(free)} free on {where}")
        if streams:
            return True, f"its weights take {stated[-1]}"
    return False, f"its weights take {' and '.join(stated)}"


def verdict(stream: bool, why: str) -> str:
    """How a measurement ran and why, for the log: ``streamed block by block (why)`` or
    ``measured whole (why)``."""
    return f"{'streamed block by block' if stream else 'measured whole'} ({why})"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def free_memory(device: torch.device) -> int:
    """The bytes free on ``device``: a GPU's free memory, or on the CPU the memory the
    kernel says is available, capped by the process's cgroup limit (a SLURM job's)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    available = _meminfo_available()
    limit = _cgroup_room()
    return available if limit is None else min(available, limit)


def _meminfo_available() -> int:
    """MemAvailable of /proc/meminfo (the page count times the page size elsewhere)."""
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_room() -> int | None:
    """What the process's cgroup memory limit leaves (limit - working set), in the v2 or the
    v1 hierarchy (a SLURM job's cgroup); None without a limit.

    The working set is the usage less the inactive file pages: a cgroup is charged the page
    cache of every file its processes read (a dataset, a checkpoint), which the kernel
    reclaims before it would kill anything, so the usage alone would make a job that has
    read its inputs look full (the kubelet's working set is the same difference).
    """
    root = Path("/sys/fs/cgroup")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            files = (root / path.lstrip("/"), "memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            files = (
                root / "memory" / path.lstrip("/"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
        else:
            continue
        folder, limit_file, usage_file, inactive_key = files
        try:
            limit = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text())
        except (OSError, ValueError):
            continue
        # v1 writes "no limit" as a page-rounded 2**63 - 1.
        if limit != "max" and int(limit) < 2**62:
            return max(int(limit) - usage + _stat(folder / "memory.stat", inactive_key), 0)
    return None


def _stat(path: Path, key: str) -> int:
    """The value of ``key`` in a cgroup's memory.stat (0 where it cannot be read)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
