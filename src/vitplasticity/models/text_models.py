"""Building the transformers text model of a config entry (``family: gpt2``), strictly.

The GPT2 entry of the text-plasticity stage, built by :mod:`vitplasticity.models.hf` (which
builds every transformers model): a saved model folder is loaded only when its ``config.json``
says ``model_type: gpt2`` and its weights fill the ``GPT2Model`` exactly (transformers itself
loads a Llama, Qwen2 or BERT folder into a GPT2 with a warning and leaves every weight it cannot
place at its random init, so a random model would be measured).

``transformers`` is the optional extra ``vitplasticity[extras]``
(:func:`vitplasticity.utils.optional.require_transformers`); it is imported only when a model is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from vitplasticity.models.hf import HFModelSpec, build_hf_model, random_model
from vitplasticity.utils.optional import require_transformers

GPT2_KEYS = frozenset({"family", "hf_id", "weights", "config", "tokenizer"})
"""Keys of a text model's config entry (``family: gpt2``)."""

MODEL_TYPE = "gpt2"
"""The ``model_type`` a checkpoint's config.json must have to be loaded as a ``GPT2Model``."""


def build_gpt2(entry: dict[str, Any]) -> nn.Module:
    """The ``GPT2Model`` of a config entry, in eval mode.

    Entry keys: ``family: gpt2``; ``hf_id`` (e.g. "gpt2", the 124M model); ``weights``:
    "hub" (``from_pretrained(hf_id)``), "random" (``GPT2Config(**config)``, drawn from the
    caller's RNG, no download) or a local folder holding a saved model; ``config``: GPT2Config
    overrides (a tiny model for tests); ``tokenizer``: "hub" (the hf_id's tokenizer) or a local
    folder (optional). A checkpoint is loaded by :func:`vitplasticity.models.hf.build_hf_model`.

    Raises:
        ImportError: naming the optional extra when transformers is missing.
        ValueError: for an unknown key, a checkpoint whose model type is not gpt2 (naming both
            types), or one with missing or unexpected weights (naming the first few).
        FileNotFoundError: for weights that are neither "hub", "random" nor a folder, or a
            folder without config.json.
    """
    unknown = set(entry) - GPT2_KEYS
    if unknown:
        raise ValueError(f"unknown text-model keys {sorted(unknown)}; known: {sorted(GPT2_KEYS)}")
    weights = entry.get("weights", "hub")
    if weights not in ("hub", "random") and not Path(weights).is_dir():
        raise FileNotFoundError(
            f"text model weights {weights!r}: not 'hub', 'random' nor a saved model folder"
        )
    config = dict(entry.get("config") or {})
    spec = HFModelSpec(
        hf_id=entry.get("hf_id", "gpt2"),
        weights=weights,
        config=config if weights != "random" else {"model_type": MODEL_TYPE, **config},
        model_class="GPT2Model",
    )
    if weights != "random":
        return build_hf_model(spec)
    # The caller seeds the RNG (text_plasticity: the model's init_seed), not spec.init_seed.
    overrides = {"attn_implementation": "eager", **spec.config}
    return random_model(require_transformers(), spec, overrides).eval()
