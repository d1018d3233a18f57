"""The recommend rules' params. recommend's settings that are null (their schema default)
fall back on the measuring stage's: the image recommend on ``plasticity.<key>``, the text
recommend on ``text_plasticity.n_pairs``."""

from __future__ import annotations

from typing import Any

from vitplasticity.workflow.datasets import text_reference_sequences
from vitplasticity.workflow.params import stage_params


def recommend_value(config: dict[str, Any], key: str) -> Any:
    """``recommend.<key>``, or ``plasticity.<key>`` where it is null."""
    value = config["recommend"][key]
    return config["plasticity"][key] if value is None else value


def recommend_text_n_pairs(config: dict[str, Any]) -> int:
    """``recommend.n_pairs``, or ``text_plasticity.n_pairs`` where it is null."""
    value = config["recommend"]["n_pairs"]
    return config["text_plasticity"]["n_pairs"] if value is None else value


def recommend_params(config: dict[str, Any], settings: type) -> dict[str, Any]:
    """The recommend rule's params: one entry per setting of ``settings`` (the image
    recommend's class) in the recommend block, the demo switch, and the resolved pairs."""
    return {
        **stage_params(config, settings, "recommend"),
        "n_pairs": recommend_value(config, "n_pairs"),
    }


def recommend_text_params(config: dict[str, Any], settings: type) -> dict[str, Any]:
    """The recommend_text rule's params: how text is cut into sequences (text plasticity's
    reference dataset's tokenizer and sequence length), then the settings of ``settings`` (the
    text recommend's class) that the recommend block holds, the demo switch, and the resolved
    pairs."""
    return {
        **text_reference_sequences(config),
        **stage_params(config, settings, "recommend"),
        "n_pairs": recommend_text_n_pairs(config),
    }
