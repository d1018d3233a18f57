"""``models:`` entries of tiny GPT2 text models, built through the front door
(``vitplasticity.models.build.build_model``) as the text stages build them."""

from __future__ import annotations

from typing import Any


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
