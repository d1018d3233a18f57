"""What experiment tracking costs a finetuning run: tracking off against W&B (offline) and
MLflow (a file store), side by side in one run.

    python -m benchmarks.tracking [--steps 30 120] [--repeats 3] --json OUT

Each contender trains the same tiny-ViT run (tests/helpers/tiny_vit: 3 blocks, 48 wide, 32 px,
on a synthetic prepared dataset, on the CPU) from its start to its outputs, through
``finetune.train.train``, every step logged (``log_every: 1``, the worst case: the paper's
runs log every 50). Contenders and run lengths take turns (benchmarks.timing); from the
medians at the two lengths, a contender's extra seconds split into a fixed cost per run
(opening and closing its tracker runs) and a cost per logged step:

- ``<backend>_vs_off``: wall time of the longer run over tracking off's;
- ``<backend>_fixed_seconds``: the extra seconds per run at no step (the intercept);
- ``<backend>_per_logged_step_ms``: the extra milliseconds per logged step (the slope);
- ``<backend>_first_open_seconds``: what a fresh process spends beyond tracking off's to
  import the package and open, log to and close its first tracker run (the imports are
  warm in the runs above, as for a packed job's later runs).

A run of the grid lasts minutes to hours and logs every 50th step: its overhead is the fixed
cost over its wall time plus the per-step cost over 50 steps' time.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from tests.helpers.tiny_vit import TINY_SPEC

from benchmarks.timing import interleaved_medians
from vitplasticity.data.synthetic import prepare_synthetic
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.train import train
from vitplasticity.settings.tracking import TrackingSettings
from vitplasticity.utils.io import write_json
from vitplasticity.workflow.config import Run


def contenders(folder: Path) -> dict[str, TrackingSettings]:
    """Tracking off, W&B offline, MLflow's file store in ``folder``."""
    return {
        "off": TrackingSettings(),
        "wandb_offline": TrackingSettings(
            tracking_backend=("wandb",), tracking_project="bench", tracking_wandb_mode="offline"
        ),
        "mlflow_file": TrackingSettings(
            tracking_backend=("mlflow",),
            tracking_project="bench",
            tracking_mlflow_tracking_uri=str(folder / "mlruns"),
        ),
    }


def training(steps: int) -> TrainingSettings:
    """A run of ``steps`` SGD steps, every one logged, validated at the end only."""
    return TrainingSettings(
        model_spec=dataclasses.asdict(TINY_SPEC),
        steps=steps,
        val_every=steps,
        batch_size=16,
        micro_batch_size=16,
        warmup_steps=2,
        device="cpu",
        num_workers=0,
        log_every=1,
        checkpoint_every=10 * steps,
        demo=True,
    )


def measure(steps: tuple[int, int], repeats: int, folder: Path) -> dict[str, Any]:
    """The medians of every (contender, length) and the ratios, fixed and per-step costs."""
    dataset = folder / "dataset"
    prepare_synthetic(
        dataset,
        "bench",
        {"style": "stripes", "num_classes": 4, "n_pool": 160, "n_test": 32, "image_size": 32,
         "seed": 0},
    )  # fmt: skip
    run = Run("bench", "tiny", "bench", "mha", 0.05, 0)
    count = iter(range(10**6))

    def trainer(options: TrackingSettings, length: int) -> Any:
        settings = training(length)
        # A fresh folder each time: a finished run would be put back, not trained.
        return lambda: train(run, settings, dataset, folder / f"run{next(count)}", None, options)

    calls = {
        f"{name}@{length}": trainer(options, length)
        for name, options in contenders(folder).items()
        for length in steps
    }
    medians = interleaved_medians(calls, repeats, torch.device("cpu"))
    short, long = steps
    result: dict[str, Any] = {"raw": medians}
    off = {length: medians[f"off@{length}"]["median_s"] for length in steps}
    for name in contenders(folder):
        if name == "off":
            continue
        extra = {length: medians[f"{name}@{length}"]["median_s"] - off[length] for length in steps}
        per_step = (extra[long] - extra[short]) / (long - short)
        result[f"{name}_vs_off"] = medians[f"{name}@{long}"]["median_s"] / off[long]
        result[f"{name}_fixed_seconds"] = extra[short] - per_step * short
        result[f"{name}_per_logged_step_ms"] = 1000 * per_step
    result["off_seconds_per_step_ms"] = 1000 * (off[long] - off[short]) / (long - short)
    return result


OPEN_ONCE = """
import sys, time
start = time.perf_counter()
from vitplasticity.settings.tracking import TrackingSettings
from vitplasticity.utils.tracking import TrackedJob, tracking
options = TrackingSettings(tracking_backend=(sys.argv[1],), tracking_project="bench",
                           tracking_wandb_mode="offline", tracking_mlflow_tracking_uri=sys.argv[2])
with tracking(options, TrackedJob("bench", "bench", "finetune", {"a": 1})) as tracker:
    tracker.log_row({"step": 1, "lr": 0.1})
print(time.perf_counter() - start)
"""
"""A fresh process opening and closing one tracker run (imports included)."""


def first_open_seconds(folder: Path, repeats: int) -> dict[str, float]:
    """Per backend, the median seconds a fresh process spends importing the package and
    opening, logging to and closing its first tracker run, beyond tracking off's (a job pays
    it once; later runs of a packed job reuse the imports)."""
    seconds: dict[str, list[float]] = {"none": [], "wandb": [], "mlflow": []}
    for _ in range(repeats):
        for backend, values in seconds.items():
            command = [sys.executable, "-c", OPEN_ONCE, backend, str(folder / "open_mlruns")]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            values.append(float(done.stdout.strip().splitlines()[-1]))
    off = statistics.median(seconds["none"])
    return {name: statistics.median(seconds[name]) - off for name in ("wandb", "mlflow")}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs=2, default=(30, 120), metavar=("SHORT", "LONG"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--json", help="where to write the figures")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("WANDB_SILENT", "true")
    with tempfile.TemporaryDirectory(prefix="vitplasticity-bench-tracking-") as tmp:
        os.environ["WANDB_DIR"] = tmp  # the offline runs go away with the folder
        result = measure(tuple(args.steps), args.repeats, Path(tmp))
        opened = first_open_seconds(Path(tmp), args.repeats)
    result["wandb_offline_first_open_seconds"] = opened["wandb"]
    result["mlflow_file_first_open_seconds"] = opened["mlflow"]
    result["settings"] = {"steps": list(args.steps), "repeats": args.repeats, "log_every": 1}
    result["machine"] = {
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    for key, value in result.items():
        if isinstance(value, float):
            print(f"{key:32s} {value:.3f}")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
