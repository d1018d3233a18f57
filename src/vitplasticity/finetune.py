"""Single-component finetuning of a ViT, as in the paper (docs/protocol.md, "Finetuning").

One run trains one configuration (:data:`vitplasticity.architectures.CONFIGURATIONS`): the
components it names, plus the new classifier head and the final norm; everything else is
frozen (``requires_grad`` False: no gradient, no optimizer state). Which parameter is whose
comes from the model's architecture (:class:`vitplasticity.architectures.ParameterMap`, by
identity): a model no architecture knows, or one its architecture refuses to finetune, is an
error before any step. SGD (momentum 0.9) or AdamW, no weight decay; linear warmup from 0 then
cosine to 0; gradient-norm clipping; gradients accumulated over micro-batches when the batch
does not fit.

Model selection: at every validation point the test set is evaluated too, and the test
accuracy of the step with the best validation accuracy (the earliest on ties) is the run's
result; no weights are kept aside, and the metrics hold the whole test-accuracy curve.

A run checkpoints every ``checkpoint_every`` steps and on SIGTERM (what SLURM sends before
preemption), resumes from its checkpoint when started again, and ends bit-identical (on CPU)
to an uninterrupted run; the checkpoint is deleted when the run completes. A run whose loss
or gradient norm becomes non-finite stops and is recorded as diverged.

:func:`train` takes a run's identity (a :class:`vitplasticity.config.Run`) and the
:class:`TrainingSettings` it shares with the other runs of its job, and goes through five
pieces: :func:`setup_run` (checks, model, optimizer, data), :meth:`ResumableState.resume`,
:func:`train_steps` (each validation point is :func:`evaluation_point`), :func:`summary`
and :func:`write_outputs`.
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

from vitplasticity.architectures import (
    Architecture,
    Owner,
    ParameterMap,
    UnsupportedModel,
    architecture_for,
    parameter_map,
    parse_configuration,
)
from vitplasticity.checkpoint import (
    CHECKPOINT_NAME,
    fingerprint,
    load_checkpoint,
    remove_checkpoint,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from vitplasticity.config import Run
from vitplasticity.data import loader, store
from vitplasticity.data.transforms import normalize
from vitplasticity.finetune_settings import TrainingSettings
from vitplasticity.hf_models import model_spec
from vitplasticity.io import write_json, write_parquet
from vitplasticity.lora import apply_lora, check_adapters_used
from vitplasticity.models import Preprocessing, build_model, pick_device, preprocessing
from vitplasticity.provenance import provenance
from vitplasticity.schedule import warmup_cosine_lr
from vitplasticity.settings import bad_setting

__all__ = [
    "GROUPS",
    "METRICS_SCHEMA",
    "TIMING_FIELDS",
    "FinetuneSettings",
    "Preempted",
    "ResumableState",
    "RunContext",
    "RunModel",
    "StepResult",
    "TrainingOutcome",
    "TrainingSettings",
    "augment_on_device",
    "build_optimizer",
    "build_run_model",
    "check_identity",
    "cpu_bf16_native",
    "evaluation_point",
    "freeze",
    "gradient_group",
    "group_grad_norms",
    "run",
    "setup_run",
    "summary",
    "train",
    "train_row",
    "train_steps",
    "trainable_parameter_names",
    "training_step",
    "write_outputs",
]

log = logging.getLogger(__name__)

GROUPS: tuple[str, ...] = ("emb", "ln1", "mha", "ln2", "fc1", "fc2", "head")
"""Groups with their own gradient-norm column (:func:`gradient_group`)."""

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


def check_identity(run: Run) -> None:
    """Check a run's configuration, learning rate and seed before any compute.

    Raises:
        ValueError: naming the CLI flag and config key of the first bad value.
    """
    try:
        parse_configuration(run.configuration)
    except ValueError as error:
        raise bad_setting(
            "--configuration", "experiments.<name>.configurations", str(error)
        ) from None
    if not (run.lr > 0 and math.isfinite(run.lr)):
        raise bad_setting(
            "--lr", "experiments.<name>.lrs", f"must be a finite number > 0, got {run.lr}"
        )
    if run.seed < 0:
        raise bad_setting("--seed", "experiments.<name>.seeds", f"must be >= 0, got {run.seed}")


_IDENTITY_FIELDS = tuple(field.name for field in dataclasses.fields(Run))


@dataclass(frozen=True, kw_only=True)
class FinetuneSettings(TrainingSettings):
    """One run: its identity (the fields of :class:`vitplasticity.config.Run`) and its
    :class:`TrainingSettings`, flat, so that each field is the CLI flag of that name.

    What :func:`run` and the pieces of a run take. Build one from its two parts with
    :meth:`of`; :attr:`identity` and :attr:`training` give them back.
    """

    experiment: str
    model: str
    dataset: str
    configuration: str
    lr: float
    seed: int

    @classmethod
    def of(cls, run: Run, training: TrainingSettings) -> FinetuneSettings:
        """The settings of ``run`` trained with ``training``."""
        shared = {f.name: getattr(training, f.name) for f in dataclasses.fields(TrainingSettings)}
        return cls(**shared, **{name: getattr(run, name) for name in _IDENTITY_FIELDS})

    @property
    def identity(self) -> Run:
        """Which run this is (experiment, model, dataset, configuration, lr, seed)."""
        return Run(**{name: getattr(self, name) for name in _IDENTITY_FIELDS})

    @property
    def training(self) -> TrainingSettings:
        """The training settings alone (what the runs of one packed job share)."""
        fields = dataclasses.fields(TrainingSettings)
        return TrainingSettings(**{f.name: getattr(self, f.name) for f in fields})

    def validate(self, model: str | None = None) -> None:
        """Check the identity, then the training settings, before any compute.

        Raises:
            ValueError: naming the CLI flag and config key of the first bad value.
        """
        check_identity(self.identity)
        super().validate(self.model if model is None else model)

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


def augment_on_device(settings: TrainingSettings, device: torch.device) -> bool:
    """Whether the run crops and flips on ``device`` (``augment``: auto means on a GPU)."""
    if settings.augment == "auto":
        return device.type == "cuda"
    return settings.augment == "device"


def trainable_parameter_names(model: nn.Module, configuration: str) -> set[str]:
    """Names of the parameters that ``configuration`` trains in ``model``.

    Every configuration trains the classifier head and the final norm; "full" trains all;
    "emb" adds the embedding; "ln1", "mha", "ln2", "fc1", "fc2" that component of every
    block (with the parameters its architecture declares for it, e.g. LayerScale);
    "head" nothing more (linear probing); "lora" the LoRA adapters (which
    :func:`vitplasticity.lora.apply_lora` must have injected). Combinations join with "+".
    See :meth:`vitplasticity.architectures.ParameterMap.trained_names`.

    Raises:
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
        ValueError: for an unknown configuration, listing the valid ones, or "lora" on a
            model without LoRA adapters.
    """
    return parameter_map(model).trained_names(configuration)


def freeze(model: nn.Module, parameters: ParameterMap, configuration: str) -> set[str]:
    """Freeze every parameter of ``model`` that ``configuration`` does not train (which is
    which: ``parameters``, the model's map); return the trained names."""
    trained = parameters.trained_names(configuration)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trained)
    return trained


def gradient_group(owner: Owner) -> str:
    """The gradient-norm column of a parameter: the configuration that trains it
    (:attr:`Owner.gradient_group`), except that LoRA adapters count as MHA's, the attention
    linears they adapt (:meth:`Architecture.lora_targets`), as the paper's runs log them."""
    return "mha" if owner.group == "lora" else owner.gradient_group


def group_grad_norms(
    named_parameters: list[tuple[str, nn.Parameter]], parameters: ParameterMap
) -> dict[str, float]:
    """L2 norm of the gradients of each group of :data:`GROUPS` (only groups with gradients),
    the squares summed in ``named_parameters`` order; ``parameters`` says whose each is."""
    squares: dict[str, torch.Tensor] = {}
    for name, parameter in named_parameters:
        if parameter.grad is None:
            continue
        group = gradient_group(parameters.owners[name])
        square = parameter.grad.detach().float().square().sum()
        squares[group] = squares[group] + square if group in squares else square
    return {group: math.sqrt(float(value)) for group, value in squares.items() if group in GROUPS}


@dataclass(frozen=True)
class RunModel:
    """The model of a run with its trained parameters (in ``named_parameters`` order) and
    its parameter map (whose each parameter is: the gradient-norm groups)."""

    model: nn.Module
    trainable: list[tuple[str, nn.Parameter]]
    preprocessing: Preprocessing
    parameters: ParameterMap

    @property
    def architecture(self) -> Architecture:
        """The model's architecture (how its logits are computed: :meth:`Architecture.logits`)."""
        return self.parameters.architecture


def build_run_model(settings: FinetuneSettings, num_classes: int, device: torch.device) -> RunModel:
    """Build the model seeded by the run seed (the new head's init), freeze, move to ``device``.

    Rebuilding with the same settings gives bit-identical parameters, which is why a
    checkpoint only needs the trained ones. A ``family: transformers`` model is its vision
    tower in its classification class (:func:`vitplasticity.hf_models.build_hf_model`).

    Raises:
        UnsupportedModel: before any step, for a model no architecture knows (naming its
            class and the known families), one its architecture refuses to finetune (or to
            adapt with LoRA, or whose forward pass bypasses a LoRA adapter), or one with a
            parameter its architecture cannot account for.
    """
    spec = model_spec(settings.model_spec)
    torch.manual_seed(settings.seed)
    model = build_model(spec, num_classes=num_classes)
    architecture = architecture_for(model)
    lora = "lora" in parse_configuration(settings.configuration)
    for stage in ("finetune", "lora") if lora else ("finetune",):
        refusal = architecture.refusal(stage, model)
        if refusal is not None:
            raise UnsupportedModel(f"{stage} of {type(model).__name__}: {refusal}")
    pre = preprocessing(model, spec)
    if lora:
        # After the head, so the head's init is that of every other configuration.
        apply_lora(model, settings.lora_rank, settings.lora_alpha)
        check_adapters_used(model, torch.zeros(1, 3, pre.input_size, pre.input_size))
    parameters = ParameterMap(architecture, model)
    trained = freeze(model, parameters, settings.configuration)
    model.to(device).train()
    trainable = [(n, p) for n, p in model.named_parameters() if n in trained]
    return RunModel(model, trainable, pre, parameters)


def build_optimizer(
    trainable: list[tuple[str, nn.Parameter]], settings: FinetuneSettings
) -> torch.optim.Optimizer:
    """SGD (momentum, no nesterov) or AdamW, both without weight decay (docs/protocol.md).

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
    architecture: Architecture,
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
            images = normalize(images.to(device), pre)
            logits = architecture.logits(model, images).float()  # (B, classes)
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
            logits = run_model.architecture.logits(model, images[chunk]).float()  # (m, classes)
        loss = functional.cross_entropy(logits, labels[chunk]) * (
            settings.micro_batch_size / settings.batch_size
        )
        loss.backward()
        total += loss.detach()
    norms = group_grad_norms(run_model.trainable, run_model.parameters) if group_norms else {}
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


@dataclass
class RunContext:
    """What :func:`setup_run` prepares before the first step: model, optimizer, data, device."""

    settings: FinetuneSettings
    out_dir: Path
    device: torch.device
    run_model: RunModel  # its model is the compiled one under ``compile``
    optimizer: torch.optim.Optimizer
    batches: loader.TrainBatches  # DeviceTrainBatches when augmenting on the device
    on_device: bool  # crops and flips on the device
    train_size: int  # training images (the data position a checkpoint records)
    val_set: loader.EvalSet
    test_set: loader.EvalSet
    resolved: dict[str, Any]  # what the settings resolved to on this machine (provenance)
    started: float  # time.perf_counter() when the run started

    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / CHECKPOINT_NAME


def _checked_device(settings: FinetuneSettings, dataset_dir: Path) -> torch.device:
    """The run's device, after checking the settings, the dataset folder and the device."""
    settings.validate()
    if not dataset_dir.is_dir():
        raise FileNotFoundError(f"--dataset-dir: prepared dataset {dataset_dir} does not exist")
    store.read_meta(dataset_dir)  # names the folder when it is not a prepared dataset
    device = pick_device(settings.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device (finetune.device): {settings.device!r} but no GPU is visible")
    return device


def setup_run(
    settings: FinetuneSettings, dataset_dir: str | Path, out_dir: str | Path
) -> RunContext:
    """Check the settings and the dataset, then build the run's model, optimizer and data.

    Raises:
        ValueError: for a bad setting, naming its flag and config key, or a GPU device
            asked for where none is visible.
        FileNotFoundError: when ``dataset_dir`` is not a prepared dataset.
    """
    dataset_dir, out_dir = Path(dataset_dir), Path(out_dir)
    device = _checked_device(settings, dataset_dir)
    started = time.perf_counter()
    splits = loader.load_finetune_splits(dataset_dir, settings.seed, settings.val_fraction)
    run_model = build_run_model(settings, splits.num_classes, device)
    optimizer = build_optimizer(run_model.trainable, settings)
    pre = run_model.preprocessing
    bank = loader.ImageBank(splits.train.images)
    on_device = augment_on_device(settings, device)
    batch_class = loader.DeviceTrainBatches if on_device else loader.TrainBatches
    batches = batch_class(bank, splits.train.labels, pre, settings.batch_size, settings.seed)
    if settings.compile:
        # The compiled module shares the parameters: optimizer and checkpoints are unchanged.
        run_model = dataclasses.replace(run_model, model=torch.compile(run_model.model))
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
    return RunContext(
        settings=settings,
        out_dir=out_dir,
        device=device,
        run_model=run_model,
        optimizer=optimizer,
        batches=batches,
        on_device=on_device,
        train_size=len(bank),
        val_set=val_set,
        test_set=test_set,
        resolved=resolved,
        started=started,
    )


@dataclass
class ResumableState:
    """What a run has done so far and what its checkpoint carries to the next process:
    the metric rows, the best validation point, the step it starts from and the wall time
    of the processes before."""

    key: str  # fingerprint of the settings the checkpoint must match
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best: dict[str, Any] | None = None
    start_step: int = 0
    wall_before: float = 0.0
    resumed: bool = False

    @classmethod
    def resume(cls, context: RunContext) -> ResumableState:
        """The state of a fresh run, or that of the checkpoint in the run's folder when one
        written with the same settings is there: its trained parameters, optimizer state and
        RNG states are restored into ``context``."""
        state = cls(fingerprint(context.settings.fingerprint_fields()))
        # Loaded on the CPU: RNG states must stay CPU tensors; copy_ and the optimizer's
        # load_state_dict move the rest to the parameters' device.
        saved = load_checkpoint(context.checkpoint_path, state.key)
        if saved is None:
            return state
        with torch.no_grad():
            for name, parameter in context.run_model.trainable:
                parameter.copy_(saved["trainable"][name])
        context.optimizer.load_state_dict(saved["optimizer"])
        restore_rng_states(saved["rng"])
        state.rows, state.best = saved["rows"], saved["best"]
        state.start_step, state.wall_before = saved["step"], saved["wall_seconds"]
        state.resumed = True
        log.info("resuming %s from step %d", context.checkpoint_path, state.start_step)
        return state

    def record(self, row: dict[str, Any]) -> None:
        """Add a metrics row; a validation row with a higher accuracy than every earlier one
        becomes the best (so ties keep the earliest)."""
        self.rows.append(row)
        if row["kind"] == "val" and (
            self.best is None or row["val_accuracy"] > self.best["val_accuracy"]
        ):
            self.best = {
                "step": row["step"],
                "val_accuracy": row["val_accuracy"],
                "val_loss": row["val_loss"],
                "test_accuracy": row["test_accuracy"],
            }

    def save(self, context: RunContext, step: int) -> None:
        """Write the checkpoint of the run after ``step`` steps (atomically)."""
        save_checkpoint(
            context.checkpoint_path,
            {
                "step": step,
                "trainable": {name: p.detach() for name, p in context.run_model.trainable},
                "optimizer": context.optimizer.state_dict(),
                "rng": rng_states(),
                "rows": self.rows,
                "best": self.best,
                "wall_seconds": self.wall_seconds(context),
                "data_position": loader.loader_position(
                    step, context.settings.batch_size, context.train_size
                ),
            },
            self.key,
        )

    def wall_seconds(self, context: RunContext) -> float:
        """Wall time of the run so far, over every process that worked on it."""
        return self.wall_before + time.perf_counter() - context.started


def train_row(step: int, result: StepResult) -> dict[str, Any]:
    """The metrics row of a logged training step."""
    return {
        "step": step,
        "kind": "train",
        "lr": result.lr,
        "train_loss": result.loss,
        "grad_norm": result.grad_norm,
        **{f"grad_norm_{group}": value for group, value in result.group_norms.items()},
    }


def evaluation_point(context: RunContext, step: int, lr: float) -> dict[str, Any]:
    """The metrics row of a validation point: loss and accuracy on val, accuracy on test."""
    model, pre = context.run_model.model, context.run_model.preprocessing
    architecture = context.run_model.architecture
    val_loss, val_accuracy = _evaluate(
        model, architecture, context.val_set, pre, context.device, context.settings
    )
    _, test_accuracy = _evaluate(
        model, architecture, context.test_set, pre, context.device, context.settings
    )
    log.info("step %d val %.4f test %.4f", step, val_accuracy, test_accuracy)
    return {
        "step": step,
        "kind": "val",
        "lr": lr,
        "val_loss": val_loss,
        "val_accuracy": val_accuracy,
        "test_accuracy": test_accuracy,
    }


@dataclass(frozen=True)
class TrainingOutcome:
    """How the steps of one process ended."""

    diverged: bool
    final_step: int  # the last step taken (the start step when none was)
    train_seconds: float  # time spent in this process's steps (data included)


def _step_images(context: RunContext, item: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint8 images and labels of one batch from the loader (cropped on the device when
    the run augments there)."""
    if not context.on_device:
        return item
    canvas, sizes, boxes, flips, labels = item
    canvas = canvas.to(context.device, non_blocking=True)
    input_size = context.run_model.preprocessing.input_size
    return loader.augment_on_device(canvas, sizes, boxes, flips, input_size), labels


def train_steps(context: RunContext, state: ResumableState) -> TrainingOutcome:
    """The steps from ``state.start_step`` to the last: train, log, validate, checkpoint.

    Stops early when the loss or gradient becomes non-finite (the run diverged).

    Raises:
        Preempted: when SIGTERM arrived; the checkpoint is written first.
    """
    settings, device = context.settings, context.device
    diverged, step, train_seconds = False, state.start_step, 0.0
    with _sigterm_flag() as sigterm:
        stream = loader.train_batches(
            context.batches,
            state.start_step,
            settings.steps,
            settings.num_workers,
            device.type == "cuda",
        )
        for step_index, item in enumerate(stream, start=state.start_step):
            tick = time.perf_counter()
            images, labels = _step_images(context, item)
            step = step_index + 1
            logged = step == 1 or step % settings.log_every == 0 or step == settings.steps
            result = training_step(
                context.run_model,
                context.optimizer,
                images,
                labels,
                step_index,
                settings,
                device,
                logged,
            )
            train_seconds += time.perf_counter() - tick
            diverged = not result.finite
            if logged or diverged:
                state.record(train_row(step, result))
                log.info(
                    "step %d loss %.4f grad %.4f lr %.3g",
                    step,
                    result.loss,
                    result.grad_norm,
                    result.lr,
                )
            if diverged:
                log.warning("step %d: non-finite loss or gradient; the run diverged", step)
                break
            if step % settings.val_every == 0 or step == settings.steps:
                state.record(evaluation_point(context, step, result.lr))
            if step < settings.steps and sigterm.is_set():
                state.save(context, step)
                raise Preempted(
                    f"SIGTERM after step {step}: checkpoint {context.checkpoint_path} written"
                )
            if step < settings.steps and step % settings.checkpoint_every == 0:
                state.save(context, step)
    return TrainingOutcome(diverged, step, train_seconds)


def summary(context: RunContext, state: ResumableState, outcome: TrainingOutcome) -> dict[str, Any]:
    """What summary.json holds: the run's identity and result (the fields the report
    aggregates), its parameter counts and speed, and the provenance."""
    settings, best = context.settings, state.best
    done = outcome.final_step - state.start_step
    steps_per_second = done / outcome.train_seconds if outcome.train_seconds > 0 else None
    return {
        "experiment": settings.experiment,
        "model": settings.model,
        "dataset": settings.dataset,
        "configuration": settings.configuration,
        "optimizer": settings.optimizer,
        "lr": float(settings.lr),
        "seed": int(settings.seed),
        "status": "diverged" if outcome.diverged else "completed",
        "diverged": outcome.diverged,
        "best_step": best["step"] if best else None,
        "best_val_accuracy": best["val_accuracy"] if best else None,
        "best_val_loss": best["val_loss"] if best else None,
        "test_accuracy": best["test_accuracy"] if best else None,
        "final_step": outcome.final_step,
        "steps": settings.steps,
        "demo": settings.demo,
        "trainable_parameters": sum(p.numel() for _, p in context.run_model.trainable),
        "total_parameters": sum(p.numel() for p in context.run_model.model.parameters()),
        "steps_per_second": steps_per_second,
        "images_per_second": steps_per_second * settings.batch_size if steps_per_second else None,
        "wall_seconds": state.wall_seconds(context),
        "resumed": state.resumed,
        **provenance(
            {**dataclasses.asdict(settings), "resolved": context.resolved}, context.device
        ),
    }


def write_outputs(context: RunContext, state: ResumableState, run_summary: dict[str, Any]) -> None:
    """Write metrics.parquet (the summary in its footer) and summary.json, then delete the
    checkpoint: a finished run leaves its two files only."""
    write_parquet(
        context.out_dir / "metrics.parquet",
        _metrics_frame(state.rows),
        metadata={"summary": run_summary},
    )
    write_json(context.out_dir / "summary.json", run_summary)
    remove_checkpoint(context.checkpoint_path)


def train(
    run: Run, settings: TrainingSettings, dataset_dir: str | Path, out_dir: str | Path
) -> dict[str, Any]:
    """Finetune ``run`` with ``settings``; write metrics.parquet and summary.json into ``out_dir``.

    Resumes from ``out_dir/checkpoint.pt`` when one written with the same settings exists.

    Returns:
        The summary (what summary.json holds).

    Raises:
        ValueError: for a bad setting, naming its flag and config key.
        FileNotFoundError: when ``dataset_dir`` is not a prepared dataset.
        Preempted: when SIGTERM arrived; the checkpoint is written first.
    """
    context = setup_run(FinetuneSettings.of(run, settings), dataset_dir, out_dir)
    state = ResumableState.resume(context)
    outcome = train_steps(context, state)
    run_summary = summary(context, state, outcome)
    write_outputs(context, state, run_summary)
    return run_summary


def run(settings: FinetuneSettings, dataset_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """:func:`train` for a run given as one :class:`FinetuneSettings` (identity + settings)."""
    return train(settings.identity, settings.training, dataset_dir, out_dir)
