"""The front door for models: every stage builds the model of a ``models:`` entry here.

Two paired functions: :func:`build_model` (the model of a spec or an entry: bare, with a new
``num_classes``-way classifier, or with its LM head) and :func:`preprocessing` (the eval
preprocessing of that model under its spec). Both take the entry's spec, parsed once per job by
:meth:`vitplasticity.models.spec.ModelSpec.from_config` (or :func:`model_spec`), whose
``family:`` picks the spec class (:data:`vitplasticity.models.spec.FAMILIES`); the spec class
names its family's builder and preprocessor (timm: :mod:`vitplasticity.models.timm_build`;
transformers: :mod:`vitplasticity.models.hf_build` and
:mod:`vitplasticity.models.hf_preprocessing`), imported here when a model is built. The
family's architecture (:mod:`vitplasticity.models.architectures`) then tells every stage where
the model's components are.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.models.spec import ModelSpec


def model_spec(spec: ModelSpec | Mapping[str, Any]) -> ModelSpec:
    """``spec`` itself, or the spec of a ``models`` entry (:meth:`ModelSpec.from_config`).

    Raises:
        ValueError: naming an unknown family or key, or a missing id key.
    """
    return spec if isinstance(spec, ModelSpec) else ModelSpec.from_config(spec)


def build_model(
    spec: ModelSpec | Mapping[str, Any],
    num_classes: int = 0,
    *,
    lm_head: bool = False,
    inputs: str | None = None,
) -> nn.Module:
    """The model of ``spec`` (or of a ``models`` entry), in its family's way.

    The backbone does not depend on the caller's RNG (a random init is drawn from the entry's
    ``init_seed``; weights load strictly, or the build fails naming the file and the keys); a
    new head is drawn from it, so a run's seed sets the head and nothing else.

    Args:
        spec: a parsed spec, or a ``models`` entry (timm without ``family``).
        num_classes: a new ``num_classes``-way classifier (0: the bare model).
        lm_head: a text model with its LM head: a causal LM as it is, a bare model inside its
            causal-LM class with the head tied to its embedding
            (:func:`vitplasticity.models.text.causal_lm`).
        inputs: what the stage feeds the model ("images", "tokens"): a model whose
            architecture takes other inputs is refused (None: any).

    Raises:
        ValueError: for an entry its family refuses, weights that do not match the model, or
            a model that does not take ``inputs``.
        FileNotFoundError: for weights that are not there (or not in the hub cache offline).
        UnsupportedModel: with ``lm_head``, for a bare model whose head cannot be tied.
    """
    spec = model_spec(spec)
    model = _family_function(spec.builder)(spec, num_classes)
    if inputs is not None:
        check_inputs(model, spec, inputs)
    if lm_head:
        from vitplasticity.models.text import causal_lm

        return causal_lm(model)
    return model


def check_inputs(model: nn.Module, spec: ModelSpec, inputs: str) -> None:
    """Raise unless ``model``'s architecture takes ``inputs`` (a folder of a text model given
    to an image stage, or the other way round).

    Raises:
        UnsupportedModel: naming the model's class, for a model no architecture knows.
        ValueError: naming the model, its weights, its class and what it takes.
    """
    from vitplasticity.models.architectures import architecture_for

    architecture = architecture_for(model)
    if architecture.inputs != inputs:
        weights = getattr(spec, "weights", None)
        raise ValueError(
            f"model {spec.model_id!r} (weights {weights!r}) is a {type(model).__name__} "
            f"({architecture.name}), which takes {architecture.inputs}: this stage feeds it "
            f"{inputs}; give a model that takes {inputs}"
        )


def preprocessing(model: nn.Module, spec: ModelSpec | Mapping[str, Any]) -> Preprocessing:
    """The eval preprocessing of ``model``, built from ``spec``: its checkpoint's (timm's
    pretrained_cfg, a transformers image processor) with the normalisation ``spec`` asks for.

    Raises:
        ValueError: for a normalisation or processor config the transforms cannot follow.
    """
    spec = model_spec(spec)
    return _family_function(spec.preprocessor)(model, spec)


def _family_function(path: str) -> Callable[..., Any]:
    """The function a spec class names as ``module:function``."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def train_flops_per_image(timm_id: str, kwargs: dict[str, Any] | None = None) -> int:
    """Training FLOPs of one image for the model ``timm_id`` (and ``kwargs``) at its input
    resolution, counted by its architecture (``Architecture.train_flops_per_image``).

    The model is built on the meta device: no weights, no memory, no arithmetic (a second
    for a 7B model). The classifier is left out (``num_classes=0``), as the count leaves it.

    Raises:
        UnsupportedModel: no architecture knows the model (naming its class).
    """
    import timm

    from vitplasticity.models.architectures import architecture_for
    from vitplasticity.models.timm_build import input_resolution

    with torch.device("meta"):
        model = timm.create_model(timm_id, pretrained=False, **{**(kwargs or {}), "num_classes": 0})
        side = input_resolution(model)
        images = torch.empty(1, 3, side, side)
    return architecture_for(model).train_flops_per_image(model, images)


def pick_device(requested: str = "auto") -> torch.device:
    """The device to run on: "auto" takes the GPU when one is present."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)
