"""The spec of a transformers model entry (``family: transformers``).

An entry names a checkpoint (``hf_id`` at ``revision``), where its weights come from
(``weights``: "hub", a local folder holding a saved model or a hub snapshot, or "random") and
the class to build (``model_class``; by default the bare model of the checkpoint's
``model_type``, the vision tower for CLIP and SigLIP). :mod:`vitplasticity.models.hf_build`
builds it, :mod:`vitplasticity.models.hf_preprocessing` gives its preprocessing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vitplasticity.models.spec import ModelSpec

if TYPE_CHECKING:
    from torch import nn

    from vitplasticity.data.preprocessing import Preprocessing

FAMILY = "transformers"
"""The ``family`` of a transformers model's config entry."""

HF_MODEL_KEYS = frozenset(
    {
        "family",
        "hf_id",
        "revision",
        "weights",
        "config",
        "model_class",
        "init_seed",
        "normalize",
        "crop_pct",
    }
)
"""Keys of a transformers model's config entry (``family: transformers``)."""


@dataclass(frozen=True)
class HFModelSpec(ModelSpec):
    """One ``family: transformers`` entry of config.yaml's ``models``."""

    id_key = "hf_id"
    inputs = frozenset({"images", "tokens"})

    hf_id: str
    """The hub repo (e.g. ``facebook/dinov2-base``); with ``weights: random``, a name only."""
    family: str = FAMILY
    revision: str = "main"
    """Hub revision of ``weights: hub`` (branch, tag or commit)."""
    weights: str = "hub"
    """"hub", "random" (``init_seed``, no download) or a local folder (config.json and
    *.safetensors, maybe preprocessor_config.json)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Config overrides; with ``weights: random`` the whole config, ``model_type`` included."""
    model_class: str | None = None
    """A transformers class name; default: the bare model of the ``model_type``."""
    init_seed: int = 0
    """The seed a random-init model is drawn from (its only source of randomness)."""
    normalize: str | dict[str, list[float]] = "pretrained"
    """"pretrained" (the image processor's), "imagenet", or ``{mean: [...], std: [...]}``."""
    crop_pct: float | None = None
    """Overrides the image processor's eval crop fraction."""

    @property
    def model_id(self) -> str:
        """What names the model in messages: its hub id."""
        return self.hf_id

    @classmethod
    def parse(cls, entry: dict[str, Any]) -> HFModelSpec:
        """Build from a config mapping, checking it without touching the disk or the hub.

        Raises:
            ValueError: naming an unknown key, a missing ``hf_id``, a ``config`` that is not
                a mapping, or ``weights: random`` without ``config.model_type``.
        """
        unknown = set(entry) - HF_MODEL_KEYS
        if unknown:
            raise ValueError(
                f"unknown model keys {sorted(unknown)} (family: {FAMILY}); "
                f"known: {sorted(HF_MODEL_KEYS)}"
            )
        if not isinstance(entry.get("hf_id"), str) or not entry["hf_id"]:
            raise ValueError(f"model entry (family: {FAMILY}) lacks 'hf_id'")
        spec = cls(**entry)
        if not isinstance(spec.config, dict):
            raise ValueError(f"model {spec.hf_id!r}: config must be a mapping, got {spec.config!r}")
        if spec.weights == "random" and "model_type" not in spec.config:
            raise ValueError(
                f"model {spec.hf_id!r}: weights: random builds the model from its config alone: "
                "config needs model_type (e.g. dinov2) and the sizes"
            )
        return spec

    @property
    def source(self) -> str:
        """Where the weights come from, for messages: the folder, or hf_id at its revision."""
        if self.weights == "hub":
            return self.hf_id if self.revision == "main" else f"{self.hf_id}@{self.revision}"
        return self.weights

    def build(self, num_classes: int = 0) -> nn.Module:
        """The model (:func:`vitplasticity.models.hf_build.build_hf_model`)."""
        from vitplasticity.models.hf_build import build_hf_model

        return build_hf_model(self, num_classes)

    def preprocessing(self, model: nn.Module) -> Preprocessing:
        """From the checkpoint's image processor config
        (:func:`vitplasticity.models.hf_preprocessing.hf_preprocessing`)."""
        from vitplasticity.models.hf_preprocessing import hf_preprocessing

        return hf_preprocessing(model, self)

    @classmethod
    def declared_inputs(cls, entry: Mapping[str, Any]) -> str | None:
        """What the entry's ``config.model_type`` takes among the registered families' model
        types (:data:`vitplasticity.models.registry.TRANSFORMERS_MODEL_TYPES`)."""
        from vitplasticity.models.registry import TRANSFORMERS_MODEL_TYPES

        model_type = (entry.get("config") or {}).get("model_type")
        for inputs, model_types in TRANSFORMERS_MODEL_TYPES.items():
            if model_type in model_types:
                return inputs
        return None

    @classmethod
    def entry_problems(cls, name: str, entry: Mapping[str, Any]) -> list[str]:
        """A random init is built from its config alone: it needs ``config.model_type``."""
        if entry.get("weights") == "random" and not (entry.get("config") or {}).get("model_type"):
            return [
                f"models.{name}.config.model_type: missing (weights: random builds the model "
                "from its config alone, e.g. model_type: dinov2)"
            ]
        return []


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set now (huggingface_hub reads it
    once, at import)."""
    values = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any(str(v).upper() in {"1", "ON", "YES", "TRUE"} for v in values if v is not None)
