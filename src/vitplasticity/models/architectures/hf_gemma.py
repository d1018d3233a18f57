"""transformers ``Gemma2Model`` and ``Gemma3TextModel`` (and their task classes,
``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``, ``Gemma3TextForSequenceClassification``...):
decoder layers with sandwich norms (docs/protocol.md, section 3.1).

A layer is ``x + post_attention_layernorm(self_attn(input_layernorm(x)))`` then
``x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x)))``. LN1 is
``input_layernorm``, MHA ``self_attn`` (``q/k/v/o_proj``, the attention logit softcapping of
Gemma2, the per-head ``q_norm``/``k_norm`` of Gemma3, grouped-query attention), LN2
``pre_feedforward_layernorm`` (the norm before the MLP, as LN2 is in the paper's block), FC1
``gate_proj`` + ``up_proj``, FC2 ``down_proj``.

The two post-norms are declared others, each trained with the component whose output it
normalises: ``post_attention_layernorm`` with ``mha`` (it rescales MHA's output before the
residual, as LayerScale does), ``post_feedforward_layernorm`` with ``fc2`` (the same for FC2's
output). Neither enters a plasticity ratio: MHA and FC2 are measured at their own outputs.

Gemma's RMSNorm multiplies by ``1 + weight`` (declared: :func:`offset_norm_gains`, so that a
criterion relative to a norm's weight is relative to the scale it applies); its token embedding scales by sqrt(hidden_size)
inside ``embed_tokens`` (the embedding output is the scaled one, as the model's forward feeds
its first layer). Gemma2 alternates sliding-window and global layers (``layer_types``); Gemma3
too, with a local and a global rotary table (``rotary_emb(x, positions, layer_type)``): each
layer gets the mask and rotary table the model's forward gives it. The final logit softcapping
of a causal LM acts on the logits, after every parameter the stages see. A model with
``use_bidirectional_attention`` (an embedding encoder) is refused.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import Declared, Owned, UnsupportedModel
from vitplasticity.models.architectures.hf_decoder import HFDecoder, Variant

OFFSET_NORMS = ("GemmaRMSNorm", "Gemma2RMSNorm", "Gemma3RMSNorm")
"""Gemma's RMSNorm classes (1, 2, 3): each multiplies by ``1 + weight``, its stored gain an
offset from 1 (0 at init)."""


def offset_norm_gains(model: nn.Module) -> dict[nn.Parameter, float]:
    """The gain of every Gemma RMSNorm of ``model`` (:data:`OFFSET_NORMS`: its blocks' norms,
    Gemma3's q/k norms, the final norm), each with its offset 1: the scale the layer applies
    is 1 + weight (:meth:`~vitplasticity.models.architectures.base.Architecture.weight_offsets`)."""
    return {
        module.weight: 1.0 for module in model.modules() if type(module).__name__ in OFFSET_NORMS
    }


POST_NORMS: dict[str, str] = {
    "post_attention_layernorm": "mha",
    "post_feedforward_layernorm": "fc2",
}
"""The sandwich post-norms and the configuration that trains each."""


class HFGemma(HFDecoder):
    """transformers Gemma 2 and Gemma 3 (text): sandwich RMSNorms, rotary, GeGLU MLP."""

    name = "hf_gemma"
    title = "transformers Gemma2Model / Gemma3TextModel"
    model_types = ("gemma2", "gemma3_text")
    variants: ClassVar[dict[str, Variant]] = {
        "Gemma2Model": Variant(windows="layer_types"),
        "Gemma3TextModel": Variant(windows="layer_types", rotary_by_layer_type=True),
    }
    ln2_name = "pre_feedforward_layernorm"

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        missing = [name for name in POST_NORMS if not hasattr(block, name)]
        if missing:
            raise UnsupportedModel(
                f"layer {index} ({type(block).__name__}) of {type(model).__name__} is not a "
                f"{self.title} layer: it lacks {missing}"
            )
        super().check_block(block, index, model)

    def declared(self, model: nn.Module) -> list[Declared]:
        return [
            Declared(norm, trained_by, Owned((getattr(block, norm),)), index)
            for index, block in enumerate(self.block_list(model))
            for norm, trained_by in POST_NORMS.items()
        ]

    def weight_offsets(self, model: nn.Module) -> dict[nn.Parameter, float]:
        return offset_norm_gains(model)

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.post_attention_layernorm(out)

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.post_feedforward_layernorm(out)
