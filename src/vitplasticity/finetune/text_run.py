"""Single-component finetuning of a text model on the user's text file: a causal LM with the
next-token loss, an encoder (BERT, RoBERTa, DeBERTa-v2) with the masked-LM loss.

A text run is a run of the one training loop (:func:`vitplasticity.finetune.train.train_runs`
with a :class:`TextSource`): the same run identity, settings checks, optimizer, warm-up and
cosine schedule, gradient accumulation and clipping, deferred read-backs, checkpoints
(resumed bit for bit on the CPU), rungs, packs, folder lock and kept copy of a finished run.
What this module adds:

- **Model**: the LM of the ``models:`` entry, its own LM head included
  (:func:`build_text_lm`): a decoder as its causal LM (a bare one inside its causal-LM class,
  the head tied to the token embedding, or, where the config unties it, a new head drawn from
  the run's seed), an encoder as its ``...ForMaskedLM`` (a bare encoder, as
  sentence-transformers saves one, inside its masked-LM class: the encoder the checkpoint's,
  the MLM head initialised from the run's seed, which the run's record says).
  Configurations select parameters as for images (:class:`ParameterMap`): every
  configuration trains the head (an LM head tied to the token embedding adds no parameter
  of its own; BERT's MLM transform and output bias are its head) and the final norm.
- **Data** (:class:`TextInputs`): the text file cut into sequences of ``sequence_length``
  tokens (:func:`vitplasticity.data.text.read_sequences`), split by
  :func:`vitplasticity.data.text.split_sequences` (fixed, not seeded). Step s trains on
  positions s * B ... (s + 1) * B - 1 of a stream of permutations of the training
  sequences, permutation e drawn from (seed, e), as for images
  (:func:`vitplasticity.data.loader.batch_indices`).
- **Masks** (encoders): a fixed count of positions per sequence (:func:`masked_positions`),
  drawn from (seed, step) for training and from a constant for validation, so every run is
  validated on the same masks.
- **Task**: :class:`CausalLM` or :class:`MaskedLM` (:mod:`vitplasticity.finetune.tasks`).

The image loader's settings (``augment``, ``num_workers``) do not apply (nor are they recorded in
the summary's settings), and ``compile`` is
refused (not implemented for text).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitplasticity.data import loader
from vitplasticity.data.text import load_tokenizer, read_sequences, split_sequences
from vitplasticity.finetune.checkpoint import fingerprint
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.model import adapted_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import (
    IMAGE_ONLY_TRAINING_FIELDS,
    TextFinetuneSettings,
    TrainingSettings,
)
from vitplasticity.finetune.setup import EvalSets, RunContext, usable_device
from vitplasticity.finetune.tasks import (
    CAUSAL,
    MASKED,
    Batch,
    CausalLM,
    MaskedLM,
    TextClassification,
)
from vitplasticity.finetune.train import train_runs
from vitplasticity.models.architectures import (
    UnsupportedModel,
    architecture_for,
    parse_configuration,
)
from vitplasticity.models.text import check_sequence_length, text_model_spec, tokenizer_name
from vitplasticity.utils.tracking import TrackingOptions

log = logging.getLogger(__name__)

VAL_MASK_SEED = 0
"""The seed of the validation masks: one constant, so every run scores the same tokens."""

# --- model --------------------------------------------------------------------------------


def build_text_base(model_name: str, model_spec: dict[str, Any]) -> nn.Module:
    """The text model of ``model_spec`` as its entry builds it (a bare model, a task class),
    drawing a random init's weights from the torch RNG.

    Raises:
        UnsupportedModel: for an image model or a model no architecture knows.
        ValueError: for an entry its family refuses.
    """
    from vitplasticity.models.build import build_model
    from vitplasticity.models.registry import family_inputs
    from vitplasticity.models.text import text_model_spec

    image_model = UnsupportedModel(
        f"model {model_name!r} takes images: finetune it with `vitplasticity finetune` "
        "(config experiments:)"
    )
    if isinstance(model_spec, dict) and family_inputs(model_spec) == {"images"}:
        raise image_model  # a timm entry: refused before it is built
    model = build_model(text_model_spec(model_name, model_spec))
    if architecture_for(model).inputs != "tokens":
        raise image_model
    return model


def build_text_lm(model_name: str, model_spec: dict[str, Any]) -> tuple[nn.Module, str, list[str]]:
    """(the LM of ``model_spec``, its task: :data:`CAUSAL` or :data:`MASKED`, the names of
    the head's tensors initialised from the torch RNG rather than loaded), in train mode.

    Raises:
        UnsupportedModel: for an image model, a model no architecture knows, an encoder
            without a masked-LM class, or a decoder without a causal-LM class.
        ValueError: for an entry its family refuses.
    """
    from vitplasticity.models.text import causal_lm_for_finetuning, masked_lm

    model = build_text_base(model_name, model_spec)
    if architecture_for(model).text_task == MASKED:
        lm, drawn = masked_lm(model)
        _log_drawn(model_name, model, "masked-LM head", drawn)
        return lm.train(), MASKED, drawn
    lm, drawn = causal_lm_for_finetuning(model)
    _log_drawn(model_name, model, "LM head (untied, so not in a bare model)", drawn)
    return lm.train(), CAUSAL, drawn


def _log_drawn(model_name: str, model: nn.Module, what: str, drawn: list[str]) -> None:
    if drawn:
        log.info(
            "model %r is a %s: its %s (%s) is initialised from the run's seed, not loaded; "
            "the rest is the checkpoint's",
            model_name,
            type(model).__name__,
            what,
            ", ".join(drawn),
        )


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


def masked_positions(
    shape: torch.Size, probability: float, generator: torch.Generator
) -> torch.Tensor:
    """A boolean mask (B, L) with exactly ``max(1, round(probability * L))`` masked positions
    per sequence, drawn from ``generator``.

    A fixed count per sequence (not BERT's independent coin per token) keeps every batch's
    loss defined: a sequence with no masked token would make it 0 / 0.
    """
    batch, length = shape
    count = max(1, round(probability * length))
    scores = torch.rand(batch, length, generator=generator)
    chosen = scores.argsort(dim=1)[:, :count]  # (B, count)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[torch.arange(batch)[:, None], chosen] = True
    return mask


def train_mask(shape: torch.Size, probability: float, seed: int, step_index: int) -> torch.Tensor:
    """The masked positions of update ``step_index``'s batch, drawn from (seed, step)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step_index)
    return masked_positions(shape, probability, generator)


# --- the run ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TextInputs:
    """The training batches of a text run (:class:`~vitplasticity.finetune.setup.StepInputs`):
    the rows of ``train`` that step s draws, (ids,) for a decoder, (ids, attention, labels)
    for a classifier, and an encoder's masked positions after them."""

    train: tuple[torch.Tensor, ...]  # each (N, ...), on the CPU: ids (N, L) int64 first
    batch_size: int
    seed: int
    mask_probability: float | None  # None: no masks (a decoder, a classifier)

    @property
    def size(self) -> int:
        return len(self.train[0])

    def items(self, start_step: int, end: int) -> Iterator[int]:
        return iter(range(start_step, end))

    def batch(self, item: int) -> Batch:
        """The batch of update ``item`` (its 0-based step index)."""
        index = torch.from_numpy(loader.batch_indices(item, self.batch_size, self.size, self.seed))
        parts = tuple(part[index] for part in self.train)  # each (B, ...)
        if self.mask_probability is None:
            return parts
        return (*parts, train_mask(parts[0].shape, self.mask_probability, self.seed, item))


@dataclass(frozen=True)
class TensorSet:
    """An evaluation set of a text run: tensors whose rows are its examples (ids first; an
    encoder's fixed masks, or a classifier's attention and labels, after them)."""

    parts: tuple[torch.Tensor, ...]

    def __len__(self) -> int:
        return len(self.parts[0])

    def batches(self, size: int) -> Iterator[Batch]:
        for start in range(0, len(self), size):
            yield tuple(part[start : start + size] for part in self.parts)


@dataclass(frozen=True)
class TextSource:
    """The runs' data is the text at ``path`` with the ``text`` settings: a text file (the
    task the model's: :class:`CausalLM` or :class:`MaskedLM`), or with ``labelled`` a
    labelled text dataset (:mod:`vitplasticity.data.labelled`; the task
    :class:`TextClassification`, the model inside its sequence-classification class)."""

    text: TextFinetuneSettings
    path: Path
    dataset: str | None = None
    """The dataset's name, which a bad setting's message names (``datasets.<name>.<key>``)."""
    labelled: bool = False

    def check(self, training: TrainingSettings) -> torch.device:
        """The device of the runs, after checking the text settings and file.

        Raises:
            ValueError: for a bad text setting or ``compile``, or a GPU asked for where none
                is visible.
            FileNotFoundError: for a missing text file or labelled dataset.
        """
        from vitplasticity.settings.declaration import bad_setting, check_settings

        check_settings(self.text, {"datasets": self.dataset or self.path.stem})
        if training.compile:
            raise bad_setting("--compile", "finetune.compile", "not implemented for text runs")
        if self.labelled:
            if not self.path.exists():
                raise FileNotFoundError(f"--labelled-text: not found: {self.path}")
        elif not self.path.is_file():
            raise FileNotFoundError(f"--text: text file not found: {self.path}")
        return usable_device(training)

    def used_text_settings(self) -> dict[str, Any]:
        """The text settings the runs use: a classifier masks nothing."""
        used = dataclasses.asdict(self.text)
        if self.labelled:
            del used["mask_probability"]
        return used

    def key(self, settings: FinetuneSettings) -> str:
        return fingerprint({**settings.fingerprint_fields(), **self.used_text_settings()})

    def setup(self, settings: FinetuneSettings, device: torch.device, out_dir: Path) -> RunContext:
        """Build the run's model (seeded by the run seed), adapt and freeze it for its
        configuration, read and split the text, and make the optimizer.

        Raises:
            UnsupportedModel: as :func:`build_text_lm` (or, for labelled text, for a model
                without a sequence-classification class), or for LoRA where the model's
                architecture refuses it (:func:`~vitplasticity.finetune.model.adapted_run_model`).
            ValueError: for a sequence longer than the model's positions, a text too short,
                or a bad labelled dataset.
        """
        started = time.perf_counter()
        if self.labelled:
            part = self._classification(settings)
        else:
            torch.manual_seed(settings.run.seed)
            part = self._language_modelling(settings)
        model, task, inputs, evaluation, resolved = part
        sample = torch.zeros(1, self.text.sequence_length, dtype=torch.int64)  # (1, L) token ids
        run_model = adapted_run_model(model, settings, sample, device)
        resolved = {"device": str(device), "torch_threads": torch.get_num_threads(), **resolved}
        log.info("run %s: %s", out_dir, resolved)
        return RunContext(
            settings=settings,
            out_dir=out_dir,
            device=device,
            run_model=run_model,
            optimizer=build_optimizer(run_model.trainable, settings),
            task=task,
            inputs=inputs,
            evaluation=evaluation,
            key=self.key(settings),
            record={**_used_settings(settings), **self.used_text_settings()},
            resolved=resolved,
            started=started,
        )

    def _language_modelling(self, settings: FinetuneSettings) -> tuple[Any, ...]:
        """(the LM, its task, the training inputs, the validation set, what the run resolved)
        of a text file."""
        run, training, text = settings.run, settings.training, self.text
        lm, kind, drawn = build_text_lm(run.model, training.model_spec)
        check_sequence_length(lm.config, text.sequence_length, run.model)
        tokenizer = self._tokenizer(settings.run.model, settings.training)
        loaded = load_tokenizer(tokenizer, lm.config.vocab_size)
        train_part, val_part = split_sequences(
            read_sequences(self.path, loaded, text.sequence_length), training.val_fraction
        )
        val, val_mask, task = torch.from_numpy(val_part), None, CausalLM()
        mask_id = mask_token_id(tokenizer, lm.config.vocab_size) if kind == MASKED else None
        if mask_id is not None:
            generator = torch.Generator().manual_seed(VAL_MASK_SEED)
            val_mask = masked_positions(val.shape, text.mask_probability, generator)
            task = MaskedLM(mask_id)
        resolved = {
            "task": kind,
            "lm_class": type(lm).__name__,
            # A bare encoder's MLM head is new: drawn from the run seed, as an image run's.
            "lm_head": (
                f"initialised from the run seed, not loaded: {', '.join(drawn)}"
                if drawn
                else "the checkpoint's (or tied to the token embedding)"
            ),
            "tokenizer": tokenizer,
            "mask_token_id": mask_id,
            "split_sizes": {"train": len(train_part), "val": len(val_part)},
            "split_rule": "sequence i is val when floor((i+1)f) > floor(if), f = val_fraction",
            "model_selection": "lowest validation loss (earliest)",
        }
        probability = text.mask_probability if mask_id is not None else None
        inputs = TextInputs(
            (torch.from_numpy(train_part),), training.batch_size, run.seed, probability
        )
        evaluation = TensorSet((val,) if val_mask is None else (val, val_mask))
        return lm, task, inputs, evaluation, resolved

    def _classification(self, settings: FinetuneSettings) -> tuple[Any, ...]:
        """(the sequence classifier, its task, the training inputs, the validation and test
        sets, what the run resolved) of a labelled text dataset: the pool split into
        training and validation by the run seed, as an image run's."""
        from vitplasticity.data.labelled import encode_texts, read_labelled
        from vitplasticity.data.store import split_pool
        from vitplasticity.models.text import sequence_classifier

        run, training, length = settings.run, settings.training, self.text.sequence_length
        dataset = read_labelled(self.path)
        torch.manual_seed(run.seed)
        base = build_text_base(run.model, training.model_spec)
        check_sequence_length(base.config, length, run.model)
        tokenizer = self._tokenizer(settings.run.model, settings.training)
        vocab = base.config.vocab_size
        pool, pad_id = encode_texts(dataset.pool.texts, tokenizer, vocab, length)
        test, _ = encode_texts(dataset.test.texts, tokenizer, vocab, length)
        model, drawn = sequence_classifier(base, len(dataset.classes), pad_id)
        _log_drawn(run.model, base, "classification head", drawn)
        train_index, val_index = split_pool(len(dataset.pool), run.seed, training.val_fraction)

        def rows(
            encoded: Any, labels: np.ndarray, index: Any = slice(None)
        ) -> tuple[torch.Tensor, ...]:
            return tuple(
                torch.from_numpy(np.ascontiguousarray(part[index]))
                for part in (encoded.ids, encoded.attention, labels)
            )

        labels = dataset.pool.labels
        resolved = {
            "task": "classification",
            "classifier_class": type(model).__name__,
            "head": f"initialised from the run seed, not loaded: {', '.join(drawn)}",
            "tokenizer": tokenizer,
            "pad_token_id": pad_id,
            "classes": list(dataset.classes),
            "split_sizes": {
                "train": len(train_index),
                "val": len(val_index),
                "test": len(test.ids),
            },
            "split_rule": f"pool/test: {dataset.split_rule}; train/val: seeded by the run seed",
            "truncated_documents": pool.truncated + test.truncated,
            "model_selection": "highest validation accuracy (earliest)",
        }
        inputs = TextInputs(rows(pool, labels, train_index), training.batch_size, run.seed, None)
        evaluation = EvalSets(
            TensorSet(rows(pool, labels, val_index)), TensorSet(rows(test, dataset.test.labels))
        )
        return model.train(), TextClassification(), inputs, evaluation, resolved

    def classifier(self, model_name: str, training: TrainingSettings) -> nn.Module:
        """The runs' model as built before any step, with the head drawn from the torch RNG
        as the caller seeded it (a verified export names its parameters)."""
        from vitplasticity.data.labelled import padding_id, read_labelled
        from vitplasticity.models.text import sequence_classifier

        classes = read_labelled(self.path).classes
        base = build_text_base(model_name, training.model_spec)
        pad = padding_id(self._tokenizer(model_name, training), base.config.vocab_size)
        return sequence_classifier(base, len(classes), pad)[0]

    def _tokenizer(self, model_name: str, training: TrainingSettings) -> str:
        """The tokenizer's name: the setting, ``auto`` resolved for the run's model."""
        spec = text_model_spec(model_name, training.model_spec)
        return tokenizer_name(self.text.tokenizer, spec)


def _used_settings(settings: FinetuneSettings) -> dict[str, Any]:
    """The run's settings without those a text run does not use
    (:data:`~vitplasticity.finetune.settings.IMAGE_ONLY_TRAINING_FIELDS`, LoRA's kept for a
    LoRA run): their values are the flags' defaults, not what the config said (the workflow
    passes them none)."""
    unused = set(IMAGE_ONLY_TRAINING_FIELDS)
    if "lora" in parse_configuration(settings.run.configuration):
        unused -= {"lora_rank", "lora_alpha"}
    return {k: v for k, v in settings.record().items() if k not in unused}


def train_text_run(
    run: Run,
    training: TrainingSettings,
    text: TextFinetuneSettings,
    text_path: str | Path,
    out_dir: str | Path,
    stop_at: int | None = None,
    tracking_options: TrackingOptions | None = None,
) -> dict[str, Any]:
    """Finetune ``run`` on the text file ``text_path`` (:func:`train_runs` of one run with a
    :class:`TextSource`); write metrics.parquet and summary.json into ``out_dir``; return the
    summary (the rung record when paused at ``stop_at``). With ``tracking_options``, the run's
    config, rows and summary also go to a tracker, as an image run's.

    Raises:
        ValueError: for a bad setting (naming its flag and config key), a GPU asked for where
            none is visible, a sequence longer than the model's positions, a text too short.
        FileNotFoundError: for a missing text file.
        UnsupportedModel: as :func:`build_text_lm`.
        Preempted: when SIGTERM arrived; the checkpoint is written.
        RunsRefused: when another process holds ``out_dir``.
    """
    source = TextSource(text, Path(text_path))
    return train_runs([(run, out_dir)], training, source, stop_at, tracking_options)[0]
