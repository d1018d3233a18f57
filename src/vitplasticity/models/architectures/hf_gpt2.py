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
    Architecture,
    AttentionWeights,
    Embedded,
    Owned,
    UnsupportedModel,
    bare_model_of,
    check_fc1_mode,
    linear_weight,
    wrapper_head,
)

MODEL_PARTS: tuple[str, ...] = ("wte", "wpe", "drop", "h", "ln_f")
"""What ``GPT2Model`` holds beside its blocks: token and position embeddings, the embedding
dropout, the blocks and the final norm."""

_REFUSALS: dict[str, str] = {}
"""The stages a GPT2 model is refused by, and why (plasticity, lora, finetune and recommend
on text, ``vitplasticity finetune-text`` and ``recommend-text``, and the bounds on text,
``vitplasticity text-bounds``, are supported)."""


def _causal_mask(length: int, tokens: torch.Tensor) -> torch.Tensor:
    """Additive causal mask (1, 1, L, L): 0 on and below the diagonal, the dtype's min above.

    Passed explicitly so that every attention implementation (eager adds it, SDPA takes it)
    is causal; without a mask the eager one would attend to the future.
    """
    blocked = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)
    mask = torch.zeros(length, length, dtype=tokens.dtype, device=tokens.device)
    return mask.masked_fill(blocked, torch.finfo(tokens.dtype).min)[None, None]


class HFGPT2(Architecture):
    """transformers ``GPT2Model`` (and the task classes around one): token + position
    embedding, causal attention, Conv1D MLP."""

    name = "hf_gpt2"
    title = "transformers GPT2Model"
    model_types = ("gpt2",)
    inputs = "tokens"

    # --- what it is ---------------------------------------------------------------------------

    def _gpt2(self, model: nn.Module) -> nn.Module | None:
        """The GPT2Model that ``model`` is or wraps (None: neither)."""
        return bare_model_of(model, ("GPT2Model",))

    def transformer(self, model: nn.Module) -> nn.Module:
        """The GPT2Model: ``model`` itself, or the one its task class holds.

        Raises:
            UnsupportedModel: when ``model`` is neither.
        """
        found = self._gpt2(model)
        if found is None:
            raise UnsupportedModel(f"{type(model).__name__} is not a GPT2Model")
        return found

    def matches(self, model: nn.Module) -> bool:
        return self._gpt2(model) is not None

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(getattr(self.transformer(model), "h", []))

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming the parts of a GPT2Model the model lacks."""
        gpt2 = self.transformer(model)
        missing = [name for name in MODEL_PARTS if not hasattr(gpt2, name)]
        if missing:
            raise UnsupportedModel(f"{type(model).__name__} is not a GPT2Model: it lacks {missing}")

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        # Cross-attention (add_cross_attention) is a third sublayer the paper's block has not.
        if hasattr(block, "crossattention"):
            raise UnsupportedModel(
                f"block {index} of {type(model).__name__} has cross-attention "
                "(add_cross_attention): not the decoder-only block of five components"
            )
        super().check_block(block, index, model)
        weight, _ = linear_weight(block.mlp.c_proj)
        width = self.transformer(model).wte.embedding_dim
        if weight.shape[1] < width:
            raise UnsupportedModel(
                f"block {index}: {type(block.mlp.c_proj).__name__} fc2 takes {weight.shape[1]} "
                f"features, fewer than the {width} of a token: the zero-padded FC2 input is "
                "undefined"
            )

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

    def embedding(self, model: nn.Module) -> Owned:
        gpt2 = self.transformer(model)
        return Owned((gpt2.wte, gpt2.wpe))

    def head(self, model: nn.Module) -> Owned:
        """The final norm, and what a task class adds (``score``, an untied ``lm_head``)."""
        gpt2 = self.transformer(model)
        return Owned((gpt2.ln_f, *wrapper_head(model, gpt2)))

    # --- how it runs --------------------------------------------------------------------------

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """``drop(wte(ids) + wpe(positions))`` and the causal mask every block attends with.

        Raises:
            ValueError: for sequences longer than the model's positions.
        """
        gpt2, length = self.transformer(model), inputs.shape[1]
        if length > gpt2.wpe.num_embeddings:
            raise ValueError(
                f"sequences of {length} tokens exceed the model's {gpt2.wpe.num_embeddings} "
                "positions"
            )
        positions = torch.arange(length, device=inputs.device)[None]  # (1, L)
        tokens = gpt2.drop(gpt2.wte(inputs) + gpt2.wpe(positions))  # (B, L, d)
        return Embedded(tokens, _causal_mask(length, tokens))

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, attention_mask=embedded.context)[0]  # (output, weights)

    def hook_output(self, output: Any) -> torch.Tensor:
        return output[0] if isinstance(output, tuple) else output  # attn: (output, weights)

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        out = block(tokens, attention_mask=embedded.context)
        return out[0] if isinstance(out, tuple) else out

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

    def lora_targets(self, model: nn.Module) -> list[str]:
        """``attn.c_attn`` and ``attn.c_proj`` of every block (fully qualified names)."""
        targets = {
            id(linear)
            for block in self.block_list(model)
            for linear in (block.attn.c_attn, block.attn.c_proj)
        }
        return [name for name, module in model.named_modules() if id(module) in targets]

    def refusal(self, stage: str, model: nn.Module) -> str | None:
        reason = _REFUSALS.get(stage)
        return None if reason is None else f"{type(model).__name__} is a text model: {reason}"
