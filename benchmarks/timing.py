"""Side-by-side timing: interleaved repetitions, medians, and a device barrier at the edges."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): timing edges only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(
    contenders: dict[str, Callable[[], None]],
    repeats: int,
    device: torch.device,
    warmup: int = 1,
) -> dict[str, dict[str, float | list[float]]]:
    """Time each contender ``repeats`` times, taking turns, and return medians in seconds.

    Taking turns (A, B, A, B, ...) exposes every contender to the same machine load, which
    on a shared machine drifts far more than the difference being measured.

    Returns:
        Per contender: ``median_s`` and every repetition's ``seconds``.
    """
    for _ in range(warmup):
        for call in contenders.values():
            call()
    synchronize(device)
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, call in contenders.items():
            start = time.perf_counter()
            call()
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {
        name: {"median_s": statistics.median(values), "seconds": values}
        for name, values in seconds.items()
    }
