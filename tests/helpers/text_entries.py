"""``models:`` entries of tiny GPT2 and BERT text models, built through the front door
(``vitplasticity.models.build.build_model``) as the text stages build them, and ``datasets:``
entries of text files and of labelled text."""

from __future__ import annotations

from typing import Any

from tests.helpers.tiny_models import ENCODER_TINY_CONFIG, GPT2_TINY_CONFIG


def gpt2_entry(weights: str = "hub", hf_id: str = "gpt2", config: dict | None = None) -> dict:
    """A ``family: transformers`` entry whose model is a ``GPT2Model``: ``weights`` "hub",
    "random" (``config`` the GPT2Config's sizes) or a saved folder."""
    settings: dict[str, Any] = dict(config or {})
    if weights == "random":
        settings = {"model_type": "gpt2", **settings}
    return {
        "family": "transformers",
        "hf_id": hf_id,
        "weights": weights,
        "config": settings,
        "model_class": "GPT2Model",
    }


# The tiny language models text finetuning trains (a causal LM and a masked LM), and the
# tokens per sequence their runs use (the tiny configs have 16 positions).
GPT2 = {
    "family": "transformers",
    "hf_id": "tiny-gpt2",
    "weights": "random",
    "config": {"model_type": "gpt2", **GPT2_TINY_CONFIG},
}
BERT_MLM = {
    "family": "transformers",
    "hf_id": "tiny-bert",
    "weights": "random",
    "model_class": "BertForMaskedLM",
    "config": {"model_type": "bert", **ENCODER_TINY_CONFIG},
}
# A bare BERT: a classification run builds its sequence-classification class around it, the
# head (and pooler) drawn from the run seed.
BERT = {
    "family": "transformers",
    "hf_id": "tiny-bert",
    "weights": "random",
    "model_class": "BertModel",
    "config": {"model_type": "bert", **ENCODER_TINY_CONFIG},
}
LENGTH = 12  # tokens per sequence (the tiny configs have 16 positions)


def text_dataset(path: object, **keys: Any) -> dict:
    """A ``datasets:`` entry of a text dataset (``source: text_file``) reading ``path``, with
    ``keys`` (tokenizer, sequence_length, steps, val_every) over short-run defaults."""
    return {"source": "text_file", "path": str(path), "steps": 10, "val_every": 5, **keys}


def labelled_dataset(path: object, **keys: Any) -> dict:
    """A ``datasets:`` entry of labelled text (``source: labelled_text``) reading ``path``, with
    ``keys`` (tokenizer, sequence_length, steps, val_every) over short-run defaults."""
    return {"source": "labelled_text", "path": str(path), "steps": 10, "val_every": 5, **keys}
