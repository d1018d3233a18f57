"""recommend's settings that are null (their schema default) fall back on the measuring
stage's: the image recommend on ``plasticity.<key>``, the text recommend on
``text_plasticity.n_pairs``."""

from __future__ import annotations

from typing import Any


def recommend_value(config: dict[str, Any], key: str) -> Any:
    """``recommend.<key>``, or ``plasticity.<key>`` where it is null."""
    value = config["recommend"][key]
    return config["plasticity"][key] if value is None else value


def recommend_text_n_pairs(config: dict[str, Any]) -> int:
    """``recommend.n_pairs``, or ``text_plasticity.n_pairs`` where it is null."""
    value = config["recommend"]["n_pairs"]
    return config["text_plasticity"]["n_pairs"] if value is None else value
