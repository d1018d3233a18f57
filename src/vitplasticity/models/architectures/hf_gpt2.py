"""transformers ``GPT2Model``: GPT2 124M, whose plasticity the paper also measures
(docs/protocol.md, section 3 "Models").

A block is ``x + attn(ln_1(x))`` then ``x + c_proj(act(c_fc(ln_2(x))))``: LN1 is ``ln_1``, MHA
``attn`` (all of it: the packed ``c_attn`` and ``c_proj``), LN2 ``ln_2``, FC1 ``mlp.c_fc``, FC2
``mlp.c_proj``. Their linears are transformers' ``Conv1D``, weights stored (in, out):
:func:`~vitplasticity.models.architectures.base.linear_weight` transposes them, so the embedding
protocol's FC2 ``c_proj([x, 0, ..., 0])`` meets the first d *rows* of the stored weight.

Inputs are token ids (N, L); the embedding output is ``drop(wte(ids) + wpe(positions))``, and
every block attends through an explicit additive causal mask (the embedding's context). The
embedding configuration is ``wte`` + ``wpe``; the head is the final norm ``ln_f``. A task
class around the GPT2Model (``GPT2LMHeadModel``, ``GPT2ForSequenceClassification``... : the
GPT2Model as ``transformer``, its ``base_model_prefix``) is of the family too; what it adds
beside it (``score``, an untied ``lm_head``) is head
(:func:`~vitplasticity.models.architectures.base.wrapper_head`), and its names keep the
``transformer.`` prefix. Matched by class name: transformers is optional and not imported to
answer "no".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    AttentionWeights,
    Embedded,
    UnsupportedModel,
    check_fc1_mode,
    linear_weight,
)
from vitplasticity.models.architectures.hf_text_common import (
    HFText,
    additive_mask,
    check_fc2_width,
)


class HFGPT2(HFText):
    """transformers ``GPT2Model`` (and the task classes around one): token + position
    embedding, causal attention, Conv1D MLP. No stage is refused (plasticity, lora, finetune
    and recommend on text, ``vitplasticity finetune --text`` and ``recommend --text``, and the
    bounds on text, ``vitplasticity bounds --text``, are supported)."""

    name = "hf_gpt2"
    title = "transformers GPT2Model"
    model_types = ("gpt2",)
    bare_classes = ("GPT2Model",)
    embedding_names = ("wte", "wpe")
    layers_name = "h"
    final_norm_name = "ln_f"
    model_parts = ("drop",)  # the embedding's dropout

    # --- what it is ---------------------------------------------------------------------------

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        # Cross-attention (add_cross_attention) is a third sublayer the paper's block has not.
        if hasattr(block, "crossattention"):
            raise UnsupportedModel(
                f"block {index} of {type(model).__name__} has cross-attention "
                "(add_cross_attention): not the decoder-only block of five components"
            )
        super().check_block(block, index, model)
        weight, _ = linear_weight(block.mlp.c_proj)
        width = self.bare(model).wte.embedding_dim
        fc2 = f"{type(block.mlp.c_proj).__name__} fc2"
        check_fc2_width(f"block {index}", fc2, weight.shape[1], width)

    # --- which parameters are whose -----------------------------------------------------------

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        # A plain MLP: its first linear stage is the up projection, in either fc1 mode.
        check_fc1_mode(fc1)
        return {
            "ln1": (block.ln_1,),
            "mha": (block.attn,),
            "ln2": (block.ln_2,),
            "fc1": (block.mlp.c_fc,),
            "fc2": (block.mlp.c_proj,),
        }

    # --- how it runs --------------------------------------------------------------------------

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """``drop(wte(ids) + wpe(positions))`` and the causal mask every block attends with.

        Raises:
            ValueError: for sequences longer than the model's positions.
        """
        gpt2, length = self.bare(model), inputs.shape[1]
        if length > gpt2.wpe.num_embeddings:
            raise ValueError(
                f"sequences of {length} tokens exceed the model's {gpt2.wpe.num_embeddings} "
                "positions"
            )
        positions = torch.arange(length, device=inputs.device)[None]  # (1, L)
        tokens = gpt2.drop(gpt2.wte(inputs) + gpt2.wpe(positions))  # (B, L, d)
        return Embedded(tokens, additive_mask(length, None, tokens))

    def layer_inputs(self, embedded: Embedded, index: int) -> dict[str, Any]:
        """The causal mask (a block's and its attention's)."""
        return {"attention_mask": embedded.context}

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        (c_fc,), (c_proj,) = fc1, fc2
        return block.mlp.dropout(c_proj(block.mlp.act(c_fc(x))))

    # --- other stages -------------------------------------------------------------------------

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        """Q, K, V are the row blocks of ``c_attn`` (a Conv1D: its (in, out) weight taken in
        torch's (out, in) layout, rows [query; key; value] as its forward splits its output),
        each head's the rows ``h*d_h:(h+1)*d_h`` of its block; O is ``c_proj``. The logits'
        scale is the module's own (``scaling``: 1/sqrt(d_h) by default, 1 without
        ``scale_attn_weights``, divided by the layer's number with
        ``scale_attn_by_inverse_layer_idx``), so that A^h is the form the model computes."""
        stacked, _ = linear_weight(attention.c_attn)  # (3 d, d)
        query, key, value = stacked.split(stacked.shape[0] // 3)
        output, _ = linear_weight(attention.c_proj)  # (d, d)
        return AttentionWeights(
            query, key, value, output, attention.num_heads, float(attention.scaling)
        )

    def lora_linears(self, block: nn.Module) -> Sequence[nn.Module]:
        """``attn.c_attn`` and ``attn.c_proj``."""
        return (block.attn.c_attn, block.attn.c_proj)
