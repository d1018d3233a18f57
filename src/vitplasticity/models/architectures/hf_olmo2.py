"""transformers ``Olmo2Model`` (OLMo 2; and its task classes, ``Olmo2ForCausalLM``,
``Olmo2ForSequenceClassification``): decoder layers that normalise each branch's output and
nothing before it (docs/architectures.md, "Post-branch norms").

A layer is ``x1 = x + post_attention_layernorm(self_attn(x))`` then ``x1 +
post_feedforward_layernorm(mlp(x1))``: no norm before attention or the MLP, one RMSNorm after
each. The convention: LN1 is the norm of the attention branch, LN2 the norm of the MLP branch,

    x1 = x + LN1(MHA(x))                 LN1 = post_attention_layernorm
    x2 = x1 + LN2(FC2(act(FC1(x1))))     LN2 = post_feedforward_layernorm

as for a post-norm encoder (:mod:`~vitplasticity.models.architectures.hf_bert`) LN1 is the norm
that goes with the attention and LN2 the one that goes with the MLP, each measured on what it
receives: the in-situ protocol reads LN1 from MHA's output to its normalised output, LN2 from
FC2's. MHA is ``self_attn`` whole: ``q/k/v/o_proj`` and the RMSNorms ``q_norm``/``k_norm`` of
the projected queries and keys (over all heads together, before the head split: the
attention's own, trained with MHA), grouped-query attention inside. FC1 is ``gate_proj`` +
``up_proj`` (fc1 mode ``up``: ``up_proj`` alone), FC2 ``down_proj``. The embedding is
``embed_tokens``, the head the final ``norm`` (and a task class's untied ``lm_head`` or
``score``). Every layer is causal, none slides a window; rotary positions as Llama's.
Context: :mod:`~vitplasticity.models.architectures.hf_decoder`.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures.base import Embedded, UnsupportedModel
from vitplasticity.models.architectures.hf_decoder import HFDecoder, Variant

PRE_NORMS: tuple[str, ...] = ("input_layernorm", "pre_feedforward_layernorm")
"""Norms before a branch: an OLMo2 layer has none (a layer with one is another kind)."""


class HFOlmo2(HFDecoder):
    """transformers OLMo2: RMSNorms after each branch (none before), rotary, SwiGLU MLP."""

    name = "hf_olmo2"
    title = "transformers Olmo2Model"
    model_types = ("olmo2",)
    variants: ClassVar[dict[str, Variant]] = {"Olmo2Model": Variant(windows="none")}
    ln1_name = "post_attention_layernorm"
    ln2_name = "post_feedforward_layernorm"

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        pre_norms = [name for name in PRE_NORMS if hasattr(block, name)]
        if pre_norms:
            raise UnsupportedModel(
                f"layer {index} ({type(block).__name__}) of {type(model).__name__} is not a "
                f"{self.title} layer: it has a norm before a branch ({pre_norms})"
            )
        super().check_block(block, index, model)

    def compose_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        """``x1 = x + ln1(mha(x))``, then ``x1 + ln2(mlp(x1))``: each norm on its branch's
        output, none before a branch."""
        (ln1,), (mha,), (ln2,), fc1, fc2 = (components[c] for c in COMPONENTS)
        x = tokens + ln1(self.attend(mha, tokens, embedded, index))
        return x + ln2(self.mlp(block, fc1, fc2, x))
