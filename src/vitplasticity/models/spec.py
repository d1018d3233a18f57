"""What a ``models:`` entry of config.yaml is: one spec type per model family, parsed once.

:meth:`ModelSpec.from_config` reads an entry into the spec of its ``family:`` (the families are
registered in :mod:`vitplasticity.models.registry`; an entry without ``family`` is a timm
entry, as a compute job's timm spec on the workflow's command lines is). A spec knows how its
model is built and preprocessed (:meth:`ModelSpec.build`, :meth:`ModelSpec.preprocessing`);
stages reach both through the front door, :mod:`vitplasticity.models.build`.

The classmethods answer what the Snakefile's parse-time checks ask of an entry without torch
(which inputs its model takes, what is missing from it, what a meta-device build would check).
Nothing here imports torch: a family's builder is imported when a model is built.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch import nn

    from vitplasticity.data.preprocessing import Preprocessing
    from vitplasticity.models.weights import HubFile


class ModelSpec(ABC):
    """The spec of one ``models`` entry; each family is a subclass (a frozen dataclass)."""

    family: ClassVar[str] = ""
    """The ``family:`` value that selects the subclass."""
    id_key: ClassVar[str] = ""
    """The entry key that names the model (``timm_id``, ``hf_id``)."""
    inputs: ClassVar[frozenset[str]] = frozenset({"images"})
    """What the family's models can take: "images", "tokens"."""

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> ModelSpec:
        """The spec of a ``models`` entry, in the class of its ``family`` (timm without one),
        rejecting unknown keys by name.

        Raises:
            ValueError: naming an unknown family or key, or a missing id key.
        """
        from vitplasticity.models.registry import spec_class

        return spec_class(entry).parse(dict(entry))

    @classmethod
    @abstractmethod
    def parse(cls, entry: dict[str, Any]) -> ModelSpec:
        """The spec of an entry of this family (``from_config`` picks the family).

        Raises:
            ValueError: naming an unknown key or a missing one.
        """

    @property
    @abstractmethod
    def model_id(self) -> str:
        """What names the model in messages."""

    @abstractmethod
    def build(self, num_classes: int = 0) -> nn.Module:
        """The model, with a fresh ``num_classes``-way classifier (0: none)."""

    @abstractmethod
    def preprocessing(self, model: nn.Module) -> Preprocessing:
        """The eval preprocessing of the built ``model`` of this spec (images only)."""

    @classmethod
    def declared_inputs(cls, entry: Mapping[str, Any]) -> str | None:
        """What the model of ``entry`` takes ("images", "tokens"), or None when the entry
        alone does not tell (its job reads the checkpoint)."""
        return next(iter(cls.inputs)) if len(cls.inputs) == 1 else None

    @classmethod
    def entry_problems(cls, name: str, entry: Mapping[str, Any]) -> list[str]:
        """What ``models.<name>`` lacks for its weights, found without torch."""
        return []

    @classmethod
    def meta_build_key(cls, entry: Mapping[str, Any]) -> str | None:
        """What a parse-time meta-device build of ``entry`` depends on (a cache key); None
        when the family builds nothing at parse time for it."""
        return None

    @classmethod
    def meta_build_problem(cls, name: str, entry: Mapping[str, Any]) -> str | None:
        """The message of a meta-device build of ``models.<name>`` that fails (imports torch),
        None when it builds."""
        return None

    @classmethod
    def hub_weights_file(cls, entry: Mapping[str, Any]) -> HubFile | None:
        """The one hub file a ``weights: hub`` entry's model loads, for its provenance; None
        when its weights are a folder (the weights stage records its files)."""
        return None
