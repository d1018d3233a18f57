"""Resumable finetuning checkpoints: written atomically, checked against the run's settings.

A checkpoint holds what a run needs to continue bit for bit: the trainable parameters (the
frozen ones are rebuilt identically from the model spec and the seed), the optimizer state,
the step (which fixes the learning-rate schedule and the data order, see
:mod:`vitplasticity.data.loader`), the global RNG states, the metric rows so far, the
best-validation record and the wall time spent. A fingerprint of the settings guards
against resuming a checkpoint that another configuration wrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from vitplasticity.utils.io import atomic_path

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def fingerprint(settings: dict[str, Any]) -> str:
    """A stable hash of the settings that shape a run's numbers."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


def rng_states() -> dict[str, Any]:
    """The global torch RNG states (CPU and every CUDA device)."""
    states: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` captured."""
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(path: str | os.PathLike[str], state: dict[str, Any], key: str) -> None:
    """Write ``state`` atomically, tagged with the settings fingerprint ``key``.

    Raises:
        WriteError: the write failed (a full disk: "disk full"), naming ``path``; nothing of
            it is left behind.
    """
    with atomic_path(path) as tmp, tmp.open("wb") as handle:
        try:
            torch.save({"format": FORMAT_VERSION, "fingerprint": key, **state}, handle)
        except RuntimeError as error:
            # torch's writer reports a failed write of the file object as a RuntimeError of
            # its own ("unexpected pos"), the system's OSError (ENOSPC, EFBIG) as its context:
            # raised as that, atomic_path names the file and the reason.
            if isinstance(error.__context__, OSError):
                raise error.__context__ from error
            raise


def load_checkpoint(
    path: str | os.PathLike[str], key: str, map_location: str | torch.device = "cpu"
) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if there is one written with settings ``key``, else None.

    A checkpoint from other settings (or an older format) is not resumed: a warning says so
    and the run starts afresh (the stale file is overwritten by the first new checkpoint).
    """
    path = Path(path)
    if not path.is_file():
        return None
    state = torch.load(path, map_location=map_location, weights_only=True)
    if state.get("format") != FORMAT_VERSION or state.get("fingerprint") != key:
        log.warning("%s was written by other settings; starting afresh", path)
        return None
    return state


def restore_run(
    state: Any,
    saved: dict[str, Any],
    trainable: Iterable[tuple[str, torch.nn.Parameter]],
    optimizer: torch.optim.Optimizer,
    path: str | os.PathLike[str],
) -> None:
    """Restore the checkpoint ``saved`` (read from ``path``) into a run: its trained
    parameters into ``trainable``, its optimizer and RNG states, and into ``state`` (an image
    or text run's progress) its rows, best point, step, earlier wall time and tracker runs."""
    with torch.no_grad():
        for name, parameter in trainable:
            parameter.copy_(saved["trainable"][name])
    optimizer.load_state_dict(saved["optimizer"])
    restore_rng_states(saved["rng"])
    state.rows, state.best = saved["rows"], saved["best"]
    state.start_step, state.wall_before = saved["step"], saved["wall_seconds"]
    # The tracker runs (utils.tracking) the resumed run continues; none before they existed.
    state.tracker_runs = saved.get("tracker_runs", {})
    state.resumed = True
    log.info("resuming %s from step %d", path, state.start_step)


def remove_checkpoint(path: str | os.PathLike[str]) -> None:
    """Delete the checkpoint of a finished run."""
    Path(path).unlink(missing_ok=True)
