"""transformers ``GPTNeoXModel`` (GPT-NeoX-20B, the Pythia suite; and its task classes,
``GPTNeoXForCausalLM``, ``GPTNeoXForSequenceClassification``, ``GPTNeoXForTokenClassification``,
``GPTNeoXForQuestionAnswering``): LayerNorm pre-norms, parallel attention and MLP
(docs/protocol.md, section 3.1).

With ``use_parallel_residual`` (the default) a layer is ``x + attn(input_layernorm(x)) +
mlp(post_attention_layernorm(x))``: LN1 is ``input_layernorm`` (the attention's norm), LN2
``post_attention_layernorm`` (the MLP's, despite its name: it reads the layer's input, as the
attention's norm does). Without it the layer is the usual pre-norm block, ``x + attn(
input_layernorm(x))`` then ``+ mlp(post_attention_layernorm(.))``, with the same LN1 and LN2.
MHA is ``attention``: ``query_key_value`` (q, k and v of each head as consecutive row blocks,
head by head: trained, adapted by LoRA and exported whole) with rotary positions on the first
``partial_rotary_factor`` of each head (``rotary_pct``), and ``dense``; FC1 ``mlp.dense_h_to_4h``,
FC2 ``mlp.dense_4h_to_h``. The residual dropouts (``hidden_dropout``) are the branches'; the
embedding output is ``emb_dropout(embed_in(ids))``; the head the ``final_layer_norm`` and what a
task class adds (``GPTNeoXForCausalLM``'s ``lm_head``, untied by default). Context:
:mod:`~vitplasticity.models.architectures.hf_parallel`.
"""

from __future__ import annotations

import torch
from torch import nn

from vitplasticity.models.architectures.hf_parallel import PARALLEL, SEQUENTIAL, HFParallel


class HFGPTNeoX(HFParallel):
    """transformers GPT-NeoX: LayerNorm pre-norms, rotary, parallel (or sequential) branches."""

    name = "hf_gpt_neox"
    title = "transformers GPTNeoXModel"
    model_types = ("gpt_neox",)
    bare_classes = ("GPTNeoXModel",)
    embedding_names = ("embed_in",)
    layers_name = "layers"
    final_norm_name = "final_layer_norm"
    attention_name = "attention"

    def layout(self, block: nn.Module) -> str:
        return PARALLEL if block.use_parallel_residual else SEQUENTIAL

    def norm_names(self, block: nn.Module) -> tuple[str, str]:
        return "input_layernorm", "post_attention_layernorm"

    def embedded_tokens(self, decoder: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        return decoder.emb_dropout(decoder.embed_in(inputs))

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.post_attention_dropout(out)

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.post_mlp_dropout(out)
