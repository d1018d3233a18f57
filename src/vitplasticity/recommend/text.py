"""The ``recommend`` stage for a text model: which components of a causal language model to
finetune on the user's text, ranked by the image recommend's criteria.

The text counterpart of :mod:`.pipeline`. The user's text files and a reference text are cut
into sequences as :mod:`vitplasticity.plasticity.text` cuts them
(:func:`vitplasticity.data.text.read_sequences`), and every criterion of :mod:`.criteria` is
measured once per component and pooled per configuration:

- plasticity: reference sequence i against user sequence i (cycled), the embedding protocol by
  default (docs/protocol.md), exactly as the text plasticity stage measures it;
- relative gradient norm and gradient SNR: gradients of the *next-token* cross-entropy (token t
  predicted from tokens < t, averaged over every predicted token of a batch) on batches of the
  user's sequences. There is no head warm-up: the image recommend warms up a *new* classifier
  first, whereas a causal LM's head is pretrained and is what the loss is of;
- NFN on the first gradient batch's tokens, and the data-free weight statistic where
  :func:`.criteria.weight_statistics` defines it for the family (n/a, with the reason logged,
  where it does not).

The next-token loss needs the LM head. A causal LM (``LlamaForCausalLM``, ``GPT2LMHeadModel``)
is used as it is; a bare model (``LlamaModel``, ``GPT2Model``) is wrapped in its causal-LM class
(transformers' own mapping) around the *same* modules, its head tied to the token embedding, which
only a model with ``tie_word_embeddings`` can have: a bare model with an untied head does not hold
its head's weights and is refused (name the causal-LM class instead); a classifier
(``LlamaForSequenceClassification``) is its base model in the causal-LM class, without its own
head. Components are ranked on the causal LM, every text family's task class: the export names
its parameters (``transformer.h.0...`` of ``GPT2LMHeadModel``, ``model.layers.0...`` of
``LlamaForCausalLM``).

This module builds the causal LM and runs the stage (:func:`recommend_text`); the criteria on
token ids are :mod:`.text_criteria`'s, the inputs and result :mod:`.text_inputs`', the export,
notes and files :mod:`.text_report`'s.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitplasticity.models.architectures import (
    Architecture,
    ParameterMap,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.models.build import build_model
from vitplasticity.models.streamed import StreamedModel
from vitplasticity.models.text import (
    causal_lm,
    check_sequence_length,
    check_stated_positions,
    text_model_entry,
    untied_bare_model,
)
from vitplasticity.plasticity.measured_model import MeasuredModel, measured_model
from vitplasticity.recommend.criteria import Measurements
from vitplasticity.recommend.labelled import LabelledRanking, labelled_classifier
from vitplasticity.recommend.pipeline import footer_record, rank
from vitplasticity.recommend.ranking import check_ranking
from vitplasticity.recommend.settings import RecommendTextSettings
from vitplasticity.recommend.streamed import check_streamed_criterion, measure_streamed_criteria
from vitplasticity.recommend.text_criteria import (
    measure_text_criteria,
    ranked_lm,
    ranked_module,
    user_sequences,
)
from vitplasticity.recommend.text_inputs import TextRecommendInputs, TextResult
from vitplasticity.recommend.text_report import class_path, report_notes, text_export
from vitplasticity.recommend.tokens import (
    check_text_model,
    reference_sequences,
    resolve_tokenizer,
)
from vitplasticity.settings.declaration import check_settings, recorded_settings
from vitplasticity.utils.progress import ProgressReporter

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# The model: a causal LM


def checked_text_settings(
    inputs: TextRecommendInputs, settings: RecommendTextSettings
) -> RecommendTextSettings:
    """``settings`` checked and converted (:func:`check_settings`, the budget a number), after
    checking ``inputs``; then what the ranking needs (:func:`check_ranking`) and the text
    recommend's own bound on the sequence length.

    Raises:
        ValueError: naming the CLI flag of the first bad value.
        FileNotFoundError: naming a text file that does not exist.
    """
    inputs.validate()
    settings = check_settings(settings, {"datasets": inputs.dataset})
    check_ranking(settings)
    # Two tokens at least: the next-token loss predicts token t from the tokens before.
    if settings.sequence_length < 2:
        raise ValueError(f"--sequence-length must be >= 2, got {settings.sequence_length}")
    return settings


def check_text_entry(inputs: TextRecommendInputs, settings: RecommendTextSettings) -> None:
    """What the model's entry alone says the stage would refuse once the model is built:
    checked before building it (a random init of a large model takes a while).

    Raises:
        ValueError: for a --sequence-length beyond the positions the entry's config states.
        UnsupportedModel: for a bare model whose config unties its LM head.
    """
    check_stated_positions(inputs.model, inputs.model_spec, settings.sequence_length)
    bare = untied_bare_model(inputs.model_spec)
    if bare is not None:
        raise UnsupportedModel(
            f"--model-spec of model {inputs.model!r}: {bare} has no LM head and its config "
            "unties it (tie_word_embeddings false): the head's weights are not in a bare "
            "model, and the next-token loss needs them; name the causal-LM class in "
            "model_class (e.g. LlamaForCausalLM)"
        )


def recommend_text(
    inputs: TextRecommendInputs,
    settings: RecommendTextSettings,
    model: nn.Module | None = None,
) -> TextResult:
    """Measure, rank and choose for the text model of ``inputs`` on its text files.

    Args:
        inputs: which model, and on which files.
        settings: what to measure and rank, and how to choose.
        model: the model, already built (its entry ``inputs.model_spec`` is then only
            recorded); None builds it from the entry (:func:`~vitplasticity.models.build.build_model`).

    Raises:
        ValueError: for a bad setting (naming its flag), a sequence longer than the model's
            positions, a text file too short for one sequence, or a reference text too short
            for ``n_pairs`` sequences (naming the file).
        FileNotFoundError: for a missing text file.
        UnsupportedModel: for an image model, a model no architecture knows, a bare model
            without its LM head's weights (each naming the class), or a parameter its
            architecture cannot account for.
    """
    from vitplasticity.models.build import pick_device

    settings = checked_text_settings(inputs, settings)
    device, dtype = pick_device(settings.device), getattr(torch, inputs.dtype)
    labelled = None
    if model is None:
        if inputs.labelled_text is not None:
            check_stated_positions(inputs.model, inputs.model_spec, settings.sequence_length)
        else:
            check_text_entry(inputs, settings)
        measured = _built(inputs, settings, device, dtype)
    else:
        measured = MeasuredModel(model.to(device=device, dtype=dtype), None, "built by the caller")
    if inputs.labelled_text is not None:
        labelled = labelled_classifier(inputs, settings, measured.model)
        lm = ranked = labelled.classifier
        architecture = architecture_for(ranked)
        tokenizer, references, user = labelled.tokenizer, labelled.references, labelled.user
    else:
        lm, ranked, architecture = _checked_lm(inputs, measured.model)
        tokenizer, references, user = _sequences(inputs, settings, lm, ranked)
    streamed = None
    if measured.streamed is None:
        lm = lm.to(device=device, dtype=dtype)
    else:  # the LM's own buffers too (the skeleton's are already there)
        streamed = measured.streamed.rooted(lm).to(device, dtype)
        check_streamed_criterion(settings.criterion, measured.why)
    measurements, refused = _measure(
        inputs, settings, streamed or lm, (references, user), tokenizer, device, labelled
    )
    named = {"model": inputs.model, "dataset": inputs.dataset}
    table, recommendation, configurations = rank(settings, measurements, **named)
    where = ranked_lm(lm, ranked, architecture)
    resolved = _resolved(inputs, settings, configurations, tokenizer, len(user), lm, labelled)
    resolved["streamed"] = streamed is not None
    reference = (
        f"`{Path(inputs.reference).name}` ({settings.n_pairs:,} sequences of "
        f"{settings.sequence_length} tokens, tokenizer {tokenizer})"
    )
    record = footer_record(
        settings, resolved, device, reference, recommendation, measurements, **named
    )
    export = text_export(inputs, where, recommendation, measurements)
    why = None if streamed is None else measured.why
    notes = report_notes(inputs, settings, measurements, where, len(user), refused, why)
    if labelled is not None:
        notes[0] = labelled.note(inputs, settings, len(user), gradients=streamed is None)
    return TextResult(
        inputs, settings, table, recommendation, measurements, reference, notes, record, export
    )


def _built(
    inputs: TextRecommendInputs,
    settings: RecommendTextSettings,
    device: torch.device,
    dtype: torch.dtype,
) -> MeasuredModel:
    """The text model of ``inputs`` on ``device`` in ``dtype``, built whole or streamed from
    its checkpoint as ``settings.stream`` decides
    (:func:`~vitplasticity.plasticity.measured_model.measured_model`)."""
    spec = text_model_entry(inputs.model, inputs.model_spec)
    return measured_model(spec, settings.stream, device, dtype, lambda: build_model(spec))


def _resolved(
    inputs: TextRecommendInputs,
    settings: RecommendTextSettings,
    configurations: list[str],
    tokenizer: str,
    n_user: int,
    lm: nn.Module,
    labelled: LabelledRanking | None = None,
) -> dict[str, Any]:
    """What the provenance records: the inputs and settings as resolved (the configurations
    ranked, the tokenizer loaded), the ``n_user`` user sequences, the model and its loss."""
    resolved = {
        **asdict(inputs),
        "model_spec": _recorded_spec(inputs.model_spec),
        **recorded_settings(settings, leave_out=()),
        "texts": list(inputs.texts),
        "configurations": configurations,
        "tokenizer": tokenizer,
        "user_sequences": n_user,
        "causal_lm": class_path(lm),
        "loss": "next-token cross-entropy",
    }
    if labelled is None:
        for key in ("labelled_text", "warmup_steps", "warmup_lr"):
            del resolved[key]  # a causal LM's ranking has no labels and no new head
        return resolved
    del resolved["causal_lm"]
    return {
        **resolved,
        "sequence_classifier": class_path(lm),
        "loss": "classification cross-entropy of a new head, after its warm-up",
        "head": f"initialised from --seed, not loaded: {', '.join(labelled.drawn)}",
        "classes": list(labelled.classes),
        "labelled_documents": len(labelled.labels),
    }


def _recorded_spec(entry: dict[str, Any]) -> dict[str, Any]:
    """The parsed spec's fields as JSON, as the image recommend records them (what
    recommend-verify compares its --model-spec with); the entry as given where it does not
    parse alone (a caller that passed the model built: the entry is then only recorded)."""
    from vitplasticity.models.spec import ModelSpec

    try:
        parsed = ModelSpec.from_config(entry)
    except ValueError:
        return entry
    return json.loads(json.dumps(asdict(parsed), default=str))


def _checked_lm(
    inputs: TextRecommendInputs, model: nn.Module
) -> tuple[nn.Module, nn.Module, Architecture]:
    """(the causal LM, the module ranked in it, that module's architecture) of ``model`` (of
    ``inputs``), in eval mode, once the architecture accepts it for recommend.

    Raises:
        UnsupportedModel: for an image model, a model no architecture knows, a bare model
            without its LM head's weights, one its architecture refuses to rank, or a
            parameter its architecture cannot account for.
    """
    model = model.eval()
    check_text_model(model)
    refusal = architecture_for(model).refusal("recommend lm", model)  # before any wrapping
    if refusal is not None:
        raise UnsupportedModel(f"recommend --text {inputs.model}: {refusal}")
    lm = causal_lm(model).eval()
    ranked = ranked_module(lm)
    architecture = architecture_for(ranked)
    for stage in ("recommend", "recommend lm"):
        refusal = architecture.refusal(stage, ranked)
        if refusal is not None:
            raise UnsupportedModel(f"recommend --text {inputs.model}: {refusal}")
    ParameterMap(architecture, ranked)  # names a missing component before any compute
    return lm, ranked, architecture


def _sequences(
    inputs: TextRecommendInputs,
    settings: RecommendTextSettings,
    lm: nn.Module,
    ranked: nn.Module,
) -> tuple[str, np.ndarray, np.ndarray]:
    """(the tokenizer's name, the ``n_pairs`` reference sequences, the user's sequences: enough
    for the pairs and the gradient batches), each of ``sequence_length`` tokens.

    Raises:
        ValueError: for a sequence longer than the model's positions, a text file too short
            for one sequence, or a reference text too short for ``n_pairs`` sequences.
        FileNotFoundError: for a missing text file.
    """
    from vitplasticity.data.text import load_tokenizer

    length, n = settings.sequence_length, settings.n_pairs
    check_sequence_length(ranked.config, length, inputs.model)
    tokenizer = resolve_tokenizer(settings.tokenizer, inputs.model, inputs.model_spec)
    tokenize = load_tokenizer(tokenizer, lm.config.vocab_size)
    references = reference_sequences(inputs, tokenize, length, n)
    needed = max(n, settings.batches * settings.batch_size)
    return tokenizer, references, user_sequences(inputs.texts, tokenize, length, needed)


def _measure(
    inputs: TextRecommendInputs,
    settings: RecommendTextSettings,
    lm: nn.Module | StreamedModel,
    sequences: tuple[np.ndarray, np.ndarray],
    tokenizer: str,
    device: torch.device,
    labelled: LabelledRanking | None = None,
) -> tuple[Measurements, list[str]]:
    """Every criterion of ``lm`` (:func:`measure_text_criteria`): plasticity over the pairs
    (reference sequence i, user sequence i cycled; ``sequences``: reference, user), the
    gradient batches drawn from the user's sequences (or, ``labelled``, its documents after
    the new head's warm-up); and the warnings the criteria logged (why a weight statistic is
    n/a). A streamed ``lm`` gives what it measures block by block
    (:func:`.streamed.measure_streamed_criteria`): no gradient batch, no warm-up."""
    from vitplasticity.data.text import cycled
    from vitplasticity.recommend.gradients import head_warmup

    references, user = sequences
    n = settings.n_pairs
    pairs = (torch.from_numpy(references), torch.from_numpy(cycled(user, n)))
    counts = {"n_pairs": n, "batch_size": settings.batch_size, "protocol": inputs.protocol}
    if isinstance(lm, StreamedModel):
        measure = functools.partial(measure_streamed_criteria, lm, *pairs, **counts)
    else:
        log.info(
            "%s on %s: %d pairs (%s), %d user sequences of %d tokens (tokenizer %s), "
            "%d gradient batches of %d, %s on %s",
            inputs.model,
            inputs.dataset,
            n,
            inputs.protocol,
            len(user),
            settings.sequence_length,
            tokenizer,
            settings.batches,
            settings.batch_size,
            inputs.dtype,
            device,
        )
        task: dict[str, Any] = {}
        if labelled is None:
            gradient_batches = _gradient_batches(user, settings, device, settings.batches)
        else:
            size, seed, steps = settings.batch_size, settings.seed, inputs.warmup_steps
            warmup = labelled.batches(range(steps), size, seed, device)
            gradient_batches = labelled.batches(
                range(steps, steps + settings.batches), size, seed, device
            )
            task = {
                "loss": labelled.loss,
                "warm_up": lambda: head_warmup(
                    lm, warmup, inputs.warmup_lr, head=labelled.head(), loss=labelled.loss
                ),
                "nfn_inputs": _gradient_batches(user, settings, device, 1)[0],
            }
        measure = functools.partial(
            measure_text_criteria, lm, *pairs, gradient_batches, **counts, **task
        )
    with (
        _warnings("vitplasticity.recommend.criteria") as refused,
        ProgressReporter(n, f"plasticity {inputs.model}/{inputs.dataset}") as progress,
    ):
        measurements = measure(progress=progress)
    measurements.check_finite(f"recommend criteria of model {inputs.model!r} on {inputs.dataset}")
    return measurements, refused


def _gradient_batches(
    user: np.ndarray, settings: RecommendTextSettings, device: torch.device, count: int
) -> list[torch.Tensor]:
    """The first ``count`` batches of the user's sequences on ``device``: the batch of step s
    is :func:`vitplasticity.data.loader.batch_indices` (seeded epochs)."""
    from vitplasticity.data.loader import batch_indices

    batches = []
    for step in range(count):
        indices = batch_indices(step, settings.batch_size, len(user), settings.seed)
        batches.append(torch.from_numpy(user[indices]).to(device))
    return batches


@contextmanager
def _warnings(logger: str) -> Iterator[list[str]]:
    """The warnings ``logger`` emits inside the block (they still reach the log too): the
    weight statistic says there why it is n/a for a component, and the report quotes it."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logging.getLogger(logger).addHandler(handler)
    try:
        yield messages
    finally:
        logging.getLogger(logger).removeHandler(handler)
