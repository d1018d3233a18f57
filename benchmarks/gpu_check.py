"""The GPU check in one call (``make gpu-check``), for the day a CUDA GPU is at hand.

    python -m benchmarks.gpu_check [--json results/benchmarks/gpu_check.json]

Without a CUDA device visible to torch: one line saying so and what it would run; exit 0.
With one, in about 8 minutes and with nothing from the internet:

1. the CUDA-marked tests (``pytest -m gpu``);
2. one short real finetuning run per precision (:data:`PRECISIONS`: fp32, bf16, bf16 with
   ``finetune.compile``, tf32) of a random-init ViT-B/16 at 224 px, all parameters trained, on a
   synthetic prepared dataset, through the project's own ``finetune.train.train``;
3. ``python -m benchmarks.run --device cuda --quick``;

then writes one JSON (docs/benchmarks.md, "GPU check": its fields) with each run's images/s,
MFU against the measured matmul peak of its precision, peak GPU memory, and the device name.
Exit status 1 when a step failed (the JSON says which).

A run's images/s is its steady state: the images of the steps after the first
``--warmup`` ones over the time they took, read from the times of the run's own log records
of the end of step ``--warmup`` and of the last step (``finetune.log_every`` is ``--warmup``;
each step reads its loss back, so its record follows its GPU work). The first steps hold
CUDA's and torch.compile's start-up, reported apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSON = "results/benchmarks/gpu_check.json"
BENCH_JSON = "results/benchmarks/bench_cuda_quick.json"
VIT_B16 = {"timm_id": "vit_base_patch16_224", "weights": "random", "normalize": "imagenet"}


@dataclasses.dataclass(frozen=True)
class Precision:
    """One finetuning run of the check: its name in the JSON and its finetune settings."""

    name: str
    precision: str
    compile: bool
    peak: str  # which matmul peak its MFU is against


PRECISIONS = (
    Precision("fp32", "fp32", False, "fp32"),
    Precision("bf16", "bf16", False, "bf16"),
    Precision("bf16_compile", "bf16", True, "bf16"),
    Precision("tf32", "tf32", False, "tf32"),
)


def plan(json_path: str) -> str:
    """What the check runs, in one line."""
    runs = ", ".join(p.name for p in PRECISIONS)
    return (
        f"pytest -m gpu; a ViT-B/16 finetune at 224 px (random weights, synthetic data) per"
        f" precision ({runs}); python -m benchmarks.run --device cuda --quick; writes {json_path}"
    )


def steady_images_per_second(
    step_times: Mapping[int, float], batch_size: int, warmup_steps: int
) -> float:
    """Images/s of the steps after the first ``warmup_steps``: from the time step
    ``warmup_steps`` finished to the time the last step finished.

    Raises:
        ValueError: when fewer than two steps after the warm-up were timed.
    """
    last = max(step_times)
    if warmup_steps not in step_times or last - warmup_steps < 2:
        raise ValueError(
            f"--steps: {last} steps timed; at least --warmup + 2 ({warmup_steps + 2}) needed"
        )
    seconds = step_times[last] - step_times[warmup_steps]
    return (last - warmup_steps) * batch_size / seconds


def model_flops_utilisation(
    images_per_second: float, flops_per_image: float, peak_flops: float
) -> float:
    """The share of the measured matmul peak that the model's training FLOPs reach."""
    return images_per_second * flops_per_image / peak_flops


class StepClock(logging.Handler):
    """The time of each ``step N`` record that ``vitplasticity.finetune.loop`` logs (the first
    step, every ``finetune.log_every``-th and the last)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.times: dict[int, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("step %d loss") and record.args:
            self.times[int(record.args[0])] = time.perf_counter()


def measure_finetune(
    precision: Precision,
    spec: Mapping[str, Any],
    dataset_dir: Path,
    out_dir: Path,
    *,
    device: str,
    batch_size: int,
    steps: int,
    warmup_steps: int,
    num_workers: int = 4,
) -> dict[str, Any]:
    """One real finetuning run (``finetune.train.train``, configuration ``full``) and its speed and
    peak GPU memory (None on a CPU)."""
    import torch

    from vitplasticity.finetune import loop
    from vitplasticity.finetune.run import Run
    from vitplasticity.finetune.settings import TrainingSettings
    from vitplasticity.finetune.train import train

    run = Run(
        experiment="gpu_check", model="vit_b16", dataset="synthetic", configuration="full",
        lr=0.01, seed=0,
    )  # fmt: skip
    training = TrainingSettings(
        model_spec=dict(spec), steps=steps, val_every=steps, batch_size=batch_size,
        micro_batch_size=batch_size, warmup_steps=0, precision=precision.precision,
        device=device, compile=precision.compile, num_workers=num_workers,
        log_every=warmup_steps, checkpoint_every=steps,
    )  # fmt: skip
    on_gpu = device.startswith("cuda")
    if on_gpu:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    clock, logger = StepClock(), logging.getLogger(loop.__name__)
    logger.addHandler(clock)
    level = logger.level
    logger.setLevel(logging.INFO)
    started = time.perf_counter()
    try:
        summary = train(run, training, dataset_dir, out_dir / precision.name)
    finally:
        logger.removeHandler(clock)
        logger.setLevel(level)
    return {
        "precision": precision.precision,
        "compile": precision.compile,
        "status": summary["status"],
        "batch_size": batch_size,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "images_per_second": steady_images_per_second(clock.times, batch_size, warmup_steps),
        "warmup_seconds": clock.times[warmup_steps] - started,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
    }


def add_mfu(
    runs: Mapping[str, dict[str, Any]], flops_per_image: float, peaks: Mapping[str, float]
) -> dict[str, dict[str, Any]]:
    """``runs`` with each one's MFU against the matmul peak of its precision."""
    by_name = {p.name: p for p in PRECISIONS}
    return {
        name: {
            **run,
            "mfu": model_flops_utilisation(
                run["images_per_second"], flops_per_image, peaks[by_name[name].peak]
            ),
            "mfu_against": f"{by_name[name].peak} matmul peak",
        }
        for name, run in runs.items()
    }


def build_report(
    device_name: str,
    flops_per_image: float,
    peaks: Mapping[str, float],
    runs: Mapping[str, dict[str, Any]],
    tests: Mapping[str, Any],
    bench: Mapping[str, Any],
    *,
    matmul_size: int,
    wall_seconds: float,
) -> dict[str, Any]:
    """The check's JSON (its fields: docs/benchmarks.md, "GPU check"), with ``failed``
    naming each step that did not succeed."""
    import torch

    failed = [
        name
        for name, ok in (
            ("tests", tests["returncode"] == 0),
            ("benchmarks_run", bench["returncode"] == 0),
            *((name, run["status"] == "completed") for name, run in runs.items()),
        )
        if not ok
    ]
    return {
        "device": device_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": {**VIT_B16, "image_size": 224, "configuration": "full"},
        "train_flops_per_image": flops_per_image,
        "matmul_peak_flops": dict(peaks),
        "matmul_size": matmul_size,
        "finetune": add_mfu(runs, flops_per_image, peaks),
        "tests": dict(tests),
        "benchmarks_run": {**bench, "json": BENCH_JSON},
        "failed": failed,
        "wall_seconds": wall_seconds,
    }


def run_step(command: list[str], timeout: float) -> dict[str, Any]:
    """``command`` run from the repository root: its exit status, wall time and last lines."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
        )
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        returncode, output = None, f"timed out after {timeout} s: {error}"
    return {
        "command": " ".join(command),
        "returncode": returncode,
        "seconds": time.perf_counter() - started,
        "tail": output.strip().splitlines()[-5:],
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    parser.add_argument("--batch-size", type=int, default=128, help="of each finetuning run")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps of each run")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of images/s")
    parser.add_argument("--matmul-size", type=int, default=8192, help="square matmul of the peak")
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < args.warmup + 2:
        parser.error(f"--warmup {args.warmup}, --steps {args.steps}: need 1 <= warmup <= steps - 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu-check: no CUDA device visible to torch, nothing run; with one: {plan(args.json)}"
        )
        return 0
    from benchmarks.run import matmul_peak_flops, train_flops_per_image
    from vitplasticity.data.synthetic import prepare_synthetic
    from vitplasticity.utils.io import write_json

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    device = torch.device("cuda")
    tests = run_step([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests"], timeout=240)
    # fp32 means fp32, as in benchmarks.run (the tf32 run turns TF32 on for its own steps).
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    peaks = matmul_peak_flops(device, args.matmul_size)
    flops = train_flops_per_image(VIT_B16, device)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="vitplasticity-gpu-check-") as tmp:
        dataset = Path(tmp) / "synthetic"
        spec = {"style": "blobs", "num_classes": 10, "n_pool": 4 * args.batch_size, "n_test": 64}
        prepare_synthetic(dataset, "synthetic", {**spec, "image_size": 224, "seed": 0})
        for precision in PRECISIONS:
            runs[precision.name] = measure_finetune(
                precision, VIT_B16, dataset, Path(tmp) / "runs", device="cuda",
                batch_size=args.batch_size, steps=args.steps, warmup_steps=args.warmup,
            )  # fmt: skip
            print(f"gpu-check: {precision.name}: {runs[precision.name]}", flush=True)
    bench = run_step(
        [
            sys.executable,
            "-m",
            "benchmarks.run",
            "--device",
            "cuda",
            "--quick",
            "--json",
            BENCH_JSON,
        ],
        timeout=300,
    )
    report = build_report(
        torch.cuda.get_device_name(device), flops, peaks, runs, tests, bench,
        matmul_size=args.matmul_size, wall_seconds=time.perf_counter() - started,
    )  # fmt: skip
    write_json(REPO / args.json, report)
    failed = report["failed"]
    print(f"gpu-check: {args.json} written" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
