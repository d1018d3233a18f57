"""The project's speed against naive references, measured side by side in one run.

    python -m benchmarks.run --device cpu|cuda [--quick] --json OUT

Ratios from interleaved repetitions (medians), printed as a table and written to OUT with
the raw figures and the machine:

- ``finetune_fp32_vs_naive``, ``finetune_bf16_vs_naive``: images/s of a full training step
  including its data (the project's loader + ``finetune.step.training_step``, in fp32 and in bf16
  autocast) over a naive loop (fp32, explicit softmax attention, per-sample PIL transforms,
  main-process loading): same model init, batch and images; the three take turns.
- ``finetune_bf16_vs_fp32``: the bf16 step's images/s over the fp32 step's (on a CPU above 1
  only with native bf16 matmuls, AVX512-BF16 or AMX, and a model large enough).
- ``finetune_<precision>_vs_hand`` (fp32, bf16, tf32): the project's step with its data over a
  hand-written loop (benchmarks/hand_loop.py: the same model and batch in the same
  precision, random images already on the device, no loader, no clipping, nothing read
  back): 1 is the hand loop's speed. tf32 is fp32 on a CPU.
- ``plasticity_vs_floor``: seconds of ``plasticity.measure`` over the floor, plain forward
  passes of the same images through the same modules (embedding and the five component
  calls per block) without any norm bookkeeping. At most 1.3 on a CPU.
- ``loader_vs_naive``: images/s of the project's train batches (decoded once; crops and
  flips on the device on a GPU) over per-sample PIL decoding and transforms.
- ``dag_seconds``: wall time of ``python -m snakemake -n all`` on config.yaml (the paper's
  full DAG); null when that failed (``failed`` names it; the other figures are kept).

Plus the memory of one training step per finetuning configuration (benchmarks/memory.py,
in ``--precision``) and, per precision, the finetuning path's model FLOPs utilisation against
the measured matmul peak in that precision.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as functional
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.hand_loop import hand_loop, precision_context
from benchmarks.memory import CONFIGURATIONS, memory_table
from benchmarks.naive import (
    explicit_attention_copy,
    naive_train_step,
    pil_batch,
    pil_train_transform,
)
from benchmarks.timing import interleaved_medians
from vitplasticity.data import loader, store
from vitplasticity.data.synthetic import prepare_synthetic
from vitplasticity.data.transforms import eval_image, normalize
from vitplasticity.finetune.identity import FinetuneSettings, check_runs
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.precision import cpu_bf16_native
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.step import deferred_training_step
from vitplasticity.plasticity.measure import measure
from vitplasticity.utils.io import write_json

REPO = Path(__file__).resolve().parents[1]
TINY_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 3, "num_heads": 3}
VIT_B16 = {"timm_id": "vit_base_patch16_224", "weights": "random", "normalize": "imagenet"}
PRECISIONS = ("fp32", "bf16", "tf32")
KEYS = (
    "finetune_fp32_vs_naive",
    "finetune_bf16_vs_naive",
    "finetune_tf32_vs_naive",
    "finetune_fp32_vs_hand",
    "finetune_bf16_vs_hand",
    "finetune_tf32_vs_hand",
    "finetune_bf16_vs_fp32",
    "plasticity_vs_floor",
    "loader_vs_naive",
    "dag_seconds",
)


def model_spec(timm_id: str, quick: bool) -> dict[str, Any]:
    """A random-init model entry (weights cannot be downloaded here); tiny in --quick."""
    spec: dict[str, Any] = {"timm_id": timm_id, "weights": "random", "normalize": "imagenet"}
    if quick:
        spec = {**spec, "timm_id": "vit_tiny_patch16_224", "kwargs": TINY_KWARGS}
    return spec


def settings_for(
    spec: dict[str, Any], args: argparse.Namespace, precision: str
) -> FinetuneSettings:
    run = Run("bench", "bench", "bench", "full", 0.01, 0)
    training = TrainingSettings(
        model_spec=spec,
        steps=10**6,
        val_every=10**6,
        batch_size=args.batch_size,
        micro_batch_size=args.batch_size,
        warmup_steps=0,
        precision=precision,
        device=args.device,
        num_workers=args.workers,
        augment=args.augment,
        compile=args.compile,
    )
    check_runs([run], training)
    return FinetuneSettings(run, training)


def make_store(root: Path, args: argparse.Namespace) -> Path:
    """A synthetic prepared dataset (PNG bytes in the store format, CIFAR-like 32 px)."""
    out = root / "bench"
    n_pool = max(4 * args.batch_size, 2 * args.pairs)
    spec = {"style": "blobs", "num_classes": 10, "n_pool": n_pool, "n_test": args.pairs}
    prepare_synthetic(out, "bench", {**spec, "image_size": args.image_size, "seed": 0})
    return out


def bench_finetune(split: store.Split, spec: dict[str, Any], args, device) -> dict[str, Any]:
    """The project's training path in each precision against the naive loop and against a
    hand-written loop in the same precision.

    Each precision has its own model (the same init), optimizer and loader stream; the
    contenders take turns, and each project step's images/s includes its data. The project's
    steps are the loop's ordinary ones (deferred_training_step: nothing read back).
    """
    steppers: dict[str, Any] = {}
    hands: dict[str, Any] = {}
    for precision in PRECISIONS:
        settings = settings_for(spec, args, precision)
        run_model = build_run_model(settings, num_classes=10, device=device)
        if precision == PRECISIONS[0]:  # the naive loop starts from the same weights
            naive_model = explicit_attention_copy(run_model.model)
        hands[f"hand_{precision}"] = hand_loop(
            run_model.model, args.batch_size, run_model.preprocessing.input_size, 10,
            precision, args.steps, device,
        )  # fmt: skip
        optimizer = build_optimizer(run_model.trainable, settings)
        if args.compile:
            run_model = dataclasses.replace(run_model, model=torch.compile(run_model.model))
        steppers[precision] = (settings, run_model, optimizer)
    naive_model.train()
    naive_optimizer = torch.optim.SGD(naive_model.parameters(), lr=0.01, momentum=0.9)
    pre = run_model.preprocessing

    started = time.perf_counter()
    bank = loader.ImageBank(split.images)
    decode_seconds = time.perf_counter() - started
    on_device = device.type == "cuda" if args.augment == "auto" else args.augment == "device"
    batch_class = loader.DeviceTrainBatches if on_device else loader.TrainBatches
    batches = batch_class(bank, split.labels, pre, args.batch_size, seed=0)
    transform = pil_train_transform(pre)
    labels_all = torch.as_tensor(split.labels, dtype=torch.int64)
    counter = dict.fromkeys((*PRECISIONS, "naive"), 0)

    def project(precision: str) -> Any:
        settings, run_model, optimizer = steppers[precision]
        stream = loader.train_batches(batches, 0, 10**9, args.workers, device.type == "cuda")

        def steps() -> None:
            for _ in range(args.steps):
                item = next(stream)
                if on_device:
                    canvas, sizes, boxes, flips, labels = item
                    canvas = canvas.to(device, non_blocking=True)
                    images = loader.augment_on_device(canvas, sizes, boxes, flips, pre.input_size)
                else:
                    images, labels = item
                deferred_training_step(
                    run_model, optimizer, (images, labels), counter[precision], settings, device
                )
                counter[precision] += 1

        return steps

    def naive() -> None:
        for _ in range(args.steps):
            indices = loader.batch_indices(counter["naive"], args.batch_size, len(split), 0)
            images = pil_batch(split.images, indices, transform)
            labels = labels_all[torch.from_numpy(indices)]
            naive_train_step(naive_model, naive_optimizer, images, labels, 1.0, device)
            counter["naive"] += 1

    contenders = {precision: project(precision) for precision in PRECISIONS} | {"naive": naive}
    contenders |= hands
    times = interleaved_medians(contenders, args.repeats, device)
    images_per_step = args.steps * args.batch_size
    result: dict[str, Any] = {
        name: {**value, "images_per_second": images_per_step / value["median_s"]}
        for name, value in times.items()
    }
    speed = {name: value["images_per_second"] for name, value in result.items()}
    result["vs_naive"] = {precision: speed[precision] / speed["naive"] for precision in PRECISIONS}
    result["vs_hand"] = {p: speed[p] / speed[f"hand_{p}"] for p in PRECISIONS}
    result["bf16_vs_fp32"] = speed["bf16"] / speed["fp32"]
    # Of the fastest repetitions too: on a shared machine, the one least disturbed by others.
    result["bf16_vs_fp32_fastest"] = min(times["fp32"]["seconds"]) / min(times["bf16"]["seconds"])
    result["decode_once_seconds"] = decode_seconds
    result["augment_on"] = str(device) if on_device else "cpu"
    result["train_flops_per_image"] = train_flops_per_image(spec, device)
    return result


def train_flops_per_image(spec: dict[str, Any], device: torch.device) -> float:
    """FLOPs of one image's forward + backward of the full model (torch's FLOP counter).

    Counted on the explicit-attention copy: the counter does not see inside every fused
    attention kernel (the CPU's flash kernel counts 0), while the FLOPs are the same.
    """
    settings = FinetuneSettings(
        Run("bench", "bench", "bench", "full", 0.01, 0),
        TrainingSettings(model_spec=spec, steps=1, val_every=1, device=str(device)),
    )
    run_model = build_run_model(settings, num_classes=10, device=device)
    model = explicit_attention_copy(run_model.model)
    size = run_model.preprocessing.input_size
    images = torch.zeros((2, 3, size, size), device=device)
    with FlopCounterMode(display=False) as counter:
        functional.cross_entropy(model(images), torch.zeros(2, dtype=torch.int64,
                                 device=device)).backward()  # fmt: skip
    return counter.get_total_flops() / 2


def matmul_peak_flops(device: torch.device, size: int, repeats: int = 10) -> dict[str, float]:
    """Measured FLOP/s of a square matmul per precision (the peaks MFU is measured against),
    fp32, bf16 and tf32 (fp32 on a CPU) taking turns.

    A peak is what the machine can do: the fastest repetition, not the median, so that a
    burst of load from other jobs during these few seconds does not lower it.
    """
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    operands = {"fp32": (a, b), "bf16": (a.bfloat16(), b.bfloat16()), "tf32": (a, b)}

    def tf32_matmul() -> None:
        with precision_context(device, "tf32"):
            a @ b

    contenders = {name: (lambda x=x, y=y: x @ y) for name, (x, y) in operands.items()}
    contenders["tf32"] = tf32_matmul
    times = interleaved_medians(contenders, repeats, device)
    return {name: 2 * size**3 / min(times[name]["seconds"]) for name in operands}


def eval_images(split: store.Split, pre, count: int) -> torch.Tensor:
    return normalize(torch.stack([eval_image(image, pre) for image in split.images[:count]]), pre)


@torch.inference_mode()
def plasticity_floor(model, reference: torch.Tensor, downstream: torch.Tensor, batch_size: int):
    """The same modules on the same pairs as the embedding protocol, nothing kept."""
    parameter = next(model.parameters())
    for start in range(0, len(reference), batch_size):
        pair = slice(start, start + batch_size)
        inputs = torch.cat([reference[pair], downstream[pair]]).to(
            parameter.device, parameter.dtype
        )
        tokens = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(inputs))))
        width = tokens.shape[-1]
        for block in model.blocks:
            block.norm1(tokens)
            block.attn(tokens)
            block.norm2(tokens)
            block.mlp.fc1(tokens)
            functional.linear(tokens, block.mlp.fc2.weight[:, :width], block.mlp.fc2.bias)


def bench_plasticity(reference, downstream, model, args, device) -> dict[str, Any]:
    """``plasticity.measure`` against :func:`plasticity_floor`: seconds per pass."""
    reference, downstream = reference.to(device), downstream.to(device)

    def measured() -> None:
        measure(model, reference, downstream, batch_size=args.pairs_batch)

    def floor() -> None:
        plasticity_floor(model, reference, downstream, args.pairs_batch)

    times = interleaved_medians({"measure": measured, "floor": floor}, args.repeats, device)
    times["ratio"] = times["measure"]["median_s"] / times["floor"]["median_s"]
    times["pairs"] = len(reference)
    return times


def bench_loader(split: store.Split, pre, args, device) -> dict[str, Any]:
    """Project train batches (normalised, on the device) against per-sample PIL transforms."""
    bank = loader.ImageBank(split.images)
    on_device = device.type == "cuda" if args.augment == "auto" else args.augment == "device"
    batch_class = loader.DeviceTrainBatches if on_device else loader.TrainBatches
    batches = batch_class(bank, split.labels, pre, args.batch_size, seed=0)
    transform = pil_train_transform(pre)
    counter = {"project": 0, "naive": 0}

    def project() -> None:
        for _ in range(args.steps):
            item = batches[counter["project"]]
            if on_device:
                canvas, sizes, boxes, flips, _ = item
                canvas = canvas.pin_memory().to(device, non_blocking=True)
                images = loader.augment_on_device(canvas, sizes, boxes, flips, pre.input_size)
            else:
                images = item[0].to(device)
            normalize(images, pre)
            counter["project"] += 1

    def naive() -> None:
        for _ in range(args.steps):
            indices = loader.batch_indices(counter["naive"], args.batch_size, len(split), 0)
            pil_batch(split.images, indices, transform).to(device)
            counter["naive"] += 1

    times = interleaved_medians({"project": project, "naive": naive}, args.repeats, device)
    images = args.steps * args.batch_size
    result = {
        name: {**value, "images_per_second": images / value["median_s"]}
        for name, value in times.items()
    }
    result["ratio"] = result["project"]["images_per_second"] / result["naive"]["images_per_second"]
    result["augment_on"] = str(device) if on_device else "cpu"
    return result


def bench_dag(configfile: str | None) -> dict[str, Any]:
    """Wall time of ``python -m snakemake -n --forceall all`` (config.yaml, plus ``configfile``
    merged over it): every job planned, whatever is already on disk (after ``make demo`` a
    plain dry run plans nothing and counts no job). Snakemake runs as a module of this
    interpreter: a ``snakemake`` script beside it is absent in many environments. A failure
    is returned (``failed``: the command and its last error lines), not raised, so that the
    figures measured before it are written."""
    command = [sys.executable, "-m", "snakemake", "-n", "--forceall", "all"]
    if configfile:
        command += ["--configfile", configfile]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    except OSError as error:
        return {"seconds": None, "command": " ".join(command[1:]), "jobs": None,
                "failed": repr(error)}  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode:
        return {"seconds": None, "command": " ".join(command[1:]), "jobs": None,
                "failed": f"exit {done.returncode}: {(done.stdout + done.stderr)[-2000:]}"}  # fmt: skip
    jobs = [line for line in done.stdout.splitlines() if line.startswith("total")]
    return {
        "seconds": seconds,
        "command": " ".join(command[1:]),
        "jobs": int(jobs[-1].split()[1]) if jobs else None,
    }


def machine(device: torch.device, threads: int) -> dict[str, Any]:
    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "load_average": os.getloadavg(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16_native": cpu_bf16_native(),  # AVX512-BF16 or AMX (oneDNN's bf16 matmuls)
        "onednn": torch.backends.mkldnn.is_available(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def print_table(result: dict[str, Any]) -> None:
    raw = result["raw"]
    speed = {name: raw["finetune"][name]["images_per_second"] for name in (*PRECISIONS, "naive")}
    peaks = raw["matmul_peak_flops"]
    rows = [
        *((f"finetune_{name}_vs_naive", result[f"finetune_{name}_vs_naive"],
           f"{speed[name]:.2f} vs {speed['naive']:.2f} images/s") for name in PRECISIONS),
        *((f"finetune_{name}_vs_hand", result[f"finetune_{name}_vs_hand"],
           f"{speed[name]:.2f} vs {raw['finetune'][f'hand_{name}']['images_per_second']:.2f}"
           " images/s (hand loop, data on the device)") for name in PRECISIONS),
        ("finetune_bf16_vs_fp32", result["finetune_bf16_vs_fp32"],
         f"{speed['bf16']:.2f} vs {speed['fp32']:.2f} images/s; fastest repetitions "
         f"{raw['finetune']['bf16_vs_fp32_fastest']:.2f}"),
        ("matmul_bf16_vs_fp32", peaks["bf16"] / peaks["fp32"],
         f"{peaks['bf16'] / 1e12:.3f} vs {peaks['fp32'] / 1e12:.3f} TFLOP/s "
         f"({raw['matmul_size']}^2)"),
        ("plasticity_vs_floor", result["plasticity_vs_floor"],
         f"{raw['plasticity']['measure']['median_s']:.3f} vs "
         f"{raw['plasticity']['floor']['median_s']:.3f} s"),
        ("loader_vs_naive", result["loader_vs_naive"],
         f"{raw['loader']['project']['images_per_second']:.0f} vs "
         f"{raw['loader']['naive']['images_per_second']:.0f} images/s"),
        ("dag_seconds", result["dag_seconds"], f"{raw['dag']['jobs']} jobs"),
    ]  # fmt: skip
    print(f"{'measure':<22}{'value':>10}  raw")
    for name, value, detail in rows:
        if value is None:
            print(f"{name:<22}{'FAILED':>10}  {raw['dag'].get('failed', '')[-300:]}")
        else:
            print(f"{name:<22}{value:>10.3f}  {detail}")
    for name in PRECISIONS:
        print(f"{'mfu_' + name:<22}{raw['mfu'][name]:>10.3f}  of the {name} matmul peak")
    if result["machine"]["device"] == "cpu":
        native = result["machine"]["cpu_bf16_native"]
        print("CPU bf16 matmuls: " + ("native (AVX512-BF16 or AMX)" if native else
              "emulated (no AVX512-BF16, no AMX): expect bf16 slower than fp32"))  # fmt: skip
    if raw.get("memory"):
        print(f"\n{'configuration':<14}{'trainable':>11}{'grad MB':>9}{'optim MB':>9}"
              f"{'peak MB':>9}{'step delta MB':>15}{'frozen w/ grad|state':>22}")  # fmt: skip
        for row in raw["memory"]:
            print(
                f"{row['configuration']:<14}{row['trainable_parameters']:>11}"
                f"{row['gradient_bytes'] / 2**20:>9.1f}{row['optimizer_state_bytes'] / 2**20:>9.1f}"
                f"{row['peak_bytes'] / 2**20:>9.0f}{row['step_peak_delta_bytes'] / 2**20:>15.0f}"
                f"{row['frozen_with_gradient']:>11}|{row['frozen_with_optimizer_state']}"
            )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--quick", action="store_true", help="tiny model, few repetitions")
    parser.add_argument("--json", required=True, help="where to write the results")
    parser.add_argument("--model", default=None, help="timm id (random init); default by device")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=1, help="train steps per repetition")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repetitions")
    parser.add_argument("--pairs", type=int, default=None, help="plasticity pairs")
    parser.add_argument("--pairs-batch", type=int, default=None, help="plasticity batch")
    parser.add_argument("--image-size", type=int, default=32, help="stored image size (px)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None, help="of the memory table")
    parser.add_argument("--augment", choices=["auto", "cpu", "device"], default="auto")
    parser.add_argument("--compile", action="store_true", help="torch.compile the project model")
    parser.add_argument("--workers", type=int, default=None, help="project loader workers")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--memory-batch", type=int, default=None, help="ViT-B/16 memory batch")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory table")
    parser.add_argument(
        "--dag-configfile", default=None, help="merged over config.yaml for dag_seconds (tests)"
    )
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    defaults = {
        "model": "vit_base_patch16_224" if gpu else "vit_small_patch16_224",
        "batch_size": (8 if args.quick else 512) if gpu else (8 if args.quick else 16),
        "repeats": 3 if args.quick else 5,
        "pairs": 16 if args.quick else (1024 if gpu else 64),
        "pairs_batch": 8 if args.quick else (256 if gpu else 16),
        "precision": "bf16" if gpu else "fp32",
        "workers": 8 if gpu else 0,
        "threads": os.cpu_count() or 1,
        "memory_batch": 512 if gpu else (2 if args.quick else 8),
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU is visible")
    torch.set_num_threads(args.threads)
    # fp32 means fp32 for the naive loop too (tf32 turns TF32 on for its own blocks only).
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    spec = model_spec(args.model, args.quick)
    with tempfile.TemporaryDirectory(prefix="vitplasticity-bench-") as tmp:
        dataset = make_store(Path(tmp), args)
        pool, test = store.read_split(dataset, "pool"), store.read_split(dataset, "test")
        finetune = bench_finetune(pool, spec, args, device)
        settings = settings_for(spec, args, args.precision)
        run_model = build_run_model(settings, num_classes=10, device=device)
        model, pre = run_model.model.eval(), run_model.preprocessing
        reference = eval_images(pool, pre, args.pairs)
        downstream = eval_images(test, pre, args.pairs)
        plast = bench_plasticity(reference, downstream, model, args, device)
        loading = bench_loader(pool, pre, args, device)
    dag = bench_dag(args.dag_configfile)
    matmul_size = 8192 if device.type == "cuda" else (1024 if args.quick else 2048)
    peaks = matmul_peak_flops(device, matmul_size)
    memory = None
    if not args.no_memory:
        memory_spec = model_spec("vit_base_patch16_224", args.quick) if args.quick else VIT_B16
        configurations = ("full", "ln1") if args.quick else CONFIGURATIONS
        memory = memory_table(
            memory_spec, configurations, args.memory_batch, args.device, args.precision,
            args.threads,
        )  # fmt: skip
    flops = finetune["train_flops_per_image"]
    mfu = {name: finetune[name]["images_per_second"] * flops / peaks[name] for name in PRECISIONS}
    result = {
        **{f"finetune_{name}_vs_naive": finetune["vs_naive"][name] for name in PRECISIONS},
        **{f"finetune_{name}_vs_hand": finetune["vs_hand"][name] for name in PRECISIONS},
        "finetune_bf16_vs_fp32": finetune["bf16_vs_fp32"],
        "plasticity_vs_floor": plast["ratio"],
        "loader_vs_naive": loading["ratio"],
        "dag_seconds": dag["seconds"],
        "raw": {
            "finetune": finetune,
            "plasticity": plast,
            "loader": loading,
            "dag": dag,
            "matmul_peak_flops": peaks,
            "matmul_size": matmul_size,
            "mfu": mfu,
            "memory": memory,
            "memory_model": (memory_spec if memory else None),
        },
        "settings": {k: v for k, v in vars(args).items()} | {"model_spec": spec},
        "machine": machine(device, args.threads),
        "failed": ["dag_seconds"] if dag["seconds"] is None else [],
    }
    for key in KEYS:
        if key in result["failed"]:
            continue
        if not (isinstance(result[key], float) and math.isfinite(result[key])):
            raise RuntimeError(f"{key} is not a finite number: {result[key]}")
    print_table(result)
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(1 if main()["failed"] else 0)
