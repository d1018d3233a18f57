"""The registered architectures, and which one a model is.

Adding a family is one file (an :class:`~vitplasticity.models.architectures.base.Architecture`
subclass, its build facts declared on it) and one line in :data:`ARCHITECTURES`
(docs/architectures.md); a family outside this package registers with
:func:`register_architecture`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vitplasticity.models.architectures.base import Architecture, UnsupportedModel
from vitplasticity.models.architectures.hf_beit import HFBeit, HFData2VecVision
from vitplasticity.models.architectures.hf_bert import HFBert
from vitplasticity.models.architectures.hf_deberta_v2 import HFDebertaV2
from vitplasticity.models.architectures.hf_dinov3 import HFDinov3
from vitplasticity.models.architectures.hf_falcon import HFFalcon
from vitplasticity.models.architectures.hf_gemma import HFGemma
from vitplasticity.models.architectures.hf_gpt2 import HFGPT2
from vitplasticity.models.architectures.hf_gpt_neox import HFGPTNeoX
from vitplasticity.models.architectures.hf_llama import HFLlama
from vitplasticity.models.architectures.hf_moe import HFMoE
from vitplasticity.models.architectures.hf_olmo2 import HFOlmo2
from vitplasticity.models.architectures.hf_phi3 import HFPhi3
from vitplasticity.models.architectures.hf_swin import HFSwin
from vitplasticity.models.architectures.hf_vision import (
    HFClipVision,
    HFDeiT,
    HFDinov2,
    HFSiglipVision,
    HFViT,
)
from vitplasticity.models.architectures.hf_vitmae import HFViTMAE
from vitplasticity.models.architectures.timm_beit import TimmBeit
from vitplasticity.models.architectures.timm_eva import TimmEva
from vitplasticity.models.architectures.timm_swin import TimmSwin
from vitplasticity.models.architectures.timm_vit import TimmVisionTransformer

ARCHITECTURES: dict[str, Architecture] = {
    architecture.name: architecture
    for architecture in (
        TimmVisionTransformer(),
        TimmEva(),
        TimmBeit(),
        TimmSwin(),
        HFGPT2(),
        HFLlama(),
        HFGemma(),
        HFPhi3(),
        HFGPTNeoX(),
        HFFalcon(),
        HFOlmo2(),
        HFMoE(),
        HFBert(),
        HFDebertaV2(),
        HFViT(),
        HFDeiT(),
        HFBeit(),
        HFData2VecVision(),
        HFViTMAE(),
        HFDinov2(),
        HFDinov3(),
        HFClipVision(),
        HFSiglipVision(),
        HFSwin(),
    )
}
"""Every known family by name, checked in this order."""

_NO_LN1_LN2 = "no LN1 and LN2 in the paper's sense"

REFUSED: dict[str, str] = {
    "GPTJPreTrainedModel": (
        "GPT-J blocks run attention and MLP in parallel on one normed input (x + attn(ln(x)) "
        f"+ mlp(ln(x))): a single norm, {_NO_LN1_LN2}"
    ),
    "PhiPreTrainedModel": (
        "Phi blocks run attention and MLP in parallel on one normed input (x + attn(ln(x)) + "
        f"mlp(ln(x))): a single norm, {_NO_LN1_LN2}"
    ),
}
"""transformers model classes refused by name (any class whose MRO holds one: the bare model
and every head class), with the reason; docs/architectures.md."""


def known_families() -> str:
    """The registered families, for error messages."""
    return "; ".join(f"{a.name} ({a.title})" for a in ARCHITECTURES.values())


def architecture_for(model: nn.Module) -> Architecture:
    """The architecture of ``model``.

    Raises:
        UnsupportedModel: naming the model's class and why, for a class refused by name
            (:data:`REFUSED`); naming it and the known families, when none matches.
    """
    for cls in type(model).__mro__:
        if cls.__name__ in REFUSED:
            raise UnsupportedModel(
                f"{type(model).__name__} ({type(model).__module__}) is refused: "
                f"{REFUSED[cls.__name__]}"
            )
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


def register_architecture(architecture: Architecture) -> None:
    """Add ``architecture`` to :data:`ARCHITECTURES` (checked after the registered ones).

    Raises:
        ValueError: when one of that name is registered.
    """
    if architecture.name in ARCHITECTURES:
        raise ValueError(f"architecture {architecture.name!r} is registered already")
    ARCHITECTURES[architecture.name] = architecture


def unregister_architecture(name: str) -> None:
    """Forget the architecture ``name`` (one :func:`register_architecture` added)."""
    del ARCHITECTURES[name]


def declared(fact: str) -> dict[str, Any]:
    """One build fact of every registered architecture, merged: ``declared("classifiers")``
    maps each tower class of every family to its classification class
    (:class:`~vitplasticity.models.architectures.base.Architecture` lists the facts)."""
    merged: dict[str, Any] = {}
    for architecture in ARCHITECTURES.values():
        merged.update(getattr(architecture, fact))
    return merged
