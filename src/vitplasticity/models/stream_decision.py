"""When a measurement streams its model (``stream: auto``): the model's weights against the
device's free memory, a GPU's, or on a CPU the kernel's available memory capped by the process's
cgroup limit (a SLURM job's)."""

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

STREAM_FRACTION = 0.5
"""``stream: auto`` streams a model whose weights, in the measurement's dtype, would take more
than this fraction of the device's free memory (the rest is for activations)."""


def stream_decision(
    mode: str, spec: ModelSpec, device: torch.device, dtype: torch.dtype
) -> tuple[bool, str]:
    """Whether a measurement of ``spec`` on ``device`` in ``dtype`` streams (``mode``: auto,
    always, never), and why, for the log.

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
        return False, f"measured whole ({why})"
    size = checkpoint_bytes(files, dtype)
    free = free_memory(device)
    stated = f"its weights take {_gib(size)} in {str(dtype).removeprefix('torch.')}"
    if size > STREAM_FRACTION * free:
        return True, f"streamed block by block: {stated}, more than half of {_gib(free)} free"
    return False, f"measured whole: {stated}, at most half of {_gib(free)} free"


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
    """What the process's cgroup memory limit leaves (limit - usage), in the v2 or the v1
    hierarchy (a SLURM job's cgroup); None without a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            files = (root / path.lstrip("/"), "memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            files = (
                root / "memory" / path.lstrip("/"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        folder, limit_file, usage_file = files
        try:
            limit = (folder / limit_file).read_text().strip()
            usage = int((folder / usage_file).read_text())
        except (OSError, ValueError):
            continue
        # v1 writes "no limit" as a page-rounded 2**63 - 1.
        if limit != "max" and int(limit) < 2**62:
            return max(int(limit) - usage, 0)
    return None


def _gib(size: int) -> str:
    return f"{size / 2**30:.2f} GiB"
