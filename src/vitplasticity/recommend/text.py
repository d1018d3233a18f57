"""The ``recommend`` stage for a text model: which components of a causal language model to
finetune on the user's text, ranked by the image recommend's criteria.

The text counterpart of :mod:`.pipeline`. The user's text files and a reference text are cut
into sequences as :mod:`vitplasticity.plasticity.text` cuts them
(:func:`vitplasticity.data.text.read_sequences`), and every criterion of :mod:`.criteria` is
measured once per component and pooled per configuration:

- plasticity: reference sequence i against user sequence i (cycled), the embedding protocol by
  default (docs/protocol.md), exactly as the ``text-plasticity`` stage measures it;
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
its head's weights and is refused (name the causal-LM class instead). Components are ranked on
the module the architecture registry knows: the causal LM itself (the hf_llama and hf_gemma
families), or its base model (``GPT2Model``, the hf_gpt2 family); the export names that
module's parameters and says where they sit in the causal LM.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import (
    Architecture,
    ParameterMap,
    UnsupportedModel,
    architecture_for,
    parameter_map,
)
from vitplasticity.models.build import build_model
from vitplasticity.models.text import causal_lm, text_model_entry
from vitplasticity.plasticity.protocols import PROTOCOLS
from vitplasticity.plasticity.text import max_positions
from vitplasticity.recommend.criteria import (
    Measurements,
    always_trained_parameters,
    gradient_statistics,
    weight_statistics,
)
from vitplasticity.recommend.export import build_export
from vitplasticity.recommend.nfn import feature_norm_statistics
from vitplasticity.recommend.pipeline import check_ranking, footer_record, rank
from vitplasticity.recommend.ranking import (
    Recommendation,
    configuration_label,
    markdown,
)
from vitplasticity.settings.stages import DTYPES, RecommendTextSettings
from vitplasticity.utils.io import atomic_path, write_json, write_parquet
from vitplasticity.utils.progress import ProgressReporter

log = logging.getLogger(__name__)


_DECLARED = RecommendTextSettings()


@dataclass(frozen=True)
class TextRecommendSettings:
    """The settings of one text recommendation; each field is the CLI flag of that name
    (``texts``: ``--text``). The defaults are the declared ones
    (:class:`vitplasticity.settings.stages.RecommendTextSettings`); ``budget`` here is parsed
    into a number of parameters."""

    model: str
    dataset: str
    model_spec: dict[str, Any]
    reference: str
    texts: tuple[str, ...]
    tokenizer: str = _DECLARED.tokenizer
    sequence_length: int = _DECLARED.sequence_length
    n_pairs: int = _DECLARED.n_pairs
    batch_size: int = _DECLARED.batch_size
    batches: int = _DECLARED.batches
    protocol: str = "embedding"
    budget: int | None = None
    criterion: str = _DECLARED.criterion
    combine: bool = _DECLARED.combine
    configurations: tuple[str, ...] = _DECLARED.configurations
    seed: int = _DECLARED.seed
    device: str = _DECLARED.device
    dtype: str = "float32"
    demo: bool = _DECLARED.demo

    def validate(self) -> None:
        """Check every value and file before any compute.

        Raises:
            ValueError: naming the CLI flag of the first bad value.
            FileNotFoundError: naming a text file that does not exist.
        """
        for flag, path in (("--reference", self.reference), *(("--text", t) for t in self.texts)):
            if not Path(path).is_file():
                raise FileNotFoundError(f"{flag}: text file not found: {path}")
        if not self.texts:
            raise ValueError("--text: no text file given")
        check_ranking(self.configurations, self.criterion, self.budget, self.combine)
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol: {self.protocol!r} not one of {', '.join(PROTOCOLS)}")
        for flag, value, least in (
            # Two tokens at least: the next-token loss predicts token t from the tokens before.
            ("--sequence-length", self.sequence_length, 2),
            ("--n-pairs", self.n_pairs, 1),
            ("--batch-size", self.batch_size, 1),
            ("--batches", self.batches, 2),
            ("--seed", self.seed, 0),
        ):
            if value < least:
                raise ValueError(f"{flag} must be >= {least}, got {value}")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype: {self.dtype!r} not float32 or float64")


@dataclass(frozen=True)
class TextResult:
    """A text recommendation and what it was made from."""

    settings: TextRecommendSettings
    table: pl.DataFrame
    recommendation: Recommendation
    measurements: Measurements
    reference_label: str
    notes: list[str]
    """What the report says below the table beyond the image recommend's text."""
    record: dict[str, Any]
    """The resolved settings and provenance, for the Parquet footer."""
    export: dict[str, Any]
    """The decision as data (:mod:`.export`), with where its names sit in the causal LM."""


# ---------------------------------------------------------------------------------------------
# The model: a causal LM, and the module the registry ranks


def check_text_model(model: nn.Module) -> None:
    """Raise unless ``model`` is of an architecture family that takes token ids.

    Raises:
        UnsupportedModel: naming the class, for a model no architecture knows (or one the
            registry refuses), or one of an image family.
    """
    architecture = architecture_for(model)
    if architecture.inputs != "tokens":
        raise UnsupportedModel(
            f"{type(model).__name__} ({architecture.title}) takes images: the text recommend "
            "ranks a causal language model on token sequences; rank an image model with "
            "`vitplasticity recommend`"
        )


def ranked_module(lm: nn.Module) -> nn.Module:
    """The module whose components are ranked: ``lm`` when an architecture knows it (hf_llama
    and hf_gemma take ``XForCausalLM``), else its base model (``GPT2LMHeadModel.transformer``).

    Raises:
        UnsupportedModel: naming the class, when no architecture knows either.
    """
    try:
        architecture_for(lm)
    except UnsupportedModel:
        base = getattr(lm, "base_model", None)
        if base is None or base is lm:
            raise
        architecture_for(base)
        return base
    return lm


def prefix_in(lm: nn.Module, module: nn.Module) -> str:
    """The dotted prefix of ``module``'s names inside ``lm`` ("" when it is ``lm``)."""
    for name, candidate in lm.named_modules():
        if candidate is module:
            return f"{name}." if name else ""
    raise ValueError(f"{type(module).__name__} is not inside {type(lm).__name__}")


def next_token_loss(lm: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The loss of a batch of token ids (B, L): the mean cross-entropy of ``lm``'s logits at
    positions 0..L-2 against the tokens at 1..L-1, over the B (L - 1) predicted tokens, in the
    logits' dtype (transformers' own ``labels=`` loss upcasts float64 logits to float32)."""

    def loss(ids: torch.Tensor) -> torch.Tensor:
        logits = lm(input_ids=ids, use_cache=False).logits  # (B, L, V)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())

    return loss


# ---------------------------------------------------------------------------------------------
# The text


def user_sequences(
    paths: Sequence[str | os.PathLike[str]],
    tokenize: Callable[[str], list[int]],
    sequence_length: int,
    max_sequences: int,
) -> np.ndarray:
    """The user's sequences (N, sequence_length): each file cut as
    :func:`~vitplasticity.data.text.read_sequences` cuts it (at most ``max_sequences`` read per
    file), then taken in turn from each file (first of every file, then second...; a file that
    runs out drops out), at most ``max_sequences`` in all. So the first pairs and batches draw
    on every file, not on the first one alone.

    Raises:
        ValueError: naming a file that holds fewer tokens than one sequence.
        FileNotFoundError: naming a file that does not exist.
    """
    from vitplasticity.data.text import read_sequences

    per_file = [read_sequences(p, tokenize, sequence_length, max_sequences) for p in paths]
    # (row, file) pairs sorted: row 0 of every file in file order, then row 1...
    order = sorted((row, file) for file, rows in enumerate(per_file) for row in range(len(rows)))
    return np.stack([per_file[file][row] for row, file in order[:max_sequences]])


def resolve_tokenizer(requested: str, model_name: str, model_spec: dict[str, Any]) -> str:
    """``auto``: ``bytes`` for a random-init model, else its own tokenizer, as the
    text-plasticity stage resolves it (:func:`vitplasticity.plasticity.text.tokenizer_name`);
    anything else as given.

    Raises:
        ValueError: with ``auto``, for an entry that is not a transformers text model's.
    """
    from vitplasticity.models.text import text_model_spec
    from vitplasticity.plasticity.text import tokenizer_name

    if requested != "auto":
        return requested
    return tokenizer_name(requested, text_model_spec(model_name, model_spec))


# ---------------------------------------------------------------------------------------------
# The criteria


def measure_text_criteria(
    lm: nn.Module,
    reference: torch.Tensor,
    downstream: torch.Tensor,
    gradient_batches: Sequence[torch.Tensor],
    *,
    n_pairs: int,
    batch_size: int = 64,
    protocol: str = "embedding",
    progress: Callable[[int], None] | None = None,
) -> Measurements:
    """Measure every criterion of the five components of a causal LM, on token ids.

    The text counterpart of :func:`.criteria.measure_criteria`, on the module
    :func:`ranked_module` finds in ``lm``: the weight statistic, the plasticity, the NFN of the
    first gradient batch, then the relative gradient norm and gradient SNR of the next-token
    loss (:func:`next_token_loss`) over the gradient batches. No head warm-up: the LM head is
    pretrained, and nothing is trained.

    Args:
        lm: a causal LM (:func:`causal_lm`) in eval mode, on the batches' device.
        reference: reference token ids (N, L); ``downstream`` likewise (pair i: reference i,
            downstream i, cycled).
        gradient_batches: token-id batches (B, L) of the user's text (>= 2).
        n_pairs: plasticity pairs.
        batch_size: plasticity pairs per forward pass.
        protocol: the plasticity protocol (embedding: the paper's).
        progress: called with the plasticity pairs done.

    Raises:
        ValueError: for fewer than 2 gradient batches.
        UnsupportedModel: for a model no architecture knows or cannot account for exactly.
    """
    from vitplasticity.plasticity.measure import measure

    if len(gradient_batches) < 2:
        raise ValueError(f"gradient criteria need at least 2 batches, got {len(gradient_batches)}")
    ranked = ranked_module(lm)
    parameters = parameter_map(ranked)
    weights = weight_statistics(ranked)
    pairs = measure(
        ranked,
        reference,
        downstream,
        protocol=protocol,
        batch_size=batch_size,
        n_pairs=n_pairs,
        progress=progress,
    )
    features = feature_norm_statistics(ranked, gradient_batches[0])
    names = {c: parameters.component_names(c) for c in COMPONENTS}
    tensors = gradient_statistics(
        ranked,
        gradient_batches,
        [name for c in COMPONENTS for name in names[c]],
        loss=next_token_loss(lm),
    )
    sizes = dict(ranked.named_parameters())
    return Measurements(
        pairs=pairs,
        tensors=tensors,
        weights=weights,
        component_parameters={c: sum(sizes[name].numel() for name in names[c]) for c in names},
        always_trained=always_trained_parameters(ranked, parameters),
        features=features,
    )


# ---------------------------------------------------------------------------------------------
# The stage


def recommend_text(settings: TextRecommendSettings, model: nn.Module | None = None) -> TextResult:
    """Measure, rank and choose for the text model of ``settings`` on its text files.

    Args:
        settings: what to rank and on which files.
        model: the model, already built (its entry ``settings.model_spec`` is then only
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

    settings.validate()
    lm, ranked, architecture = _checked_lm(settings, model)
    tokenizer, references, user = _sequences(settings, lm, ranked)
    device = pick_device(settings.device)
    lm = lm.to(device=device, dtype=getattr(torch, settings.dtype))
    measurements, refused = _measure(settings, lm, tokenizer, references, user, device)
    table, recommendation, configurations = rank(settings, measurements)
    prefix = prefix_in(lm, ranked)
    resolved = {
        **asdict(settings),
        "texts": list(settings.texts),
        "configurations": configurations,
        "tokenizer": tokenizer,
        "user_sequences": len(user),
        "causal_lm": _class_path(lm),
        "loss": "next-token cross-entropy",
    }
    reference_label = (
        f"`{Path(settings.reference).name}` ({settings.n_pairs:,} sequences of "
        f"{settings.sequence_length} tokens, tokenizer {tokenizer})"
    )
    record = footer_record(
        settings, resolved, device, reference_label, recommendation, measurements
    )
    export = _export(settings, lm, ranked, prefix, recommendation)
    head = [prefix + name for name in _module_names(ranked, architecture.head(ranked).modules)]
    notes = _notes(settings, measurements, len(user), lm, ranked, prefix, head, refused)
    return TextResult(
        settings, table, recommendation, measurements, reference_label, notes, record, export
    )


def _checked_lm(
    settings: TextRecommendSettings, model: nn.Module | None
) -> tuple[nn.Module, nn.Module, Architecture]:
    """(the causal LM, the module ranked in it, that module's architecture) of ``model``, or of
    the model built from ``settings`` when None, in eval mode, once the architecture accepts it
    for recommend.

    Raises:
        UnsupportedModel: for an image model, a model no architecture knows, a bare model
            without its LM head's weights, one its architecture refuses to rank, or a
            parameter its architecture cannot account for.
    """
    if model is None:
        model = build_model(text_model_entry(settings.model, settings.model_spec))
    model = model.eval()
    check_text_model(model)
    lm = causal_lm(model).eval()
    ranked = ranked_module(lm)
    architecture = architecture_for(ranked)
    refusal = architecture.refusal("recommend", ranked)
    if refusal is not None:
        raise UnsupportedModel(f"recommend-text {settings.model}: {refusal}")
    ParameterMap(architecture, ranked)  # names a missing component before any compute
    return lm, ranked, architecture


def _sequences(
    settings: TextRecommendSettings, lm: nn.Module, ranked: nn.Module
) -> tuple[str, np.ndarray, np.ndarray]:
    """(the tokenizer's name, the ``n_pairs`` reference sequences, the user's sequences: enough
    for the pairs and the gradient batches), each of ``sequence_length`` tokens.

    Raises:
        ValueError: for a sequence longer than the model's positions, a text file too short
            for one sequence, or a reference text too short for ``n_pairs`` sequences.
        FileNotFoundError: for a missing text file.
    """
    from vitplasticity.data.text import load_tokenizer, read_sequences

    length, n = settings.sequence_length, settings.n_pairs
    limit = max_positions(ranked.config)
    if limit is not None and length > limit:
        raise ValueError(
            f"--sequence-length {length} exceeds the {limit} positions of model {settings.model!r}"
        )
    tokenizer = resolve_tokenizer(settings.tokenizer, settings.model, settings.model_spec)
    tokenize = load_tokenizer(tokenizer, lm.config.vocab_size)
    references = read_sequences(settings.reference, tokenize, length, max_sequences=n)
    if len(references) < n:
        raise ValueError(
            f"--reference {settings.reference}: {len(references)} sequences of {length} tokens, "
            f"fewer than --n-pairs {n}"
        )
    needed = max(n, settings.batches * settings.batch_size)
    return tokenizer, references, user_sequences(settings.texts, tokenize, length, needed)


def _measure(
    settings: TextRecommendSettings,
    lm: nn.Module,
    tokenizer: str,
    references: np.ndarray,
    user: np.ndarray,
    device: torch.device,
) -> tuple[Measurements, list[str]]:
    """Every criterion of ``lm`` (:func:`measure_text_criteria`): plasticity over the pairs
    (reference sequence i, user sequence i cycled), the gradient batches drawn from the user's
    sequences; and the warnings the criteria logged (why a weight statistic is n/a)."""
    from vitplasticity.data.loader import batch_indices
    from vitplasticity.data.text import cycled

    n = settings.n_pairs
    log.info(
        "%s on %s: %d pairs (%s), %d user sequences of %d tokens (tokenizer %s), "
        "%d gradient batches of %d, %s on %s",
        settings.model,
        settings.dataset,
        n,
        settings.protocol,
        len(user),
        settings.sequence_length,
        tokenizer,
        settings.batches,
        settings.batch_size,
        settings.dtype,
        device,
    )

    def batches() -> Iterator[torch.Tensor]:
        for step in range(settings.batches):
            indices = batch_indices(step, settings.batch_size, len(user), settings.seed)
            yield torch.from_numpy(user[indices]).to(device)

    with (
        _warnings("vitplasticity.recommend.criteria") as refused,
        ProgressReporter(n, f"plasticity {settings.model}/{settings.dataset}") as progress,
    ):
        measurements = measure_text_criteria(
            lm,
            torch.from_numpy(references),
            torch.from_numpy(cycled(user, n)),
            list(batches()),
            n_pairs=n,
            batch_size=settings.batch_size,
            protocol=settings.protocol,
            progress=progress,
        )
    return measurements, refused


def _class_path(module: nn.Module) -> str:
    """``module``'s class as ``package.module.Class``."""
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _export(
    settings: TextRecommendSettings,
    lm: nn.Module,
    ranked: nn.Module,
    prefix: str,
    recommendation: Recommendation,
) -> dict[str, Any]:
    """The decision as data (:func:`.export.build_export` of ``ranked``), with where its names
    sit in the causal LM ``lm`` (under ``prefix``) and the loss the gradients are of."""
    export = build_export(
        ranked,
        recommendation.configuration,
        model_name=settings.model,
        model_entry=settings.model_spec,
        dataset=settings.dataset,
        recommendation=asdict(recommendation),
    )
    export["text"] = {
        "causal_lm": _class_path(lm),
        "prefix": prefix,
        "names": (
            "the parameter and module names are the causal LM's"
            if not prefix
            else f"the parameter and module names are {type(ranked).__name__}'s; in the causal "
            f"LM they sit under {prefix!r}"
        ),
        "loss": "next-token cross-entropy (token t from the tokens before it)",
    }
    return export


def _module_names(model: nn.Module, modules: Sequence[nn.Module]) -> list[str]:
    """The names of ``modules`` in ``model``, in ``named_modules`` order."""
    wanted = {id(module) for module in modules}
    return [name for name, module in model.named_modules() if id(module) in wanted]


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


def _notes(
    settings: TextRecommendSettings,
    measurements: Measurements,
    n_user: int,
    lm: nn.Module,
    ranked: nn.Module,
    prefix: str,
    head: Sequence[str],
    refused: Sequence[str],
) -> list[str]:
    """The report's text-specific paragraphs: the data, the loss, what "the classifier head and
    final norm" are here, and why a weight statistic is n/a."""
    files = ", ".join(f"`{Path(t).name}`" for t in settings.texts)
    tied = lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    notes = [
        f"User text: {files} ({n_user:,} sequences of {settings.sequence_length} tokens, taken "
        f"in turn from each file). Plasticity pairs reference sequence i with user sequence i "
        f"(cycled), {settings.protocol} protocol. The relative gradient norm and gradient SNR "
        f"are of the next-token cross-entropy of {type(lm).__name__} on {settings.batches} "
        f"batches of {settings.batch_size} user sequences, NFN of the first batch. No head "
        "warm-up: the LM head is pretrained (the image recommend warms up a new classifier "
        "first).",
        f"Here the classifier head and final norm are {', '.join(f'`{n}`' for n in head)}"
        + (
            "; the LM head is tied to the token embedding, which only the emb and full "
            "configurations train."
            if tied
            else "."
        ),
    ]
    undefined = [
        configuration_label(component)
        for component in COMPONENTS
        if measurements.weights.filter(pl.col("component") == component)["weight_spectral"]
        .is_nan()
        .all()
    ]
    if undefined:
        why = " ".join(refused) if refused else "the log says why"
        why += "" if why.endswith(".") else "."
        notes.append(
            f"Weight spectral is n/a for {', '.join(undefined)}, and so for every configuration "
            f"that contains one: {why}"
        )
    if prefix:
        notes.append(
            f"PREFIX.json names {type(ranked).__name__}'s parameters; in {type(lm).__name__} "
            f"they sit under `{prefix}`."
        )
    return notes


def write_text_outputs(result: TextResult, prefix: str | os.PathLike[str]) -> None:
    """Write ``prefix``.md (report), .json (the decision with its parameter names and PEFT
    configs) and .parquet (table, with the record in its footer), each atomically."""
    from vitplasticity.report.style import DEMO_NOTE

    settings = result.settings
    text = markdown(
        result.table,
        result.recommendation,
        model=settings.model,
        dataset=settings.dataset,
        reference=result.reference_label,
        always_trained=result.measurements.always_trained,
        demo=settings.demo,
        demo_note=DEMO_NOTE,
    )
    text = text.rstrip("\n") + "\n\n" + "\n\n".join(result.notes) + "\n"
    with atomic_path(f"{prefix}.md") as tmp:
        tmp.write_text(text)
    write_json(f"{prefix}.json", result.export)
    write_parquet(f"{prefix}.parquet", result.table, result.record)
    log.info("wrote %s.{md,json,parquet}: %s", prefix, result.recommendation)
