"""Where the runtime model's sustained throughput comes from (``runtime.image_seconds``):
measured speed first, estimates last.

In order, for a job's model and precision:

1. ``finished``: the finished finetuning runs of the same model (timm id, no ``kwargs``) and
   precision on the same GPU kind in this results tree: the median of their summaries'
   ``images_per_second`` (the training steps' images over their time) on a CUDA device whose
   name contains ``scheduler.gpu_class`` (any CUDA device where that is null);
2. ``gpu_check``: the ``make gpu-check`` JSON named by ``scheduler.gpu_check``: its ViT-B/16
   runs' images/s times their FLOPs per image, a sustained TFLOP/s applied to every model by
   its FLOPs;
3. ``table``: :data:`GPU_CLASS_TFLOPS` for ``scheduler.gpu_class``;
4. ``a100_estimate``: ``runtime.SUSTAINED_TFLOPS``.

The calibration sets only the wall time a job asks for (its ``runtime`` resource), never a
parameter or a command line: changing it reruns nothing. It is read once per workflow
process: the results tree is scanned when the first job's runtime is asked for.

A damaged source never stops the workflow's parse: a summary.json that is not JSON or holds
no usable speed, a gpu-check JSON that is not one, and a speed no GPU can have (not a
positive number, or a sustained rate above the fastest GPU's peak or below
:data:`FLOOR_TFLOPS`) are left out, each named in one of :attr:`Calibration.notes` with what
the requests use instead (the workflow prints them once).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

# Sustained training TFLOP/s (forward + backward, the project's own loop) per GPU class and
# precision. H200: measured (issue 28) with finetune.train.train on ViT-B/16 at 224 px, batch
# 128, all parameters trained: fp32 400 images/s, bf16 2,366 images/s, times 105.147 GFLOP
# per image. tf32 on Hopper: derived, half the bf16 rate (TF32's dense tensor-core peak is
# half bf16's). H100 (SXM): derived, the H200's figures (the same GH100 tensor-core peaks; the
# H200 has faster memory, so this is slightly optimistic). float64 on Hopper: derived, 72% of
# the 34 TFLOP/s fp64 vector peak. A100: the runtime module's estimate (not measured), tf32
# derived as half its bf16 rate (156 vs 312 TFLOP/s peaks).
_VIT_B_GFLOP = Fraction(105_147_150_336, 10**9)
_H200 = {
    "fp32": 400 * _VIT_B_GFLOP / 1000,
    "bf16": 2366 * _VIT_B_GFLOP / 1000,
    "tf32": 2366 * _VIT_B_GFLOP / 2000,
    "float64": Fraction("24.48"),
}
GPU_CLASS_TFLOPS: dict[str, dict[str, Fraction]] = {
    "A100": {
        "fp32": Fraction(14),
        "bf16": Fraction("107.6224"),
        "tf32": Fraction("53.8112"),
        "float64": Fraction(7),
    },
    "H100": dict(_H200),
    "H200": dict(_H200),
}
MEASURED = {("H200", "fp32"), ("H200", "bf16")}
"""The (GPU class, precision) entries of the table that were measured; the rest are derived."""

# What no GPU sustains, as dense training TFLOP/s: above the fastest data-centre GPU's peak
# for the precision (B200: 2,250 bf16, 1,125 tf32, 80 fp32 without tensor cores; H100: 67
# fp64 tensor cores), rounded up; and below FLOOR_TFLOPS, a tenth of a TFLOP/s, slower than
# any CUDA GPU of the last decade. A measured speed outside is a damaged record, not a speed.
PEAK_TFLOPS: dict[str, Fraction] = {
    "bf16": Fraction(2500),
    "tf32": Fraction(1250),
    "fp32": Fraction(100),
    "float64": Fraction(100),
}
FLOOR_TFLOPS = Fraction(1, 10)

GflopPerImage = Callable[[str], Fraction]
"""A model's training GFLOP per image from its timm id (``runtime.train_gflop_per_image``)."""


@dataclass(frozen=True)
class Throughput:
    """One calibration's answer: seconds per training image, and where it came from."""

    image_seconds: Fraction
    source: str  # finished | gpu_check | table | a100_estimate


@dataclass
class Calibration:
    """The measured speeds a workflow's runtime requests use (see the module's docstring).

    Args:
        finished: median images/s of finished runs, by (timm id, precision).
        gpu_check_tflops: sustained TFLOP/s by precision from a gpu-check JSON.
        gpu_class: ``scheduler.gpu_class`` (A100, H100, H200) or None.
    """

    finished: dict[tuple[str, str], float] = field(default_factory=dict)
    gpu_check_tflops: dict[str, Fraction] = field(default_factory=dict)
    gpu_class: str | None = None
    notes: list[str] = field(default_factory=list)
    """Each source left out, one line each: the file, what is wrong, what applies instead."""

    def tflops(self, precision: str) -> tuple[Fraction, str] | None:
        """Sustained TFLOP/s of ``precision`` from the gpu-check JSON or the class table, and
        its source; None: the A100 estimate applies."""
        if precision in self.gpu_check_tflops:
            return self.gpu_check_tflops[precision], "gpu_check"
        if self.gpu_class is not None and precision in GPU_CLASS_TFLOPS[self.gpu_class]:
            return GPU_CLASS_TFLOPS[self.gpu_class][precision], "table"
        return None

    def measured_image_seconds(self, timm_id: str, precision: str) -> Fraction | None:
        """Seconds per training image measured by finished runs of the same model and
        precision, or None."""
        images_per_second = self.finished.get((timm_id, precision))
        if images_per_second is None:
            return None
        return 1 / Fraction(images_per_second)


def _same_kind(device: str, gpu_class: str | None) -> bool:
    if not device.startswith("cuda:"):
        return False
    return gpu_class is None or gpu_class.lower() in device.lower()


def speed_problem(images_per_second: Any, gflop_per_image: Fraction, precision: str) -> str | None:
    """Why ``images_per_second`` of a model of ``gflop_per_image`` in ``precision`` cannot be
    a GPU's measured training speed, or None (bounds: :data:`PEAK_TFLOPS`, :data:`FLOOR_TFLOPS`)."""
    if isinstance(images_per_second, bool) or not isinstance(images_per_second, int | float):
        return f"images_per_second is {images_per_second!r}, not a number"
    if not math.isfinite(images_per_second) or images_per_second <= 0:
        return f"images_per_second is {images_per_second!r}, not a positive speed"
    tflops = Fraction(images_per_second) * gflop_per_image / 1000
    if tflops > PEAK_TFLOPS[precision]:
        return (
            f"images_per_second {images_per_second:g} is {float(tflops):.4g} TFLOP/s, above "
            f"any GPU's {precision} peak ({PEAK_TFLOPS[precision]} TFLOP/s)"
        )
    if tflops < FLOOR_TFLOPS:
        return (
            f"images_per_second {images_per_second:g} is {float(tflops):.3g} TFLOP/s, slower "
            f"than any GPU (below {float(FLOOR_TFLOPS)} TFLOP/s)"
        )
    return None


def finished_speeds(
    summaries: Iterable[tuple[str, Any]], gpu_class: str | None, gflop_per_image: GflopPerImage
) -> tuple[dict[tuple[str, str], float], list[str]]:
    """Median images/s of completed runs on a GPU of ``gpu_class``, by (timm id, precision);
    runs of a model shrunk or grown by ``kwargs``, or of a transformers model, are left out.

    Args:
        summaries: (where it was read, the parsed summary.json) of each run.
        gpu_class: ``scheduler.gpu_class``, or None for any CUDA device.
        gflop_per_image: a timm id's training GFLOP per image, for the speed's bounds.

    Returns:
        The speeds, and a note for each summary left out as damaged (naming its file).
    """
    speeds: dict[tuple[str, str], list[float]] = {}
    notes = []
    for where, summary in summaries:
        settings = summary.get("settings") if isinstance(summary, dict) else None
        spec = settings.get("model_spec") if isinstance(settings, dict) else None
        if not isinstance(spec, dict):
            notes.append(f"{where}: not a finetuning run's summary (no settings.model_spec)")
            continue
        if (
            summary.get("status") != "completed"
            or spec.get("kwargs")
            or not spec.get("timm_id")
            or not _same_kind(str(summary.get("device", "")), gpu_class)
        ):
            continue
        architecture = str(spec["timm_id"]).partition(".")[0]
        precision = str(settings.get("precision"))
        speed = summary.get("images_per_second")
        try:
            problem = (
                f"precision {precision!r} is none of {', '.join(PEAK_TFLOPS)}"
                if precision not in PEAK_TFLOPS
                else speed_problem(speed, gflop_per_image(architecture), precision)
            )
        except (ValueError, RuntimeError) as error:  # timm or no architecture knows the id
            problem = f"timm id {architecture!r}: {error}"
        if problem:
            notes.append(f"{where}: {problem}")
            continue
        speeds.setdefault((architecture, precision), []).append(float(speed))
    return {key: statistics.median(values) for key, values in speeds.items()}, notes


def read_summaries(results: Path) -> tuple[list[tuple[str, Any]], list[str]]:
    """Every finetuning run's summary.json under ``results``/finetune, parsed, with its path;
    and a note naming each one that is not JSON (a run being written, a node that died while
    writing: not a measurement)."""
    summaries, notes = [], []
    for path in sorted((results / "finetune").glob("**/summary.json")):
        try:
            summaries.append((str(path), json.loads(path.read_bytes())))
        except (OSError, ValueError) as error:
            notes.append(f"{path}: not readable JSON ({type(error).__name__}: {error})")
    return summaries, notes


def gpu_check_tflops(path: Path) -> tuple[dict[str, Fraction], list[str]]:
    """Sustained TFLOP/s by precision from a ``make gpu-check`` JSON: each completed,
    uncompiled run's images/s times the JSON's FLOPs per image; and a note for what is left
    out (the whole file when it is not a gpu-check JSON, a run whose speed no GPU has).

    Raises:
        ValueError: the file is missing, naming it and the config key.
    """
    where = f"scheduler.gpu_check: {path}"
    try:
        check = json.loads(path.read_bytes())
        flops = Fraction(check["train_flops_per_image"])
        runs = list(check["finetune"].values())
        if flops <= 0 or not all(isinstance(run, dict) for run in runs):
            raise ValueError("train_flops_per_image must be positive, finetune a mapping of runs")
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file (write it with make gpu-check)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as error:
        return {}, [
            f"{where}: not a gpu-check JSON ({type(error).__name__}: {error}; docs/benchmarks.md "
            "lists its fields): left out"
        ]
    tflops, notes = {}, []
    for run in runs:
        if run.get("status") != "completed" or run.get("compile"):
            continue
        precision, speed = run.get("precision"), run.get("images_per_second")
        problem = (
            f"precision {precision!r} is none of {', '.join(PEAK_TFLOPS)}"
            if precision not in PEAK_TFLOPS
            else speed_problem(speed, flops / 10**9, precision)
        )
        if problem:
            notes.append(f"{where}: the {precision} run: {problem}: left out")
            continue
        tflops[precision] = Fraction(speed) * flops / 10**12
    return tflops, notes


def from_config(config: Mapping[str, Any], gflop_per_image: GflopPerImage) -> Calibration:
    """The calibration of a validated config: its results tree, its ``scheduler.gpu_check``
    JSON (relative to the working directory) and its ``scheduler.gpu_class``.

    Args:
        config: the validated config.
        gflop_per_image: a timm id's training GFLOP per image (the speeds' bounds).

    Raises:
        ValueError: a ``scheduler.gpu_check`` file that does not exist.
    """
    scheduler = config.get("scheduler", {})
    gpu_class = scheduler.get("gpu_class")
    check = scheduler.get("gpu_check")
    results = Path(config.get("paths", {}).get("results", "results"))
    summaries, unreadable = read_summaries(results)
    finished, damaged = finished_speeds(summaries, gpu_class, gflop_per_image)
    tflops, check_notes = gpu_check_tflops(Path(check)) if check else ({}, [])
    fallback = f"the {gpu_class} table" if gpu_class else "the A100 estimate"
    notes = [f"{note}: left out" for note in unreadable + damaged]
    notes += check_notes
    if notes:
        notes.append(
            "the wall times asked for use the other measured speeds, else "
            + ("the gpu-check JSON, else " if tflops else "")
            + fallback
            + " (docs/slurm.md, the bill)"
        )
    return Calibration(finished, tflops, gpu_class, notes)
