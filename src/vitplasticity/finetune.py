"""Single-component finetuning of a ViT, as in the paper (PROTOCOL.md, "Finetuning").

One run trains one configuration (:data:`vitplasticity.components.CONFIGURATIONS`): the
components it names, plus the new classifier head and the final norm; everything else is
frozen (``requires_grad`` False: no gradient, no optimizer state). SGD (momentum 0.9) or
AdamW, no weight decay; linear warmup from 0 then cosine to 0; gradient-norm clipping;
gradients accumulated over micro-batches when the batch does not fit.

Model selection: at every validation point the test set is evaluated too, and the test
accuracy of the step with the best validation accuracy (the earliest on ties) is the run's
result; no weights are kept aside, and the metrics hold the whole test-accuracy curve.

A run checkpoints every ``checkpoint_every`` steps and on SIGTERM (what SLURM sends before
preemption), resumes from its checkpoint when started again, and ends bit-identical (on CPU)
to an uninterrupted run; the checkpoint is deleted when the run completes. A run whose loss
or gradient norm becomes non-finite stops and is recorded as diverged.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import torch
import torch.nn.functional as functional
from torch import nn

from vitplasticity.checkpoint import (
    CHECKPOINT_NAME,
    fingerprint,
    load_checkpoint,
    remove_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from vitplasticity.components import (
    parameter_group,
    parse_configuration,
    trainable_parameter_names,
)
from vitplasticity.data import loader, store
from vitplasticity.data.transforms import normalize
from vitplasticity.io import write_json, write_parquet
from vitplasticity.lora import apply_lora
from vitplasticity.models import ModelSpec, Preprocessing, build_model, pick_device, preprocessing
from vitplasticity.provenance import provenance
from vitplasticity.schedule import warmup_cosine_lr

__all__ = [
    "GROUPS",
    "METRICS_SCHEMA",
    "TIMING_FIELDS",
    "FinetuneSettings",
    "Preempted",
    "RunModel",
    "StepResult",
    "augment_on_device",
    "build_optimizer",
    "build_run_model",
    "cpu_bf16_native",
    "freeze",
    "group_grad_norms",
    "run",
    "trainable_parameter_names",
    "training_step",
]

log = logging.getLogger(__name__)

GROUPS: tuple[str, ...] = ("emb", "ln1", "mha", "ln2", "fc1", "fc2", "head")
"""Component groups with their own gradient-norm column (components.parameter_group)."""

METRICS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "kind": pl.String(),
    "lr": pl.Float64(),
    "train_loss": pl.Float64(),
    "grad_norm": pl.Float64(),
    **{f"grad_norm_{group}": pl.Float64() for group in GROUPS},
    "val_loss": pl.Float64(),
    "val_accuracy": pl.Float64(),
    "test_accuracy": pl.Float64(),
}
"""Columns of metrics.parquet: one row per logged train step and per validation point."""

TIMING_FIELDS: tuple[str, ...] = ("steps_per_second", "images_per_second", "wall_seconds")
"""Summary fields that depend on the machine's speed, not on the computation."""

EVAL_BATCH_FACTOR = 4
"""Eval batches hold this many micro-batches: without stored activations they fit."""

# Settings that do not change a run's numbers: a checkpoint written under other values of
# these is still resumed.
_NOT_FINGERPRINTED = ("checkpoint_every", "num_workers")


class Preempted(Exception):
    """SIGTERM arrived; a checkpoint was written and the run stopped (rerun to resume)."""


@dataclass(frozen=True)
class FinetuneSettings:
    """The resolved settings of one run; each field is the CLI flag of that name (--snake-case)."""

    experiment: str
    model: str
    dataset: str
    model_spec: dict[str, Any]  # the model's config entry (--model-spec)
    configuration: str
    lr: float
    seed: int
    steps: int
    val_every: int
    optimizer: str = "sgd"
    batch_size: int = 512
    micro_batch_size: int = 512
    warmup_steps: int = 2000
    clip_grad_norm: float = 1.0
    momentum: float = 0.9
    adam_betas: tuple[float, float] = (0.9, 0.999)
    val_fraction: float = 0.2
    precision: str = "fp32"
    device: str = "auto"
    augment: str = "auto"  # auto (device on a GPU, else cpu) | cpu | device (loader.py)
    compile: bool = False  # torch.compile the model (GPU throughput; numbers may move ~1 ulp)
    num_workers: int = 0
    log_every: int = 50
    checkpoint_every: int = 500
    demo: bool = False
    lora_rank: int = 8  # the "lora" configuration only (paper: r 8, alpha 16)
    lora_alpha: float = 16.0

    def validate(self) -> None:
        """Check every value before any compute.

        Raises:
            ValueError: naming the CLI flag and config key of the first bad value.
        """

        def bad(flag: str, key: str, message: str) -> ValueError:
            return ValueError(f"{flag} ({key}): {message}")

        try:
            parse_configuration(self.configuration)
        except ValueError as error:
            raise bad("--configuration", "experiments.<name>.configurations", str(error)) from None
        if self.optimizer not in ("sgd", "adamw"):
            raise bad(
                "--optimizer", "experiments.<name>.optimizer", f"{self.optimizer!r} not sgd|adamw"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise bad(
                "--lr", "experiments.<name>.lrs", f"must be a finite number > 0, got {self.lr}"
            )
        if self.seed < 0:
            raise bad("--seed", "experiments.<name>.seeds", f"must be >= 0, got {self.seed}")
        positive = {
            ("--steps", "datasets.<name>.steps"): self.steps,
            ("--val-every", "datasets.<name>.val_every"): self.val_every,
            ("--batch-size", "finetune.batch_size"): self.batch_size,
            ("--micro-batch-size", "finetune.micro_batch_size"): self.micro_batch_size,
            ("--log-every", "finetune.log_every"): self.log_every,
            ("--checkpoint-every", "finetune.checkpoint_every"): self.checkpoint_every,
        }
        for (flag, key), value in positive.items():
            if value < 1:
                raise bad(flag, key, f"must be >= 1, got {value}")
        if self.batch_size % self.micro_batch_size:
            raise bad(
                "--micro-batch-size",
                "finetune.micro_batch_size",
                f"{self.micro_batch_size} does not divide the batch size {self.batch_size}",
            )
        if self.warmup_steps < 0:
            raise bad(
                "--warmup-steps", "finetune.warmup_steps", f"must be >= 0, got {self.warmup_steps}"
            )
        if not self.clip_grad_norm > 0:
            raise bad("--clip-grad-norm", "finetune.clip_grad_norm", "must be > 0")
        if not 0 <= self.momentum <= 1:
            raise bad("--momentum", "finetune.momentum", f"must lie in [0, 1], got {self.momentum}")
        if len(self.adam_betas) != 2 or not all(0 <= b < 1 for b in self.adam_betas):
            raise bad(
                "--adam-betas", "finetune.adam_betas", f"two values in [0, 1): {self.adam_betas}"
            )
        if not 0 < self.val_fraction < 1:
            raise bad("--val-fraction", "finetune.val_fraction", "must lie in (0, 1)")
        if self.precision not in ("fp32", "bf16"):
            raise bad("--precision", "finetune.precision", f"{self.precision!r} not fp32|bf16")
        if self.num_workers < 0:
            raise bad("--num-workers", "finetune.num_workers", "must be >= 0")
        if self.augment not in ("auto", "cpu", "device"):
            raise bad("--augment", "finetune.augment", f"{self.augment!r} not auto|cpu|device")
        if self.lora_rank < 1:
            raise bad("--lora-rank", "finetune.lora.rank", f"must be >= 1, got {self.lora_rank}")
        if not self.lora_alpha > 0:
            raise bad("--lora-alpha", "finetune.lora.alpha", f"must be > 0, got {self.lora_alpha}")
        try:
            ModelSpec.from_config(self.model_spec)
        except (TypeError, ValueError) as error:
            raise bad("--model-spec", f"models.{self.model}", str(error)) from error

    def fingerprint_fields(self) -> dict[str, Any]:
        """The settings that shape the numbers (what a resumable checkpoint must match)."""
        fields = dataclasses.asdict(self)
        for name in _NOT_FINGERPRINTED:
            fields.pop(name)
        if "lora" not in parse_configuration(self.configuration):
            # LoRA settings shape only LoRA runs: other runs' checkpoints stay resumable.
            fields.pop("lora_rank")
            fields.pop("lora_alpha")
        return fields


def augment_on_device(settings: FinetuneSettings, device: torch.device) -> bool:
    """Whether the run crops and flips on ``device`` (``augment``: auto means on a GPU)."""
    if settings.augment == "auto":
        return device.type == "cuda"
    return settings.augment == "device"


def freeze(model: nn.Module, configuration: str) -> set[str]:
    """Freeze every parameter that ``configuration`` does not train; return the trained names."""
    trained = trainable_parameter_names(model, configuration)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trained)
    return trained


def group_grad_norms(named_parameters: list[tuple[str, nn.Parameter]]) -> dict[str, float]:
    """L2 norm of the gradients of each component group (only groups with gradients)."""
    squares: dict[str, torch.Tensor] = {}
    for name, parameter in named_parameters:
        if parameter.grad is None:
            continue
        group = parameter_group(name)
        square = parameter.grad.detach().float().square().sum()
        squares[group] = squares[group] + square if group in squares else square
    return {group: math.sqrt(float(value)) for group, value in squares.items() if group in GROUPS}


@dataclass(frozen=True)
class RunModel:
    """The model of a run with its trained parameters (in ``named_parameters`` order)."""

    model: nn.Module
    trainable: list[tuple[str, nn.Parameter]]
    preprocessing: Preprocessing


def build_run_model(settings: FinetuneSettings, num_classes: int, device: torch.device) -> RunModel:
    """Build the model seeded by the run seed (the new head's init), freeze, move to ``device``.

    Rebuilding with the same settings gives bit-identical parameters, which is why a
    checkpoint only needs the trained ones.
    """
    spec = ModelSpec.from_config(settings.model_spec)
    torch.manual_seed(settings.seed)
    model = build_model(spec, num_classes=num_classes)
    if "lora" in parse_configuration(settings.configuration):
        # After the head, so the head's init is that of every other configuration.
        apply_lora(model, settings.lora_rank, settings.lora_alpha)
    trained = freeze(model, settings.configuration)
    pre = preprocessing(model, spec)
    model.to(device).train()
    return RunModel(model, [(n, p) for n, p in model.named_parameters() if n in trained], pre)


def build_optimizer(
    trainable: list[tuple[str, nn.Parameter]], settings: FinetuneSettings
) -> torch.optim.Optimizer:
    """SGD (momentum, no nesterov) or AdamW, both without weight decay (PROTOCOL.md).

    Only the trained parameters are handed over, so frozen ones get no optimizer state.
    """
    parameters = [parameter for _, parameter in trainable]
    # The learning rate is set before every step from the schedule; lr here is a placeholder.
    if settings.optimizer == "sgd":
        return torch.optim.SGD(
            parameters, lr=settings.lr, momentum=settings.momentum, weight_decay=0.0, nesterov=False
        )
    return torch.optim.AdamW(
        parameters, lr=settings.lr, betas=tuple(settings.adam_betas), weight_decay=0.0
    )


@contextmanager
def _sigterm_flag() -> Iterator[threading.Event]:
    """An event set by SIGTERM while the block runs (main thread only; else never set)."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGTERM, previous)


def cpu_bf16_native() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX512-BF16 or AMX): only then can bf16
    autocast speed up a CPU step (large matmuls, docs/benchmarks.md); elsewhere oneDNN
    emulates bf16 and a bf16 step is usually slower than fp32."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, check, lambda: False)() for check in checks)


@functools.cache
def _warn_emulated_cpu_bf16() -> None:
    # Cached: logs once per process, not once per micro-batch.
    if not cpu_bf16_native():
        log.warning(
            "finetune.precision bf16 on a CPU without AVX512-BF16 or AMX: bf16 matmuls are "
            "emulated and may be slower than fp32 (python -m benchmarks.run prints the ratio)"
        )


def _autocast(device: torch.device, precision: str) -> torch.autocast:
    """bf16 autocast on the run's device (CPU or GPU) for precision bf16, else a no-op.

    Matmuls, convolutions and attention run in bf16; autocast keeps the norms in fp32 and
    the callers take the logits (and so the loss) in fp32.
    """
    if precision == "bf16" and device.type == "cpu":
        _warn_emulated_cpu_bf16()
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def _evaluate(
    model: nn.Module,
    data: loader.EvalSet,
    pre: Preprocessing,
    device: torch.device,
    settings: FinetuneSettings,
) -> tuple[float, float]:
    """(mean cross-entropy, top-1 accuracy) of ``model`` on ``data``."""
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.inference_mode(), _autocast(device, settings.precision):
        for images, labels in data.batches(EVAL_BATCH_FACTOR * settings.micro_batch_size):
            logits = model(normalize(images.to(device), pre)).float()  # (B, classes)
            labels = labels.to(device)
            loss_sum += float(functional.cross_entropy(logits, labels, reduction="sum"))
            correct += int((logits.argmax(dim=1) == labels).sum())
    model.train()
    return loss_sum / len(data), correct / len(data)


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step measured."""

    loss: float  # mean cross-entropy over the batch
    grad_norm: float  # total gradient norm before clipping
    lr: float  # learning rate of this update
    group_norms: dict[str, float]  # per component group, before clipping (when asked)

    @property
    def finite(self) -> bool:
        """False when the loss or the gradient is NaN or infinite (the run diverged)."""
        return math.isfinite(self.loss) and math.isfinite(self.grad_norm)


def training_step(
    run_model: RunModel,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    step_index: int,
    settings: FinetuneSettings,
    device: torch.device,
    group_norms: bool = False,
) -> StepResult:
    """One optimizer update on one batch of uint8 images (B, 3, S, S).

    Gradients are accumulated over micro-batches, each micro-batch's mean loss weighted by
    its share of the batch (so the gradient is that of the batch's mean loss), clipped to
    ``clip_grad_norm``, and applied at the scheduled learning rate. A non-finite loss or
    gradient skips the update.
    """
    model, pre = run_model.model, run_model.preprocessing
    parameters = [parameter for _, parameter in run_model.trainable]
    optimizer.zero_grad(set_to_none=True)
    images = normalize(images.to(device, non_blocking=True), pre)  # (B, 3, S, S)
    labels = labels.to(device, non_blocking=True)
    total = torch.zeros((), device=device)
    for start in range(0, settings.batch_size, settings.micro_batch_size):
        chunk = slice(start, start + settings.micro_batch_size)
        with _autocast(device, settings.precision):
            logits = model(images[chunk]).float()  # (m, classes)
        loss = functional.cross_entropy(logits, labels[chunk]) * (
            settings.micro_batch_size / settings.batch_size
        )
        loss.backward()
        total += loss.detach()
    norms = group_grad_norms(run_model.trainable) if group_norms else {}
    grad_norm = torch.nn.utils.clip_grad_norm_(parameters, settings.clip_grad_norm)
    lr = warmup_cosine_lr(step_index, settings.lr, settings.warmup_steps, settings.steps)
    # One device-to-host copy for both numbers (one synchronisation per step, not two).
    loss_value, norm_value = torch.stack([total, grad_norm.to(total.dtype)]).tolist()
    result = StepResult(loss_value, norm_value, lr, norms)
    if result.finite:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
    return result


def _metrics_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    columns = {name: [row.get(name) for row in rows] for name in METRICS_SCHEMA}
    return pl.DataFrame(columns, schema=METRICS_SCHEMA)


def _outcome(
    settings: FinetuneSettings, best: dict[str, Any] | None, diverged: bool, final_step: int
) -> dict[str, Any]:
    """The run's identity and result: the summary fields the report aggregates."""
    return {
        "experiment": settings.experiment,
        "model": settings.model,
        "dataset": settings.dataset,
        "configuration": settings.configuration,
        "optimizer": settings.optimizer,
        "lr": float(settings.lr),
        "seed": int(settings.seed),
        "status": "diverged" if diverged else "completed",
        "diverged": diverged,
        "best_step": best["step"] if best else None,
        "best_val_accuracy": best["val_accuracy"] if best else None,
        "best_val_loss": best["val_loss"] if best else None,
        "test_accuracy": best["test_accuracy"] if best else None,
        "final_step": final_step,
        "steps": settings.steps,
        "demo": settings.demo,
    }


def run(settings: FinetuneSettings, dataset_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Finetune one configuration; write metrics.parquet and summary.json into ``out_dir``.

    Resumes from ``out_dir/checkpoint.pt`` when one written with the same settings exists.

    Returns:
        The summary (what summary.json holds).

    Raises:
        ValueError: for a bad setting, naming its flag and config key.
        FileNotFoundError: when ``dataset_dir`` is not a prepared dataset.
        Preempted: when SIGTERM arrived; the checkpoint is written first.
    """
    settings.validate()
    dataset_dir, out_dir = Path(dataset_dir), Path(out_dir)
    if not dataset_dir.is_dir():
        raise FileNotFoundError(f"--dataset-dir: prepared dataset {dataset_dir} does not exist")
    store.read_meta(dataset_dir)  # names the folder when it is not a prepared dataset
    started = time.perf_counter()
    device = pick_device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device (finetune.device): {settings.device!r} but no GPU is visible")

    splits = loader.load_finetune_splits(dataset_dir, settings.seed, settings.val_fraction)
    run_model = build_run_model(settings, splits.num_classes, device)
    model, pre, named_trainable = run_model.model, run_model.preprocessing, run_model.trainable
    optimizer = build_optimizer(named_trainable, settings)

    checkpoint_path = out_dir / CHECKPOINT_NAME
    key = fingerprint(settings.fingerprint_fields())
    # Loaded on the CPU: RNG states must stay CPU tensors; copy_ and the optimizer's
    # load_state_dict move the rest to the parameters' device.
    state = load_checkpoint(checkpoint_path, key)
    rows: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    start_step, wall_before = 0, 0.0
    if state is not None:
        with torch.no_grad():
            for name, parameter in named_trainable:
                parameter.copy_(state["trainable"][name])
        optimizer.load_state_dict(state["optimizer"])
        restore_rng_states(state["rng"])
        rows, best = state["rows"], state["best"]
        start_step, wall_before = state["step"], state["wall_seconds"]
        log.info("resuming %s from step %d", checkpoint_path, start_step)

    bank = loader.ImageBank(splits.train.images)
    on_device = augment_on_device(settings, device)
    batch_class = loader.DeviceTrainBatches if on_device else loader.TrainBatches
    batches = batch_class(bank, splits.train.labels, pre, settings.batch_size, settings.seed)
    if settings.compile:
        # The compiled module shares the parameters: optimizer and checkpoints are unchanged.
        run_model = dataclasses.replace(run_model, model=torch.compile(model))
        model = run_model.model
    val_set, test_set = loader.eval_set(splits.val, pre), loader.eval_set(splits.test, pre)
    resolved = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "num_classes": splits.num_classes,
        "split_sizes": {"train": len(splits.train), "val": len(splits.val), "test": len(test_set)},
        "val_source": splits.val_source,
        "train_images_decoded_once": bank.decoded,
        "augment_on": str(device) if on_device else "cpu",
        "preprocessing": dataclasses.asdict(pre),
        "model_selection": "test accuracy at the step of best validation accuracy (earliest)",
    }
    log.info("run %s: %s", out_dir, resolved)

    def checkpoint(step: int) -> None:
        save_checkpoint(
            checkpoint_path,
            {
                "step": step,
                "trainable": {name: p.detach() for name, p in named_trainable},
                "optimizer": optimizer.state_dict(),
                "rng": rng_states(),
                "rows": rows,
                "best": best,
                "wall_seconds": wall_before + time.perf_counter() - started,
                "data_position": loader.loader_position(step, settings.batch_size, len(bank)),
            },
            key,
        )

    diverged, step, train_seconds = False, start_step, 0.0
    with _sigterm_flag() as sigterm:
        stream = loader.train_batches(
            batches, start_step, settings.steps, settings.num_workers, device.type == "cuda"
        )
        for step_index, item in enumerate(stream, start=start_step):
            tick = time.perf_counter()
            if on_device:
                canvas, sizes, boxes, flips, labels = item
                canvas = canvas.to(device, non_blocking=True)
                images = loader.augment_on_device(canvas, sizes, boxes, flips, pre.input_size)
            else:
                images, labels = item
            step = step_index + 1
            logged = step == 1 or step % settings.log_every == 0 or step == settings.steps
            result = training_step(
                run_model, optimizer, images, labels, step_index, settings, device, logged
            )
            train_seconds += time.perf_counter() - tick
            diverged, lr = not result.finite, result.lr
            if logged or diverged:
                rows.append(
                    {
                        "step": step,
                        "kind": "train",
                        "lr": lr,
                        "train_loss": result.loss,
                        "grad_norm": result.grad_norm,
                        **{f"grad_norm_{g}": value for g, value in result.group_norms.items()},
                    }
                )
                log.info(
                    "step %d loss %.4f grad %.4f lr %.3g", step, result.loss, result.grad_norm, lr
                )
            if diverged:
                log.warning("step %d: non-finite loss or gradient; the run diverged", step)
                break
            if step % settings.val_every == 0 or step == settings.steps:
                val_loss, val_accuracy = _evaluate(model, val_set, pre, device, settings)
                _, test_accuracy = _evaluate(model, test_set, pre, device, settings)
                rows.append(
                    {
                        "step": step,
                        "kind": "val",
                        "lr": lr,
                        "val_loss": val_loss,
                        "val_accuracy": val_accuracy,
                        "test_accuracy": test_accuracy,
                    }
                )
                if best is None or val_accuracy > best["val_accuracy"]:
                    best = {
                        "step": step,
                        "val_accuracy": val_accuracy,
                        "val_loss": val_loss,
                        "test_accuracy": test_accuracy,
                    }
                log.info("step %d val %.4f test %.4f", step, val_accuracy, test_accuracy)
            if step < settings.steps and sigterm.is_set():
                checkpoint(step)
                raise Preempted(f"SIGTERM after step {step}: checkpoint {checkpoint_path} written")
            if step < settings.steps and step % settings.checkpoint_every == 0:
                checkpoint(step)

    steps_per_second = (step - start_step) / train_seconds if train_seconds > 0 else None
    summary = {
        **_outcome(settings, best, diverged, step),
        "trainable_parameters": sum(p.numel() for _, p in named_trainable),
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "steps_per_second": steps_per_second,
        "images_per_second": steps_per_second * settings.batch_size if steps_per_second else None,
        "wall_seconds": wall_before + time.perf_counter() - started,
        "resumed": state is not None,
        **provenance({**dataclasses.asdict(settings), "resolved": resolved}, device),
    }
    write_parquet(out_dir / "metrics.parquet", _metrics_frame(rows), metadata={"summary": summary})
    write_json(out_dir / "summary.json", summary)
    remove_checkpoint(checkpoint_path)
    return summary
