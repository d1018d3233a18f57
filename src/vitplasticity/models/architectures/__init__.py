"""One registry of model architectures: the only code that knows module and parameter names.

Every stage asks :func:`architecture_for` which family a model is, then asks the family where
its components are (:meth:`Architecture.components`), how its embedding and blocks run, and
which parameter is whose (:class:`ParameterMap`). See docs/architectures.md.
"""

from torch import nn

from vitplasticity.components import CONFIGURATIONS, FC1_MODES, parse_configuration
from vitplasticity.models.architectures.base import (
    Architecture,
    AttentionWeights,
    Declared,
    Embedded,
    Owned,
    Parts,
    UndefinedStage,
    UnsupportedModel,
)
from vitplasticity.models.architectures.parameters import Owner, ParameterMap
from vitplasticity.models.architectures.registry import (
    ARCHITECTURES,
    architecture_for,
    declared,
    get_architecture,
    known_families,
    register_architecture,
    unregister_architecture,
)

__all__ = [
    "ARCHITECTURES",
    "CONFIGURATIONS",
    "FC1_MODES",
    "Architecture",
    "AttentionWeights",
    "Declared",
    "Embedded",
    "Owned",
    "Owner",
    "ParameterMap",
    "Parts",
    "UndefinedStage",
    "UnsupportedModel",
    "architecture_for",
    "declared",
    "get_architecture",
    "known_families",
    "parameter_map",
    "parse_configuration",
    "register_architecture",
    "unregister_architecture",
]


def parameter_map(model: nn.Module) -> ParameterMap:
    """The :class:`ParameterMap` of ``model`` under its architecture.

    Raises:
        UnsupportedModel: for a model no architecture knows, or one with a parameter its
            architecture does not account for.
    """
    return ParameterMap(architecture_for(model), model)
