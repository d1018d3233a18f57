"""What the ``recommend --text`` stage (:mod:`vitplasticity.recommend.text`) writes beside the
image recommend's outputs: the decision as data with where its names sit in the causal LM
(:func:`text_export`) and the report's text-specific notes (:func:`report_notes`); the files
are the image recommend's (:func:`vitplasticity.recommend.pipeline.write_outputs`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import polars as pl
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.recommend.criteria import Measurements
from vitplasticity.recommend.export import build_export
from vitplasticity.recommend.ranking import Recommendation, configuration_label
from vitplasticity.recommend.settings import RecommendTextSettings
from vitplasticity.recommend.streamed import streamed_note
from vitplasticity.recommend.text_criteria import NFN_NA, RankedLM
from vitplasticity.recommend.text_inputs import TextRecommendInputs

log = logging.getLogger(__name__)


def class_path(module: object) -> str:
    """``module``'s class as ``package.module.Class``."""
    return f"{type(module).__module__}.{type(module).__qualname__}"


def text_export(
    inputs: TextRecommendInputs,
    where: RankedLM,
    recommendation: Recommendation,
    measurements: Measurements,
) -> dict[str, Any]:
    """The decision as data (:func:`.export.build_export` of the ranked module, with its
    measured matrix statistics), with where its names sit in the causal LM (``where``) and
    the loss the gradients are of."""
    lm, ranked, prefix = where.lm, where.ranked, where.prefix
    export = build_export(
        ranked,
        recommendation.configuration,
        model_name=inputs.model,
        model_entry=inputs.model_spec,
        dataset=inputs.dataset,
        recommendation=asdict(recommendation),
        matrices=measurements.matrices,
    )
    if inputs.labelled_text is not None:
        export["text"] = {
            "sequence_classifier": class_path(lm),
            "prefix": prefix,
            "names": "the parameter and module names are the sequence classifier's",
            "loss": "classification cross-entropy of a new head (after its warm-up)",
        }
        return export
    export["text"] = {
        "causal_lm": class_path(lm),
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


def _parameters(model: nn.Module, name: str) -> int:
    """The parameters of ``model``'s module ``name``."""
    return sum(p.numel() for p in model.get_submodule(name).parameters())


def report_notes(
    inputs: TextRecommendInputs,
    settings: RecommendTextSettings,
    measurements: Measurements,
    where: RankedLM,
    n_user: int,
    refused: Sequence[str],
    streamed: str | None = None,
) -> list[str]:
    """The report's text-specific paragraphs: the data (``n_user`` user sequences), the loss,
    what "the classifier head and final norm" are here, and why a weight statistic is n/a
    (``refused``: the warnings that said so); of a ``streamed`` model (why it streamed), that
    no gradient criterion was measured (:func:`.streamed.streamed_note`)."""
    lm, ranked, prefix, head = where.lm, where.ranked, where.prefix, where.head
    files = ", ".join(f"`{Path(t).name}`" for t in inputs.texts)
    output = lm.get_output_embeddings()  # None for a sequence classifier
    tied = output is not None and output.weight is lm.get_input_embeddings().weight
    data = (
        f"User text: {files} ({n_user:,} sequences of {settings.sequence_length} tokens, taken "
        f"in turn from each file). Plasticity pairs reference sequence i with user sequence i "
        f"(cycled), {inputs.protocol} protocol."
    )
    loss = (
        f" The relative gradient norm and gradient SNR are of the next-token cross-entropy of "
        f"{type(lm).__name__} on {settings.batches} batches of {settings.batch_size} user "
        "sequences, NFN of the first batch. No head warm-up: the LM head is pretrained (the "
        "image recommend warms up a new classifier first)."
    )
    notes = [
        data + ("" if streamed is not None else loss),
        "Here the classifier head and final norm are "
        + ", ".join(f"`{n}` ({_parameters(lm, n):,} parameters)" for n in head)
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
        weight_reasons = [message for message in refused if not message.startswith(NFN_NA)]
        why = " ".join(weight_reasons) if weight_reasons else "the log says why"
        why += "" if why.endswith(".") else "."
        notes.append(
            f"Weight spectral is n/a for {', '.join(undefined)}, and so for every configuration "
            f"that contains one: {why}"
        )
    notes += [message for message in refused if message.startswith(NFN_NA)]
    if streamed is not None:
        notes.append(streamed_note(streamed))
    if prefix:
        notes.append(
            f"PREFIX.json names {type(ranked).__name__}'s parameters; in {type(lm).__name__} "
            f"they sit under `{prefix}`."
        )
    return notes
