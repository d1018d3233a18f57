"""What made a file: settings, package versions, device and git commit."""

from __future__ import annotations

import functools
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("vitplasticity", "torch", "torchvision", "timm", "polars", "pyarrow", "numpy")


@functools.cache
def git_commit() -> str | None:
    """The commit of the working tree this package runs from, with ``-dirty`` when modified."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def versions() -> dict[str, str]:
    """Installed versions of the packages that shape the numbers."""
    found: dict[str, str] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def device_description(device: Any = None) -> str:
    """A human-readable name of ``device`` (a torch.device or string), e.g. the GPU model."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return f"{dev.type}:{platform.processor() or platform.machine()}"


def provenance(settings: dict[str, Any], device: Any = None) -> dict[str, Any]:
    """The record stored beside every result: resolved settings, versions, device, commit."""
    return {
        "settings": settings,
        "versions": versions(),
        "device": device_description(device),
        "git_commit": git_commit(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
    }
