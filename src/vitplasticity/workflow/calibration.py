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
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
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


def finished_speeds(
    summaries: Iterable[Mapping[str, Any]], gpu_class: str | None
) -> dict[tuple[str, str], float]:
    """Median images/s of completed runs on a GPU of ``gpu_class``, by (timm id, precision);
    runs of a model shrunk or grown by ``kwargs``, or without a speed, are left out."""
    speeds: dict[tuple[str, str], list[float]] = {}
    for summary in summaries:
        settings = summary.get("settings") or {}
        spec = settings.get("model_spec") or {}
        speed = summary.get("images_per_second")
        if (
            summary.get("status") != "completed"
            or not speed
            or spec.get("kwargs")
            or not _same_kind(str(summary.get("device", "")), gpu_class)
        ):
            continue
        key = (str(spec.get("timm_id", "")).partition(".")[0], str(settings.get("precision")))
        speeds.setdefault(key, []).append(float(speed))
    return {key: statistics.median(values) for key, values in speeds.items()}


def read_summaries(results: Path) -> list[dict[str, Any]]:
    """Every finetuning run's summary.json under ``results``/finetune (unreadable ones
    skipped: a run being written is not a measurement yet)."""
    summaries = []
    for path in sorted((results / "finetune").glob("**/summary.json")):
        try:
            summaries.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return summaries


def gpu_check_tflops(path: Path) -> dict[str, Fraction]:
    """Sustained TFLOP/s by precision from a ``make gpu-check`` JSON: each completed,
    uncompiled run's images/s times the JSON's FLOPs per image.

    Raises:
        ValueError: the file is missing, not JSON, or lacks its ``train_flops_per_image``
            or ``finetune`` runs, naming the file and the config key.
    """
    where = f"scheduler.gpu_check: {path}"
    try:
        check = json.loads(path.read_text())
        flops = Fraction(check["train_flops_per_image"])
        runs = check["finetune"]
    except FileNotFoundError:
        raise ValueError(f"{where}: no such file (write it with make gpu-check)") from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{where}: not a gpu-check JSON ({error!r}); docs/benchmarks.md lists its fields"
        ) from None
    tflops = {}
    for run in runs.values():
        if (
            run.get("status") == "completed"
            and not run.get("compile")
            and run.get("images_per_second")
        ):
            tflops[run["precision"]] = Fraction(run["images_per_second"]) * flops / 10**12
    return tflops


def from_config(config: Mapping[str, Any]) -> Calibration:
    """The calibration of a validated config: its results tree, its ``scheduler.gpu_check``
    JSON (relative to the working directory) and its ``scheduler.gpu_class``.

    Raises:
        ValueError: a bad ``scheduler.gpu_check`` file (:func:`gpu_check_tflops`).
    """
    scheduler = config.get("scheduler", {})
    gpu_class = scheduler.get("gpu_class")
    check = scheduler.get("gpu_check")
    results = Path(config.get("paths", {}).get("results", "results"))
    return Calibration(
        finished=finished_speeds(read_summaries(results), gpu_class),
        gpu_check_tflops=gpu_check_tflops(Path(check)) if check else {},
        gpu_class=gpu_class,
    )
