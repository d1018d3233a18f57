"""The spec of a timm model entry (``family: timm``, or no family).

A timm model entry (config.yaml ``models.<name>``) has ``timm_id``, ``weights`` ("hub",
"random", or a path to a local .safetensors / .pth / .bin file), ``normalize`` ("pretrained":
the checkpoint's pretrained_cfg; "imagenet": ImageNet mean/std as the reference code did; or an
explicit ``{mean: [...], std: [...]}``), and ``kwargs`` passed on to ``timm.create_model`` (a
tiny architecture for tests and the demo). ``crop_pct`` overrides the checkpoint's eval crop
fraction: 1.0 is the reference code's Resize(224) + CenterCrop(224). ``init_seed`` fixes a
random-init backbone. ``revision`` (default "main") is the hub revision of ``weights: hub``
(branch, tag or commit; the weights stage, :mod:`vitplasticity.models.weights`, fetches it for
the workflow). :mod:`vitplasticity.models.timm_build` builds it.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vitplasticity.models.spec import ModelSpec

if TYPE_CHECKING:
    from torch import nn

    from vitplasticity.data.preprocessing import Preprocessing
    from vitplasticity.models.weights import HubFile

TIMM_KEYS = frozenset(
    {"timm_id", "weights", "normalize", "crop_pct", "init_seed", "kwargs", "revision"}
)
"""Keys of a timm model entry beside ``family``."""


@dataclass(frozen=True)
class TimmSpec(ModelSpec):
    """One ``family: timm`` entry of config.yaml's ``models``."""

    family = "timm"
    id_key = "timm_id"

    timm_id: str
    weights: str = "hub"
    normalize: str | dict[str, list[float]] = "pretrained"
    crop_pct: float | None = None
    init_seed: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)
    revision: str = "main"

    @property
    def model_id(self) -> str:
        """What names the model in messages: its timm id."""
        return self.timm_id

    @classmethod
    def parse(cls, entry: dict[str, Any]) -> TimmSpec:
        """The spec of a timm entry (``family`` optional: a compute job's spec of a timm
        model leaves it out, workflow/rules/common.smk).

        Raises:
            ValueError: naming an unknown key, or a missing ``timm_id``.
        """
        entry = {key: value for key, value in entry.items() if key != "family"}
        unknown = set(entry) - TIMM_KEYS
        if unknown:
            raise ValueError(
                f"unknown model keys {sorted(unknown)} (family: {cls.family}); "
                f"known: {sorted(TIMM_KEYS | {'family'})}"
            )
        if "timm_id" not in entry:
            raise ValueError(f"model entry (family: {cls.family}) lacks 'timm_id'")
        return cls(**entry)

    def build(self, num_classes: int = 0) -> nn.Module:
        """The timm model (:func:`vitplasticity.models.timm_build.build_timm_model`)."""
        from vitplasticity.models.timm_build import build_timm_model

        return build_timm_model(self, num_classes)

    def preprocessing(self, model: nn.Module) -> Preprocessing:
        """From the model's pretrained_cfg, with the normalisation the spec asks for
        (:func:`vitplasticity.models.timm_build.timm_preprocessing`)."""
        from vitplasticity.models.timm_build import timm_preprocessing

        return timm_preprocessing(model, self)

    @classmethod
    def meta_build_key(cls, entry: Mapping[str, Any]) -> str | None:
        """An entry with ``kwargs`` is built on the meta device at parse time; the build
        depends on timm's version, the id and the kwargs."""
        if not entry.get("kwargs"):
            return None
        identity = [importlib.metadata.version("timm"), entry["timm_id"], entry["kwargs"]]
        return json.dumps(identity, sort_keys=True, default=str)

    @classmethod
    def meta_build_problem(cls, name: str, entry: Mapping[str, Any]) -> str | None:
        """``timm.create_model`` of the entry on the meta device (no memory, no weights): a
        wrong id or keyword named before any job."""
        import timm
        import torch

        timm_id = entry["timm_id"]
        if not timm.is_model(timm_id):
            return (
                f"models.{name}.timm_id: {timm_id!r} is not a timm model (timm.list_models() "
                "lists them)"
            )
        try:
            with torch.device("meta"):
                timm.create_model(
                    timm_id, pretrained=False, **{**entry["kwargs"], "num_classes": 0}
                )
        # A bad keyword or value; not an op that the meta device lacks (the job tells those).
        except (TypeError, ValueError, AssertionError, KeyError) as error:
            return (
                f"models.{name}.kwargs: timm.create_model({timm_id!r}) refuses them "
                f"({type(error).__name__}: {error}): fix or remove the key"
            )
        return None

    @classmethod
    def hub_weights_file(cls, entry: Mapping[str, Any]) -> HubFile:
        """The hub file timm loads for a ``weights: hub`` entry
        (:func:`vitplasticity.models.weights.hub_file`).

        Raises:
            KeyError: for an entry without ``timm_id``.
            ValueError: when the hub has no safetensors file for it.
        """
        from vitplasticity.models.weights import hub_file

        return hub_file(
            str(entry["timm_id"]), str(entry.get("revision", "main")), entry.get("kwargs")
        )
