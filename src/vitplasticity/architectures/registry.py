"""The registered architectures, and which one a model is.

Adding a family is one file (an :class:`~vitplasticity.architectures.base.Architecture`
subclass) and one line in :data:`ARCHITECTURES` (docs/architectures.md).
"""

from __future__ import annotations

from torch import nn

from vitplasticity.architectures.base import Architecture, UnsupportedModel
from vitplasticity.architectures.timm_beit import TimmBeit
from vitplasticity.architectures.timm_eva import TimmEva
from vitplasticity.architectures.timm_vit import TimmVisionTransformer

ARCHITECTURES: dict[str, Architecture] = {
    architecture.name: architecture
    for architecture in (
        TimmVisionTransformer(),
        TimmEva(),
        TimmBeit(),
    )
}
"""Every known family by name, checked in this order."""


def known_families() -> str:
    """The registered families, for error messages."""
    return "; ".join(f"{a.name} ({a.title})" for a in ARCHITECTURES.values())


def architecture_for(model: nn.Module) -> Architecture:
    """The architecture of ``model``.

    Raises:
        UnsupportedModel: naming the model's class and the known families, when none matches.
    """
    for architecture in ARCHITECTURES.values():
        if architecture.matches(model):
            return architecture
    raise UnsupportedModel(
        f"{type(model).__name__} ({type(model).__module__}): no vitplasticity architecture "
        f"knows this model class; known families: {known_families()}"
    )


def get_architecture(name: str) -> Architecture:
    """The registered architecture ``name``.

    Raises:
        ValueError: naming the known ones.
    """
    try:
        return ARCHITECTURES[name]
    except KeyError:
        raise ValueError(
            f"unknown architecture {name!r}; known: {', '.join(ARCHITECTURES)}"
        ) from None
