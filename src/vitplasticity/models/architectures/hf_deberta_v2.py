"""transformers ``DebertaV2Model`` (DeBERTa-v2, DeBERTa-v3; and its task classes,
``DebertaV2ForMaskedLM``, ``DebertaV2ForSequenceClassification``,
``DebertaV2ForTokenClassification``, ``DebertaV2ForQuestionAnswering``): post-norm encoder layers
with disentangled attention (docs/architectures.md, "Post-norm encoders").

A layer is BERT's, module for module: ``x1 = attention.output.LayerNorm(x + dense(attn(x)))``,
then ``output.LayerNorm(x1 + output.dense(act(intermediate.dense(x1))))``; the convention is
:mod:`~vitplasticity.models.architectures.hf_bert`'s: LN1 ``attention.output.LayerNorm``, MHA
``attention.self`` followed by ``attention.output.dense`` (one part), LN2 ``output.LayerNorm``,
FC1 ``intermediate.dense``, FC2 ``output.dense``.

The attention (``DisentangledSelfAttention``) adds to each content logit ``q_i . k_j`` a
content-to-position term ``q_i . pk(r(i, j))`` and a position-to-content term ``k_j . pq(r(j,
i))`` (``pos_att_type``: ``c2p``, ``p2c``), all divided by sqrt(d_h times one plus the number of
terms), ``r`` the relative distance (log-bucketed with ``position_buckets``). The position keys
and queries are projections of the relative embeddings: by ``pos_key_proj``/``pos_query_proj``
(in ``attention.self``: MHA's), or by ``key_proj``/``query_proj`` themselves
(``share_att_key``). The relative embeddings are held outside the layers, once for all of them:
the encoder's ``rel_embeddings`` and, with ``norm_rel_ebd: layer_norm``, the encoder's
``LayerNorm`` of them. Both are declared others trained with MHA (they enter every layer's
attention logits and nothing else, as BEiT's shared relative position bias); MHA is measured as
the attention with the position terms its layer adds, in both protocols. Without
``relative_attention`` the attention is BERT's but for that scale.

The embedding output is the model's ``embeddings(ids)``: word embeddings, plus the absolute
position embeddings when ``position_biased_input`` (DeBERTa-v3 has none), plus the token-type
embeddings when ``type_vocab_size`` > 0, projected by ``embed_proj`` when ``embedding_size``
differs from the width, then LayerNorm; ``emb`` trains the whole ``embeddings`` module. Every
layer attends to every token (an all-ones mask, as the model's forward builds it without one)
and gets the relative positions and embeddings the encoder gives it. The head is what a task
class adds: the classifiers' ``pooler`` and ``classifier``, a masked LM's prediction head (its
decoder weight, the tied word embedding, left to ``emb``).

Refused by name: the convolution after the first layer (``conv_kernel_size`` > 0, DeBERTa-v2
xlarge and xxlarge: ``encoder.conv`` adds a convolution of the embedding output to the first
layer's output, a branch no component is), and repeated last layers (``z_steps`` > 1). The MHA
bound is refused with relative attention (position terms in the logits); without it the
logits are ``x A x^T`` at the module's scale, and every bound is defined.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    AttentionWeights,
    Declared,
    Embedded,
    Owned,
    UndefinedStage,
    UnsupportedModel,
)
from vitplasticity.models.architectures.hf_bert import HFBert
from vitplasticity.models.refusals import DEBERTA_CONV_REASON

ATTENTION_LINEARS: tuple[str, ...] = ("query_proj", "key_proj", "value_proj")
"""The content projections of ``attention.self``."""

POSITION_LINEARS: tuple[str, ...] = ("pos_key_proj", "pos_query_proj")
"""The projections of the relative embeddings of ``attention.self`` (without ``share_att_key``,
for ``c2p`` and ``p2c``)."""

LAYER_LINEARS: tuple[str, ...] = (
    *(f"attention.self.{name}" for name in ATTENTION_LINEARS),
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)

_RELATIVE_REASON = (
    "adds disentangled relative-position terms (content-to-position and position-to-content, "
    "from relative embeddings held outside its layers) to every attention logit: the paper's "
    "MHA bound is stated for softmax(x A x^T) without position terms"
)


@dataclass(frozen=True)
class DebertaContext:
    """What every layer receives beside the tokens, as the encoder's forward gives it."""

    mask: torch.Tensor  # (1, 1, L, L), every token attends to every token
    relative_pos: torch.Tensor | None  # (1, L, L) relative distances (bucketed); None: off
    rel_embeddings: torch.Tensor | None  # (2 span, d), normed when the encoder norms them


class HFDebertaV2(HFBert):
    """transformers DebertaV2Model: post-norm encoder layers, disentangled attention."""

    name = "hf_deberta_v2"
    title = "transformers DebertaV2Model"
    model_types = ("deberta-v2",)
    bare_classes = ("DebertaV2Model",)
    layer_linears = LAYER_LINEARS

    # --- what it is ---------------------------------------------------------------------------

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming what the encoder has beside its layers that
        no component accounts for (in place of BERT's checks)."""
        bare, name = self.bare(model), type(model).__name__
        if getattr(bare.encoder, "conv", None) is not None:
            raise UnsupportedModel(
                f"{name} has a convolution after its first layer (conv_kernel_size="
                f"{bare.config.conv_kernel_size}: {DEBERTA_CONV_REASON})"
            )
        if getattr(bare, "z_steps", 0) > 1:
            raise UnsupportedModel(
                f"{name} runs its last layer again (z_steps={bare.z_steps}): a layer's "
                "components run more than once per forward pass"
            )
        if bare.encoder.relative_attention and not hasattr(bare.encoder, "rel_embeddings"):
            raise UnsupportedModel(f"{name}: relative_attention without rel_embeddings")

    # --- which parameters are whose -----------------------------------------------------------

    def declared(self, model: nn.Module) -> list[Declared]:
        """The encoder's relative embeddings and their LayerNorm, trained with MHA."""
        encoder = self.bare(model).encoder
        found = []
        if getattr(encoder, "rel_embeddings", None) is not None:
            found.append(Declared("rel_embeddings", "mha", Owned((encoder.rel_embeddings,))))
        if getattr(encoder, "LayerNorm", None) is not None:
            found.append(Declared("rel_embeddings_norm", "mha", Owned((encoder.LayerNorm,))))
        return found

    # --- how it runs --------------------------------------------------------------------------

    def max_length(self, model: nn.Module) -> int:
        """The model's ``max_position_embeddings`` (its absolute positions, when it has them;
        the relative distances are numbered up to it too)."""
        return self.bare(model).config.max_position_embeddings

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """``embeddings(ids)``, and the all-ones mask, relative positions and relative
        embeddings every layer gets, as the model's own forward computes them.

        Raises:
            ValueError: for sequences longer than the model's positions.
        """
        limit = self.max_length(model)
        if inputs.shape[1] > limit:
            raise ValueError(
                f"sequences of {inputs.shape[1]} tokens exceed the model's {limit} positions"
            )
        bare = self.bare(model)
        tokens = bare.embeddings(input_ids=inputs)  # (B, L, d); no mask: all ones
        encoder = bare.encoder
        ones = torch.ones(1, inputs.shape[1], device=inputs.device)
        context = DebertaContext(
            encoder.get_attention_mask(ones),
            encoder.get_rel_pos(tokens),
            encoder.get_rel_embedding(),
        )
        return Embedded(tokens, context)

    def layer_inputs(self, embedded: Embedded, index: int) -> dict[str, Any]:
        """The mask, relative positions and relative embeddings (a layer's and its attention's)."""
        context: DebertaContext = embedded.context
        return {
            "attention_mask": context.mask,
            "relative_pos": context.relative_pos,
            "rel_embeddings": context.rel_embeddings,
        }

    # --- other stages -------------------------------------------------------------------------

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        if self.bare(model).encoder.relative_attention:
            return f"{type(model).__name__} {_RELATIVE_REASON}"
        return None

    def mha_weights(self, modules: tuple[nn.Module, ...]) -> AttentionWeights:
        """Q, K, V from ``attention.self``, O from ``attention.output.dense``; the logits are
        divided by sqrt(d_h times one plus the number of ``pos_att_type`` terms), even where
        relative attention is off.

        Raises:
            UndefinedStage: with relative attention (position terms in the logits).
        """
        attention, dense = modules
        if attention.relative_attention:
            raise UndefinedStage(f"DeBERTa-v2 with relative attention {_RELATIVE_REASON}")
        terms = 1 + sum(term in attention.pos_att_type for term in ("c2p", "p2c"))
        return AttentionWeights(
            attention.query_proj.weight,
            attention.key_proj.weight,
            attention.value_proj.weight,
            dense.weight,
            attention.num_attention_heads,
            logit_scale=1.0 / math.sqrt(attention.attention_head_size * terms),
        )

    def lora_linears(self, block: nn.Module) -> Sequence[nn.Module]:
        """Every linear layer of MHA: ``query_proj``, ``key_proj``, ``value_proj``, the position
        projections where the layer has them, and ``attention.output.dense``."""
        attention = block.attention.self
        return (
            *(getattr(attention, name) for name in ATTENTION_LINEARS),
            *(getattr(attention, name) for name in POSITION_LINEARS if hasattr(attention, name)),
            block.attention.output.dense,
        )
