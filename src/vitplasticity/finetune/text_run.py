"""Single-component finetuning of a text model on the user's text file: a causal LM with the
next-token loss, an encoder (BERT, RoBERTa, DeBERTa-v2) with the masked-LM loss.

The run is the image run's (:mod:`vitplasticity.finetune.train`) with a language-modelling
task in place of the classifier: the same run identity, settings checks, optimizer, warm-up
and cosine schedule, gradient accumulation and clipping, checkpoints (every
``checkpoint_every`` steps and on SIGTERM, resumed bit for bit on the CPU), folder lock and
kept copy of a finished run. What differs:

- **Model**: the LM of the ``models:`` entry, its own LM head included
  (:func:`build_text_lm`): a decoder as its causal LM (a bare one inside its causal-LM class,
  head tied to the token embedding), an encoder as its ``...ForMaskedLM`` (named in
  ``model_class``; a bare encoder or a classifier is refused, it has no MLM head).
  Configurations select parameters as for images (:class:`ParameterMap`): every
  configuration trains the head (an LM head tied to the token embedding adds no parameter
  of its own; BERT's MLM transform and output bias are its head) and the final norm.
- **Data**: the text file cut into sequences of ``sequence_length`` tokens
  (:func:`vitplasticity.data.text.read_sequences`), split by
  :func:`vitplasticity.data.text.split_sequences` (fixed, not seeded). Step s trains on
  positions s * B ... (s + 1) * B - 1 of a stream of permutations of the training
  sequences, permutation e drawn from (seed, e): the batch of a step is known from the step.
- **Masks** (encoders): a fixed count of positions per sequence
  (:func:`~vitplasticity.finetune.text_loss.masked_positions`), drawn from (seed, step) for
  training and from a constant for validation, so every run is validated on the same masks.
- **Metric and model selection**: validation loss (mean token cross-entropy) and perplexity;
  the run's result is the lowest validation loss (the earliest on ties). There is no test
  split: the text has none.

Every step reads its loss back (no deferred steps as images have): a text run here is small.
The image loader's settings (``augment``, ``num_workers``) and LoRA's do not apply (nor are they
recorded in the summary's settings), and ``compile`` is
refused (not implemented for text).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch import nn

from vitplasticity.finetune import finished
from vitplasticity.finetune.checkpoint import (
    CHECKPOINT_NAME,
    fingerprint,
    load_checkpoint,
    remove_checkpoint,
    restore_run,
    rng_states,
    save_checkpoint,
)
from vitplasticity.finetune.identity import FinetuneSettings, check_runs, tracked_job
from vitplasticity.finetune.loop import Preempted, sigterm_flag
from vitplasticity.finetune.model import freeze
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.precision import autocast
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.step import scheduled_lr
from vitplasticity.finetune.text_loss import (
    CAUSAL,
    MASKED,
    masked_inputs,
    masked_lm_loss,
    masked_positions,
    next_token_loss,
    perplexity,
)
from vitplasticity.finetune.text_settings import IMAGE_ONLY_TRAINING_FIELDS, TextFinetuneSettings
from vitplasticity.models.architectures import (
    ParameterMap,
    UnsupportedModel,
    architecture_for,
    parse_configuration,
)
from vitplasticity.models.build import pick_device
from vitplasticity.provenance import provenance
from vitplasticity.utils.folder_lock import hold_folder
from vitplasticity.utils.io import remove_stale_temporaries, write_json, write_parquet
from vitplasticity.utils.tracking import NO_TRACKER, Tracker, TrackingOptions, tracking

log = logging.getLogger(__name__)

VAL_MASK_SEED = 0
"""The seed of the validation masks: one constant, so every run scores the same tokens."""

METRICS_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "kind": pl.String(),
    "lr": pl.Float64(),
    "train_loss": pl.Float64(),
    "grad_norm": pl.Float64(),
    "val_loss": pl.Float64(),
    "val_perplexity": pl.Float64(),
}
"""Columns of a text run's metrics.parquet: one row per logged train step and per validation
point."""


# --- model --------------------------------------------------------------------------------


def build_text_lm(model_name: str, model_spec: dict[str, Any]) -> tuple[nn.Module, str]:
    """(the LM of ``model_spec``, its task: :data:`CAUSAL` or :data:`MASKED`), in train mode.

    Raises:
        UnsupportedModel: for an image model, a model no architecture knows, an encoder not
            in its masked-LM class, or a decoder whose LM head cannot be tied.
        ValueError: for an entry its family refuses.
    """
    from vitplasticity.models.build import build_model
    from vitplasticity.models.registry import family_inputs
    from vitplasticity.models.text import causal_lm, text_model_spec

    image_model = UnsupportedModel(
        f"model {model_name!r} takes images: finetune it with `vitplasticity finetune` "
        "(config experiments:)"
    )
    if isinstance(model_spec, dict) and family_inputs(model_spec) == {"images"}:
        raise image_model  # a timm entry: refused before it is built
    model = build_model(text_model_spec(model_name, model_spec))
    architecture = architecture_for(model)
    if architecture.inputs != "tokens":
        raise image_model
    if architecture.text_task == MASKED:
        if not type(model).__name__.endswith("ForMaskedLM"):
            raise UnsupportedModel(
                f"model {model_name!r} is a {type(model).__name__}, an encoder without its "
                "masked-LM head: the masked-LM loss needs it; name its ...ForMaskedLM class in "
                "the model entry (model_class: BertForMaskedLM, RobertaForMaskedLM, "
                "DebertaV2ForMaskedLM)"
            )
        return model.train(), MASKED
    return causal_lm(model).train(), CAUSAL


def mask_token_id(tokenizer: str, vocab_size: int) -> int:
    """The id an encoder's masked positions get: the tokenizer's mask token; with the byte
    tokenizer (a random-init model, which has none), the last id, ``vocab_size - 1``.

    Raises:
        ValueError: for a transformers tokenizer without a mask token.
    """
    from vitplasticity.data.text import BYTE_TOKENIZER

    if tokenizer == BYTE_TOKENIZER:
        return vocab_size - 1
    from vitplasticity.utils.optional import require_transformers

    loaded = require_transformers().AutoTokenizer.from_pretrained(tokenizer)
    if loaded.mask_token_id is None:
        raise ValueError(
            f"--tokenizer {tokenizer}: has no mask token; the masked-LM loss needs one"
        )
    return int(loaded.mask_token_id)


# --- data -----------------------------------------------------------------------------------


def batch_indices(step_index: int, batch_size: int, n_train: int, seed: int) -> np.ndarray:
    """The training sequences of update ``step_index`` (0-based): positions
    ``step_index * batch_size`` on of a stream of permutations of ``range(n_train)``,
    permutation e drawn from ``(seed, e)``."""
    positions = np.arange(step_index * batch_size, (step_index + 1) * batch_size)
    epochs, offsets = positions // n_train, positions % n_train
    return np.array(
        [_permutation(seed, int(e), n_train)[o] for e, o in zip(epochs, offsets, strict=True)]
    )


@functools.lru_cache(maxsize=2)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """Permutation ``epoch`` of ``range(n)`` (kept: the steps of an epoch share it; two, for
    the batch that spans two epochs)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def train_mask(shape: torch.Size, probability: float, seed: int, step_index: int) -> torch.Tensor:
    """The masked positions of update ``step_index``'s batch, drawn from (seed, step)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step_index)
    return masked_positions(shape, probability, generator)


# --- the run ------------------------------------------------------------------------------


@dataclass
class TextRunContext:
    """What a text run prepares before its first step."""

    settings: FinetuneSettings
    text: TextFinetuneSettings
    out_dir: Path
    device: torch.device
    lm: nn.Module
    kind: str  # CAUSAL | MASKED
    mask_id: int | None
    trainable: list[tuple[str, nn.Parameter]]
    optimizer: torch.optim.Optimizer
    train: torch.Tensor  # (N, L) int64, on the CPU
    val: torch.Tensor  # (M, L) int64
    val_mask: torch.Tensor | None  # (M, L) bool, encoders only
    resolved: dict[str, Any]
    started: float

    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / CHECKPOINT_NAME

    def key(self) -> str:
        """The settings a checkpoint and the kept copy must match."""
        return run_key(self.settings, self.text)


def run_key(settings: FinetuneSettings, text: TextFinetuneSettings) -> str:
    """The fingerprint of the settings that shape a text run's numbers (what a checkpoint and
    the kept copy of a finished run must match)."""
    return fingerprint({**settings.fingerprint_fields(), **dataclasses.asdict(text)})


def setup_text_run(
    settings: FinetuneSettings,
    text: TextFinetuneSettings,
    text_path: str | Path,
    device: torch.device,
    out_dir: Path,
) -> TextRunContext:
    """Build the run's LM (seeded by the run seed), freeze it but for its configuration, read
    and split the text, and make the optimizer.

    Raises:
        UnsupportedModel: as :func:`build_text_lm`, or for a configuration the model's
            architecture refuses ("lora" is not offered for text here).
        ValueError: for a sequence longer than the model's positions, or a text too short.
    """
    from vitplasticity.data.text import load_tokenizer, read_sequences, split_sequences
    from vitplasticity.models.text import max_positions, text_model_spec, tokenizer_name

    started = time.perf_counter()
    run, training = settings.run, settings.training
    if "lora" in parse_configuration(run.configuration):
        raise UnsupportedModel(f"--configuration {run.configuration}: LoRA is not offered for text")
    torch.manual_seed(run.seed)
    lm, kind = build_text_lm(run.model, training.model_spec)
    limit = max_positions(lm.config)
    if limit is not None and text.sequence_length > limit:
        raise ValueError(
            f"--sequence-length {text.sequence_length} exceeds the {limit} positions of model "
            f"{run.model!r}"
        )
    tokenizer = tokenizer_name(text.tokenizer, text_model_spec(run.model, training.model_spec))
    vocab_size = lm.config.vocab_size
    sequences = read_sequences(
        text_path, load_tokenizer(tokenizer, vocab_size), text.sequence_length
    )
    train_part, val_part = split_sequences(sequences, training.val_fraction)
    mask_id = mask_token_id(tokenizer, vocab_size) if kind == MASKED else None
    val = torch.from_numpy(val_part)
    val_mask = None
    if kind == MASKED:
        generator = torch.Generator().manual_seed(VAL_MASK_SEED)
        val_mask = masked_positions(val.shape, text.mask_probability, generator)
    parameters = ParameterMap(architecture_for(lm), lm)
    trained = freeze(lm, parameters, run.configuration)
    lm.to(device).train()
    trainable = [(n, p) for n, p in lm.named_parameters() if n in trained]
    resolved = {
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "task": kind,
        "lm_class": type(lm).__name__,
        "tokenizer": tokenizer,
        "mask_token_id": mask_id,
        "split_sizes": {"train": len(train_part), "val": len(val_part)},
        "split_rule": "sequence i is val when floor((i+1)f) > floor(if), f = val_fraction",
        "model_selection": "lowest validation loss (earliest)",
    }
    log.info("run %s: %s", out_dir, resolved)
    return TextRunContext(
        settings=settings,
        text=text,
        out_dir=out_dir,
        device=device,
        lm=lm,
        kind=kind,
        mask_id=mask_id,
        trainable=trainable,
        optimizer=build_optimizer(trainable, settings),
        train=torch.from_numpy(train_part),
        val=val,
        val_mask=val_mask,
        resolved=resolved,
        started=started,
    )


def lm_loss(context: TextRunContext, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean token loss of the LM on the sequences ``ids`` (B, L), on the device; ``mask``
    (B, L) the masked positions of an encoder."""
    ids = ids.to(context.device)
    with autocast(context.device, context.settings.training.precision):
        if context.kind == CAUSAL:
            logits = context.lm(input_ids=ids, use_cache=False).logits  # (B, L, V)
            return next_token_loss(logits, ids)
        mask = mask.to(context.device)
        logits = context.lm(input_ids=masked_inputs(ids, mask, context.mask_id)).logits
        return masked_lm_loss(logits, ids, mask)


def validation_loss(context: TextRunContext) -> float:
    """Mean token cross-entropy over the validation sequences (each predicts as many tokens
    as the others, so the mean of the per-batch means weighted by their sizes is exact)."""
    context.lm.eval()
    size = 4 * context.settings.training.micro_batch_size
    total = 0.0
    with torch.inference_mode():
        for start in range(0, len(context.val), size):
            ids = context.val[start : start + size]
            mask = None if context.val_mask is None else context.val_mask[start : start + size]
            total += float(lm_loss(context, ids, mask)) * len(ids)
    context.lm.train()
    return total / len(context.val)


def training_step(context: TextRunContext, step_index: int) -> tuple[float, float, float]:
    """One update (gradients accumulated over micro-batches, clipped, applied at the
    scheduled rate unless non-finite): (loss, gradient norm before clipping, lr)."""
    training, run = context.settings.training, context.settings.run
    index = batch_indices(step_index, training.batch_size, len(context.train), run.seed)
    ids = context.train[torch.from_numpy(index)]  # (B, L)
    mask = None
    if context.kind == MASKED:
        mask = train_mask(ids.shape, context.text.mask_probability, run.seed, step_index)
    context.optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=context.device)
    share = training.micro_batch_size / training.batch_size
    for start in range(0, training.batch_size, training.micro_batch_size):
        chunk = slice(start, start + training.micro_batch_size)
        loss = lm_loss(context, ids[chunk], None if mask is None else mask[chunk]) * share
        loss.backward()
        total += loss.detach()  # on the device: no synchronisation per micro-batch
    parameters = [p for _, p in context.trainable]
    norm = torch.nn.utils.clip_grad_norm_(parameters, training.clip_grad_norm)
    # One device-to-host copy for both numbers.
    total, norm = torch.stack([total, norm.to(total.dtype)]).tolist()
    lr = scheduled_lr(step_index, context.settings)
    if np.isfinite(total) and np.isfinite(norm):
        for group in context.optimizer.param_groups:
            group["lr"] = lr
        context.optimizer.step()
    return total, norm, lr


@dataclass
class TextRunState:
    """What a text run has done so far (saved in its checkpoint)."""

    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best: dict[str, Any] | None = None
    start_step: int = 0
    wall_before: float = 0.0
    resumed: bool = False
    tracker: Tracker = dataclasses.field(default=NO_TRACKER, repr=False)
    tracker_runs: dict[str, str] = dataclasses.field(default_factory=dict)

    def record(self, row: dict[str, Any]) -> None:
        """Add a row (and log it to the tracker); a validation loss lower than every earlier
        one becomes the best (ties keep the earliest)."""
        self.rows.append(row)
        self.tracker.log_row(row)
        if row["kind"] == "val" and (self.best is None or row["val_loss"] < self.best["val_loss"]):
            self.best = {k: row[k] for k in ("step", "val_loss", "val_perplexity")}

    def save(self, context: TextRunContext, step: int) -> None:
        save_checkpoint(
            context.checkpoint_path,
            {
                "step": step,
                "trainable": {name: p.detach() for name, p in context.trainable},
                "optimizer": context.optimizer.state_dict(),
                "rng": rng_states(),
                "rows": self.rows,
                "best": self.best,
                "wall_seconds": self.wall_seconds(context),
                "tracker_runs": {**self.tracker_runs, **self.tracker.run_ids()},
            },
            context.key(),
        )

    def wall_seconds(self, context: TextRunContext) -> float:
        return self.wall_before + time.perf_counter() - context.started

    @classmethod
    def resume(cls, context: TextRunContext) -> TextRunState:
        """A fresh state, or the checkpoint's (restored into ``context``) when one written
        with the same settings is in the run's folder."""
        state = cls()
        saved = load_checkpoint(context.checkpoint_path, context.key())
        if saved is None:
            return state
        restore_run(state, saved, context.trainable, context.optimizer, context.checkpoint_path)
        return state


def _validation_row(context: TextRunContext, step: int, lr: float) -> dict[str, Any]:
    loss = validation_loss(context)
    log.info("step %d val loss %.4f perplexity %.4g", step, loss, perplexity(loss))
    return {
        "step": step,
        "kind": "val",
        "lr": lr,
        "val_loss": loss,
        "val_perplexity": perplexity(loss),
    }


def train_text_steps(context: TextRunContext, state: TextRunState) -> tuple[bool, int]:
    """The steps from ``state.start_step`` to the last: (diverged, the last step taken).

    Raises:
        Preempted: when SIGTERM arrived; the checkpoint is written first.
    """
    training = context.settings.training
    step = state.start_step
    with sigterm_flag() as sigterm:
        for step_index in range(state.start_step, training.steps):
            step = step_index + 1
            loss, norm, lr = training_step(context, step_index)
            diverged = not (np.isfinite(loss) and np.isfinite(norm))
            if diverged or step == 1 or step % training.log_every == 0 or step == training.steps:
                state.record(
                    {"step": step, "kind": "train", "lr": lr, "train_loss": loss, "grad_norm": norm}
                )
                log.info("step %d loss %.4f grad %.4f lr %.3g", step, loss, norm, lr)
            if diverged:
                log.warning("step %d: non-finite loss or gradient; the run diverged", step)
                return True, step
            if step % training.val_every == 0 or step == training.steps:
                state.record(_validation_row(context, step, lr))
            if step < training.steps and sigterm.is_set():
                state.save(context, step)
                raise Preempted(
                    f"SIGTERM after step {step}: checkpoint {context.checkpoint_path} written"
                )
            if step < training.steps and step % training.checkpoint_every == 0:
                state.save(context, step)
    return False, step


def text_summary(
    context: TextRunContext, state: TextRunState, diverged: bool, final_step: int
) -> dict[str, Any]:
    """What summary.json holds: the run's identity, its result (lowest validation loss and
    its perplexity), parameter counts and provenance."""
    run, training, best = context.settings.run, context.settings.training, state.best
    return {
        "experiment": run.experiment,
        "model": run.model,
        "dataset": run.dataset,
        "configuration": run.configuration,
        "task": context.kind,
        "optimizer": training.optimizer,
        "lr": float(run.lr),
        "seed": int(run.seed),
        "status": "diverged" if diverged else "completed",
        "diverged": diverged,
        "best_step": best["step"] if best else None,
        "best_val_loss": best["val_loss"] if best else None,
        "best_val_perplexity": best["val_perplexity"] if best else None,
        "final_step": final_step,
        "steps": training.steps,
        "demo": training.demo,
        "trainable_parameters": sum(p.numel() for _, p in context.trainable),
        "total_parameters": sum(p.numel() for p in context.lm.parameters()),
        "wall_seconds": state.wall_seconds(context),
        "resumed": state.resumed,
        **provenance(
            {
                **_used_settings(context.settings.record()),
                **dataclasses.asdict(context.text),
                "resolved": context.resolved,
            },
            context.device,
        ),
    }


def _used_settings(record: dict[str, Any]) -> dict[str, Any]:
    """The run's settings without those a text run does not use
    (:data:`~vitplasticity.finetune.text_settings.IMAGE_ONLY_TRAINING_FIELDS`): their values
    are the flags' defaults, not what the config said (the workflow passes them none)."""
    return {k: v for k, v in record.items() if k not in IMAGE_ONLY_TRAINING_FIELDS}


def train_text_run(
    run: Run,
    training: TrainingSettings,
    text: TextFinetuneSettings,
    text_path: str | Path,
    out_dir: str | Path,
    tracking_options: TrackingOptions | None = None,
) -> dict[str, Any]:
    """Finetune ``run`` on the text file ``text_path``; write metrics.parquet and summary.json
    into ``out_dir``; return the summary. With ``tracking_options``, the run's config, rows
    and summary also go to a tracker (as an image run's: :func:`vitplasticity.finetune.train.train_runs`).

    Raises:
        ValueError: for a bad setting (naming its flag and config key), a GPU asked for where
            none is visible, a sequence longer than the model's positions, a text too short.
        FileNotFoundError: for a missing text file.
        UnsupportedModel: as :func:`build_text_lm`.
        Preempted: when SIGTERM arrived; the checkpoint is written.
        FolderBusy: when another process holds ``out_dir``.
    """
    from vitplasticity.settings.declaration import bad_setting, check_settings

    check_runs([run], training)
    check_settings(text)
    if training.compile:
        raise bad_setting("--compile", "finetune.compile", "not implemented for text runs")
    if not Path(text_path).is_file():
        raise FileNotFoundError(f"--text: text file not found: {text_path}")
    device = pick_device(training.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device (finetune.device): {training.device!r} but no GPU is visible")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with hold_folder(out_dir):
        for stale in remove_stale_temporaries(out_dir):
            log.info("removed %s, left by a run killed while writing it", stale)
        settings = FinetuneSettings(run, training)
        key = run_key(settings, text)
        if finished.restore(out_dir, key):
            log.info("%s: finished by an earlier job, put back from %s", out_dir, finished.KEPT_DIR)
            remove_checkpoint(out_dir / CHECKPOINT_NAME)
            return json.loads((out_dir / "summary.json").read_text())
        context = setup_text_run(settings, text, text_path, device, out_dir)
        state = TextRunState.resume(context)
        job = tracked_job(settings, "finetune_text")
        with tracking(tracking_options, job, state.tracker_runs) as tracker:
            state.tracker = tracker
            diverged, final_step = train_text_steps(context, state)
            run_summary = text_summary(context, state, diverged, final_step)
            rows = {name: [row.get(name) for row in state.rows] for name in METRICS_SCHEMA}
            frame = pl.DataFrame(rows, schema=METRICS_SCHEMA)
            write_parquet(out_dir / "metrics.parquet", frame, metadata={"summary": run_summary})
            write_json(out_dir / "summary.json", run_summary)
            tracker.log_summary(run_summary)
        finished.keep(out_dir, key)
        remove_checkpoint(context.checkpoint_path)
    log.info(
        "%s: %s at step %s, best val loss %s (step %s)",
        out_dir,
        run_summary["status"],
        final_step,
        run_summary["best_val_loss"],
        run_summary["best_step"],
    )
    return run_summary
