"""transformers ``Phi3Model`` (Phi-3, Phi-3.5, Phi-4 mini; and its task classes,
``Phi3ForCausalLM``, ``Phi3ForSequenceClassification``, ``Phi3ForTokenClassification``): Llama's
layer with fused projections (docs/protocol.md, section 3.1).

A layer is ``x + dropout(self_attn(input_layernorm(x)))`` then ``x + dropout(down_proj(up *
act(gate)))`` with ``[gate | up] = gate_up_proj(post_attention_layernorm(x))``. LN1 is
``input_layernorm``, MHA ``self_attn``: ``qkv_proj`` (q, k and v as row blocks of one weight,
grouped-query attention inside) and ``o_proj``; LN2 ``post_attention_layernorm`` (both RMSNorm),
FC1 ``gate_up_proj`` (gate and up as row blocks of one weight: the gated MLP's first stage, as
``gate_proj`` + ``up_proj`` are Llama's), FC2 ``down_proj``. Fused weights are trained and
exported as such: a configuration trains all of ``qkv_proj`` or all of ``gate_up_proj``, LoRA
adapts ``qkv_proj`` and ``o_proj``. ``plasticity.fc1: up`` is refused: the up projection is
half of one Linear, not a module. The residual dropouts (``resid_pdrop``) are the branches'.
The model slides its window on every layer when ``sliding_window`` is set (as Mistral); rotary
positions may cover part of each head (``partial_rotary_factor``), as the model's own
``rotary_emb`` gives them. Context: :mod:`~vitplasticity.models.architectures.hf_decoder`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.hf_decoder import HFDecoder, Variant


class HFPhi3(HFDecoder):
    """transformers Phi3: RMSNorm pre-norms, rotary, fused q/k/v and gate/up projections."""

    name = "hf_phi3"
    title = "transformers Phi3Model"
    model_types = ("phi3",)
    variants: ClassVar[dict[str, Variant]] = {"Phi3Model": Variant(windows="config")}
    ln2_name = "post_attention_layernorm"
    attention_linears = ("qkv_proj", "o_proj")
    fc1_linears = ("gate_up_proj",)
    activation = "activation_fn"

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.resid_attn_dropout(out)

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.resid_mlp_dropout(out)
