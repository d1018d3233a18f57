"""A text model ranked as a sequence classifier on labelled text (``recommend
--labelled-text``): the model inside its sequence-classification class with a new head drawn
from the seed, the labelled documents for the head's warm-up and the gradient batches, and the
sequences of the plasticity pairs (:func:`labelled_classifier`). :mod:`.text` runs the stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.models.architectures import ParameterMap, UnsupportedModel, architecture_for
from vitplasticity.models.build import build_model
from vitplasticity.models.text import check_sequence_length, text_model_entry
from vitplasticity.recommend.settings import RecommendTextSettings
from vitplasticity.recommend.text_inputs import TextRecommendInputs
from vitplasticity.recommend.tokens import check_text_model, reference_sequences, resolve_tokenizer


@dataclass(frozen=True)
class LabelledRanking:
    """A text model ranked as a sequence classifier on labelled text: the classifier with its
    new head (``drawn``), the pool's documents encoded for the gradient batches, and the
    sequences of the plasticity pairs (the documents cut as a text file's lines are)."""

    classifier: nn.Module
    drawn: list[str]
    classes: tuple[str, ...]
    ids: np.ndarray  # (N, L) the pool's documents, padded
    attention: np.ndarray  # (N, L)
    labels: np.ndarray  # (N,)
    tokenizer: str
    references: np.ndarray
    user: np.ndarray

    def batches(self, steps: range, batch_size: int, seed: int, device: torch.device) -> list[Any]:
        """The labelled batches (ids, attention, labels) of ``steps`` on ``device``: step s's
        is :func:`vitplasticity.data.loader.batch_indices` (seeded epochs), as an image's."""
        from vitplasticity.data.loader import batch_indices

        found = []
        for step in steps:
            index = batch_indices(step, batch_size, len(self.labels), seed)
            parts = (self.ids[index], self.attention[index], self.labels[index])
            found.append(tuple(torch.from_numpy(part).to(device) for part in parts))
        return found

    def loss(self, batch: Any) -> torch.Tensor:
        """The mean cross-entropy of the classifier's logits on a labelled batch."""
        ids, attention, labels = batch
        logits = self.classifier(input_ids=ids, attention_mask=attention).logits
        return F.cross_entropy(logits, labels)

    def head(self) -> list[nn.Parameter]:
        """The new head's parameters (what the warm-up trains)."""
        drawn = set(self.drawn)
        return [p for n, p in self.classifier.named_parameters() if n in drawn]

    def note(
        self,
        inputs: TextRecommendInputs,
        settings: RecommendTextSettings,
        n_user: int,
        gradients: bool = True,
    ) -> str:
        """The report's paragraph on the data and the loss (``gradients``: whether the
        gradient criteria were measured; a streamed model's were not)."""
        name = Path(str(inputs.labelled_text)).name
        data = (
            f"User data: `{name}`, {len(self.labels):,} labelled documents of "
            f"{len(self.classes)} classes ({', '.join(self.classes)}), each its first "
            f"{settings.sequence_length} tokens. Plasticity pairs reference sequence i with "
            f"user sequence i (cycled; the {n_user:,} user sequences are the documents cut as "
            f"a text file's lines are), {inputs.protocol} protocol."
        )
        if not gradients:
            return data
        return (
            f"{data} {type(self.classifier).__name__} holds the model with a new head "
            f"({', '.join(f'`{n}`' for n in self.drawn)}, drawn from --seed), warmed up alone "
            f"for {inputs.warmup_steps} SGD steps (lr {inputs.warmup_lr}) as the image "
            f"recommend warms up its new classifier; the relative gradient norm and gradient "
            f"SNR are then of its classification cross-entropy on {settings.batches} batches "
            f"of {settings.batch_size} documents, NFN of the first batch of user sequences."
        )


def labelled_classifier(
    inputs: TextRecommendInputs, settings: RecommendTextSettings, model: nn.Module | None
) -> LabelledRanking:
    """The model of ``inputs`` (or ``model``) inside its sequence-classification class with a
    new head drawn from ``settings.seed``, and the labelled documents and sequences.

    Raises:
        ValueError: for a bad labelled dataset, a sequence longer than the model's positions,
            or a reference text too short for ``n_pairs`` sequences.
        UnsupportedModel: for an image model, a model no architecture knows, one without a
            sequence-classification class, one its architecture refuses to rank, or a
            parameter it cannot account for.
    """
    from vitplasticity.data.labelled import encode_texts, read_labelled
    from vitplasticity.data.text import cut_documents, load_tokenizer
    from vitplasticity.models.text import sequence_classifier

    dataset = read_labelled(str(inputs.labelled_text))
    torch.manual_seed(settings.seed)
    if model is None:
        model = build_model(text_model_entry(inputs.model, inputs.model_spec))
    check_text_model(model.eval())
    length, n = settings.sequence_length, settings.n_pairs
    check_sequence_length(model.config, length, inputs.model)
    tokenizer = resolve_tokenizer(settings.tokenizer, inputs.model, inputs.model_spec)
    vocab = model.config.vocab_size
    encoded, pad_id = encode_texts(dataset.pool.texts, tokenizer, vocab, length)
    classifier, drawn = sequence_classifier(model, len(dataset.classes), pad_id)
    classifier = classifier.eval()
    architecture = architecture_for(classifier)
    refusal = architecture.refusal("recommend", classifier)
    if refusal is not None:
        raise UnsupportedModel(f"recommend --labelled-text {inputs.model}: {refusal}")
    ParameterMap(architecture, classifier)  # names a missing component before any compute
    tokenize = load_tokenizer(tokenizer, vocab)
    references = reference_sequences(inputs, tokenize, length, n)
    where = f"--labelled-text {inputs.labelled_text}"
    user = cut_documents(dataset.pool.texts, tokenize, length, n, where)
    return LabelledRanking(
        classifier, drawn, dataset.classes, encoded.ids, encoded.attention,
        dataset.pool.labels, tokenizer, references, user,
    )  # fmt: skip
