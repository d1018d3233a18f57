"""What the recommend of a model that takes token ids needs beside its criteria, for
unlabelled text (:mod:`.text`) and labelled text (:mod:`.labelled`) alike: the model's check,
its tokenizer and the reference sequences of the plasticity pairs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from torch import nn

from vitplasticity.models.architectures import UnsupportedModel, architecture_for
from vitplasticity.recommend.text_inputs import TextRecommendInputs


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


def resolve_tokenizer(requested: str, model_name: str, model_spec: dict[str, Any]) -> str:
    """``auto``: ``bytes`` for a random-init model, else its own tokenizer, as the
    text plasticity stage resolves it (:func:`vitplasticity.models.text.tokenizer_name`);
    anything else as given.

    Raises:
        ValueError: with ``auto``, for an entry that is not a transformers text model's.
    """
    from vitplasticity.models.text import text_model_spec, tokenizer_name

    if requested != "auto":
        return requested
    return tokenizer_name(requested, text_model_spec(model_name, model_spec))


# ---------------------------------------------------------------------------------------------
# The stage


def reference_sequences(
    inputs: TextRecommendInputs, tokenize: Callable[[str], list[int]], length: int, n: int
) -> np.ndarray:
    """The ``n`` reference sequences of ``length`` tokens (the pairs' first members).

    Raises:
        ValueError: for a reference text too short for ``n`` sequences, naming it.
    """
    from vitplasticity.data.text import read_sequences

    references = read_sequences(inputs.reference, tokenize, length, max_sequences=n)
    if len(references) < n:
        raise ValueError(
            f"--reference {inputs.reference}: {len(references)} sequences of {length} tokens, "
            f"fewer than --n-pairs {n}"
        )
    return references
