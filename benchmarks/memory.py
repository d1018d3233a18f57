"""Memory of one training step per finetuning configuration, each in a fresh process.

Measured per configuration (``python -m benchmarks.memory --configuration X ...`` prints one
JSON line): bytes of all parameters, of the gradients that exist after the step, and of the
optimizer state (read from the tensors themselves), how many *frozen* parameters hold a
gradient or optimizer state (must be 0), and the step's peak: on a GPU
``torch.cuda.max_memory_allocated`` (reset after the model is built); on a CPU the process's
peak resident set size (VmHWM, reset just before the step through /proc/self/clear_refs)
minus the resident size before the step: the activations kept for backward, gradients and
optimizer state. A fresh process per configuration keeps one's allocator cache out of the
next one's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import Any

import torch

from vitplasticity.finetune.identity import FinetuneSettings, check_runs
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.step import training_step

CONFIGURATIONS = ("full", "emb", "ln1", "mha", "ln2", "fc1", "fc2", "head")


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Reset the process's peak RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def tensor_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes held by ``tensors`` (elements x element size)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def state_accounting(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What a training step left allocated per parameter: gradients and optimizer state.

    Returns:
        Byte counts and the number of frozen parameters that hold a gradient or state.
    """
    frozen = [p for p in model.parameters() if not p.requires_grad]
    state_tensors = [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]
    frozen_ids = {id(p) for p in frozen}
    return {
        "parameter_bytes": tensor_bytes(list(model.parameters())),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "gradient_bytes": tensor_bytes([p.grad for p in model.parameters() if p.grad is not None]),
        "optimizer_state_bytes": tensor_bytes(state_tensors),
        "frozen_with_gradient": sum(p.grad is not None for p in frozen),
        "frozen_with_optimizer_state": sum(id(p) in frozen_ids for p in optimizer.state),
    }


def measure_configuration(
    model_spec: dict[str, Any],
    configuration: str,
    batch_size: int,
    device: torch.device,
    precision: str,
    optimizer: str = "sgd",
) -> dict[str, Any]:
    """One SGD (or AdamW) step of ``configuration`` on random images; its memory accounting."""
    run = Run("bench", "bench", "bench", configuration, 0.01, 0)
    training = TrainingSettings(
        model_spec=model_spec,
        steps=10,
        val_every=10,
        optimizer=optimizer,
        batch_size=batch_size,
        micro_batch_size=batch_size,
        warmup_steps=0,
        precision=precision,
        device=str(device),
    )
    check_runs([run], training)
    settings = FinetuneSettings(run, training)
    run_model = build_run_model(settings, num_classes=100, device=device)
    opt = build_optimizer(run_model.trainable, settings)
    size = run_model.preprocessing.input_size
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(
        0, 256, (batch_size, 3, size, size), dtype=torch.uint8, generator=generator
    )
    labels = torch.randint(0, 100, (batch_size,), generator=generator)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    else:
        reset = _reset_peak_rss()
        before = _rss_bytes()
    training_step(run_model, opt, (images, labels), 0, settings, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        peak_kind = "torch.cuda.max_memory_allocated"
    else:
        peak = _peak_rss_bytes()
        peak_kind = "VmHWM reset before the step" if reset else "VmHWM since process start"
    return {
        "configuration": configuration,
        "batch_size": batch_size,
        "precision": precision,
        **state_accounting(run_model.model, opt),
        "before_step_bytes": before,
        "peak_bytes": peak,
        "step_peak_delta_bytes": peak - before,
        "peak_kind": peak_kind,
    }


def memory_table(
    model_spec: dict[str, Any],
    configurations: tuple[str, ...],
    batch_size: int,
    device: str,
    precision: str,
    threads: int,
) -> list[dict[str, Any]]:
    """:func:`measure_configuration` for each configuration, each in its own process."""
    rows = []
    for configuration in configurations:
        command = [
            sys.executable,
            "-m",
            "benchmarks.memory",
            "--model-spec",
            json.dumps(model_spec),
            "--configuration",
            configuration,
            "--batch-size",
            str(batch_size),
            "--device",
            device,
            "--precision",
            precision,
            "--threads",
            str(threads),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"memory of {configuration} failed:\n{done.stderr[-2000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-spec", required=True, help="model config entry, as JSON")
    parser.add_argument("--configuration", required=True, choices=CONFIGURATIONS)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    row = measure_configuration(
        json.loads(args.model_spec),
        args.configuration,
        args.batch_size,
        torch.device(args.device),
        args.precision,
    )
    print(json.dumps(row))


if __name__ == "__main__":
    main()
