"""transformers ``LlamaModel``, ``MistralModel``, ``Qwen2Model``, ``Qwen3Model`` and ``GemmaModel``
(Gemma v1; and their task classes, ``XForCausalLM``, ``XForSequenceClassification``...): one
family, the layers share their structure (docs/protocol.md, section 3.1).

A layer is ``x + self_attn(input_layernorm(x))`` then ``x + down_proj(act(gate_proj(v)) *
up_proj(v))`` with ``v = post_attention_layernorm(x)``: LN1 is ``input_layernorm``, MHA
``self_attn`` (``q/k/v/o_proj`` with their biases where the config has them, Qwen2's q/k/v
biases, Qwen3's per-head ``q_norm``/``k_norm``; grouped-query attention inside), LN2
``post_attention_layernorm`` (both RMSNorm), FC1 ``gate_proj`` + ``up_proj``, FC2 ``down_proj``.
The embedding is ``embed_tokens``; the head the final ``norm`` (and a task class's untied
``lm_head`` or ``score``).
How the context (causal and sliding-window masks, rotary cos/sin) is built:
:mod:`~vitplasticity.models.architectures.hf_decoder`. Mistral slides its window on every layer when
``sliding_window`` is set; Qwen2 and Qwen3 on the layers ``layer_types`` marks
``sliding_attention`` (``use_sliding_window`` with ``max_window_layers``); Llama and Gemma never.

Gemma v1 is Llama's layer (pre-norms only, no post-branch norms: Gemma 2 and 3 add those,
:mod:`~vitplasticity.models.architectures.hf_gemma`) with what Gemma changes inside modules:
its RMSNorms multiply by ``1 + weight`` (declared by
:func:`~vitplasticity.models.architectures.hf_gemma.offset_norm_gains`), its ``embed_tokens`` scales by sqrt(hidden_size) (the
embedding output is the scaled one), its MLP is GeGLU (``act_fn`` is gelu).
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from vitplasticity.models.architectures.hf_decoder import HFDecoder, Variant
from vitplasticity.models.architectures.hf_gemma import offset_norm_gains


class HFLlama(HFDecoder):
    """transformers Llama, Mistral, Qwen2, Qwen3, Gemma (v1): RMSNorm pre-norms, rotary, gated
    MLP (SwiGLU; Gemma's GeGLU)."""

    name = "hf_llama"
    title = "transformers LlamaModel / MistralModel / Qwen2Model / Qwen3Model / GemmaModel"
    model_types = ("llama", "mistral", "qwen2", "qwen3", "gemma")
    variants: ClassVar[dict[str, Variant]] = {
        "LlamaModel": Variant(windows="none"),
        "MistralModel": Variant(windows="config"),
        "Qwen2Model": Variant(windows="layer_types"),
        "Qwen3Model": Variant(windows="layer_types"),
        "GemmaModel": Variant(windows="none"),
    }
    ln2_name = "post_attention_layernorm"

    def weight_offsets(self, model: nn.Module) -> dict[nn.Parameter, float]:
        return offset_norm_gains(model)  # Gemma v1's; none in the others
