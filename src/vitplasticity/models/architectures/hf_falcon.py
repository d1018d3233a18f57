"""transformers ``FalconModel`` (Falcon-40B/180B's layout, and the sequential variant; and its
task classes, ``FalconForCausalLM``, ``FalconForSequenceClassification``,
``FalconForTokenClassification``, ``FalconForQuestionAnswering``): LayerNorm pre-norms, rotary,
parallel attention and MLP (docs/protocol.md, section 3.1).

With ``new_decoder_architecture`` and ``parallel_attn`` and two norms (``num_ln_in_parallel_attn``
2, what that architecture defaults to) a layer is ``x + dropout(attn(ln_attn(x)) +
mlp(ln_mlp(x)))``: LN1 is ``ln_attn``, LN2 ``ln_mlp``. Without ``parallel_attn`` (and without
``new_decoder_architecture``) it is the usual pre-norm block, ``x + attn(input_layernorm(x))``
then ``+ mlp(post_attention_layernorm(.))``: LN1 ``input_layernorm``, LN2
``post_attention_layernorm``. MHA is ``self_attention``: ``query_key_value`` (q, k and v as row
blocks of one weight in the config's order: grouped per key/value head with
``new_decoder_architecture``, all queries then one key and one value with ``multi_query``, per
head otherwise; trained, adapted by LoRA and exported whole) with rotary positions, and
``dense``; FC1 ``mlp.dense_h_to_4h``, FC2 ``mlp.dense_4h_to_h``. The embedding output is
``word_embeddings(ids)``; the head ``ln_f`` and what a task class adds (``FalconForCausalLM``'s
``lm_head`` is tied to the embedding by default). The dropouts are the model's own: the
attention branch's at ``attention_dropout`` and the MLP's at ``hidden_dropout`` in a sequential
layer, one at ``hidden_dropout`` on the sum of both in a parallel one.

Refused by name: one norm for both parallel branches (``parallel_attn`` without
``new_decoder_architecture``, Falcon-7B's layout, or ``num_ln_in_parallel_attn`` 1): no separate
LN2; ALiBi (``alibi``): the position bias rides in the attention mask, not in the attention;
``new_decoder_architecture`` without ``parallel_attn``, which transformers' layer does not run.
Context: :mod:`~vitplasticity.models.architectures.hf_parallel`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.models.architectures.base import UnsupportedModel
from vitplasticity.models.architectures.hf_parallel import PARALLEL, SEQUENTIAL, HFParallel
from vitplasticity.models.refusals import falcon_reason


def refusal(config: Any) -> str | None:
    """Why a Falcon config's layers have no family layout (None: they are parallel with two
    norms, or sequential): :func:`vitplasticity.models.refusals.falcon_reason` of its values."""
    return falcon_reason(
        config.alibi,
        config.parallel_attn,
        config.new_decoder_architecture,
        config.num_ln_in_parallel_attn,
    )


class HFFalcon(HFParallel):
    """transformers Falcon: LayerNorm pre-norms, rotary, parallel (or sequential) branches."""

    name = "hf_falcon"
    title = "transformers FalconModel"
    model_types = ("falcon",)
    bare_classes = ("FalconModel",)
    embedding_names = ("word_embeddings",)
    layers_name = "h"
    final_norm_name = "ln_f"
    attention_name = "self_attention"

    def check_config(self, model: nn.Module) -> None:
        reason = refusal(self.bare(model).config)
        if reason is not None:
            raise UnsupportedModel(f"{type(model).__name__} is refused: {reason}")

    def layout(self, block: nn.Module) -> str:
        reason = refusal(block.config)
        if reason is not None:
            raise UnsupportedModel(f"{type(block).__name__} is refused: {reason}")
        return PARALLEL if block.config.parallel_attn else SEQUENTIAL

    def norm_names(self, block: nn.Module) -> tuple[str, str]:
        if self.layout(block) == PARALLEL:
            return "ln_attn", "ln_mlp"
        return "input_layernorm", "post_attention_layernorm"

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return F.dropout(out, p=block.config.attention_dropout, training=block.training)

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return F.dropout(out, p=block.config.hidden_dropout, training=block.training)

    def parallel_sum(
        self, block: nn.Module, attention: torch.Tensor, mlp: torch.Tensor
    ) -> torch.Tensor:
        # Falcon drops out the sum of both branches once (mlp_output += attention_output).
        return F.dropout(mlp + attention, p=block.config.hidden_dropout, training=block.training)
