"""Building the transformers text model of a config entry (``family: gpt2``), strictly.

A saved model folder is loaded only when its ``config.json`` says ``model_type: gpt2`` and its
weights fill the ``GPT2Model`` exactly: transformers itself loads a Llama, Qwen2 or BERT folder
into a GPT2 with a warning and leaves every weight it cannot place at its random init, so a
random model would be measured. Here each of those is an error naming the folder.

``transformers`` is the optional extra ``vitplasticity[extras]``
(:func:`vitplasticity.optional.require_transformers`); it is imported only when a model is built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from vitplasticity.optional import require_transformers

GPT2_KEYS = frozenset({"family", "hf_id", "weights", "config", "tokenizer"})
"""Keys of a text model's config entry (``family: gpt2``)."""

MODEL_TYPE = "gpt2"
"""The ``model_type`` a checkpoint's config.json must have to be loaded as a ``GPT2Model``."""

SHOWN_KEYS = 5
"""How many missing or unexpected weight names an error quotes."""


def build_gpt2(entry: dict[str, Any]) -> nn.Module:
    """The ``GPT2Model`` of a config entry, in eval mode.

    Entry keys: ``family: gpt2``; ``hf_id`` (e.g. "gpt2", the 124M model); ``weights``:
    "hub" (``from_pretrained(hf_id)``), "random" (``GPT2Config(**config)``, no download) or a
    local folder holding a saved model; ``config``: GPT2Config overrides (a tiny model for
    tests); ``tokenizer``: "hub" (the hf_id's tokenizer) or a local folder (optional).

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
    transformers = require_transformers()
    overrides = dict(entry.get("config") or {})
    # Eager attention: the explicit causal mask of the hf_gpt2 architecture is the mask every
    # kernel gets.
    overrides.setdefault("attn_implementation", "eager")
    if weights == "random":
        model = transformers.GPT2Model(transformers.GPT2Config(**overrides))
    elif weights == "hub":
        source = entry.get("hf_id", "gpt2")
        config, _ = transformers.GPT2Config.get_config_dict(source)
        check_model_type(config.get("model_type"), source)
        model = load_strict(transformers, source, overrides)
    else:
        check_model_type(saved_model_type(Path(weights)), weights)
        model = load_strict(transformers, weights, overrides)
    return model.eval()


def saved_model_type(folder: Path) -> str | None:
    """The ``model_type`` in a saved model folder's ``config.json``.

    Raises:
        FileNotFoundError: naming the folder when it has no config.json.
        ValueError: naming the file when it is not a JSON object.
    """
    path = folder / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"text model folder {str(folder)!r} has no config.json: not a saved transformers "
            "model (save_pretrained writes one beside the weights)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a JSON file ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config.get("model_type")


def check_model_type(model_type: str | None, source: str) -> None:
    """Raise unless ``model_type`` (from ``source``'s config.json) is gpt2.

    Raises:
        ValueError: naming the source and both model types.
    """
    if model_type != MODEL_TYPE:
        raise ValueError(
            f"text model {str(source)!r}: its config.json has model_type {model_type!r}, not "
            f"{MODEL_TYPE!r}: only GPT2 checkpoints load into a GPT2Model (family: gpt2)"
        )


def load_strict(transformers: Any, source: str, overrides: dict[str, Any]) -> nn.Module:
    """``GPT2Model.from_pretrained(source)``, refusing a checkpoint that does not fill it.

    Raises:
        ValueError: naming ``source`` and the first few missing, unexpected or mismatched
            weights (transformers' own ignore list applied: the saved causal-mask buffers).
    """
    model, info = transformers.GPT2Model.from_pretrained(
        source, output_loading_info=True, **overrides
    )
    problems = []
    for kind in ("missing", "unexpected", "mismatched"):
        keys = sorted(str(key) for key in info.get(f"{kind}_keys") or ())
        if keys:
            shown = ", ".join(keys[:SHOWN_KEYS]) + (" ..." if len(keys) > SHOWN_KEYS else "")
            problems.append(f"{len(keys)} {kind} weight(s): {shown}")
    if problems:
        raise ValueError(
            f"text model {str(source)!r}: the checkpoint does not match GPT2Model: "
            f"{'; '.join(problems)}"
        )
    return model
