"""What transformers' decoder-only language models share (Llama, Mistral, Qwen2, Qwen3, Gemma 1,
2 and 3, Phi3, OLMo2, and Mixtral and Qwen2-MoE through hf_moe): token-id inputs, a causal (per layer possibly sliding-window) mask and
rotary positions handed to every layer, RMSNorms and a gated MLP (docs/protocol.md, section 3.1).

A layer is ``input_layernorm`` -> ``self_attn`` -> residual, then a norm -> ``mlp`` (``down_proj(
act(gate_proj(v)) * up_proj(v))``) -> residual. LN1 is ``input_layernorm``, MHA ``self_attn``
(all of it: ``q/k/v/o_proj``, their biases, Qwen3's, Gemma3's and OLMo2's ``q_norm``/``k_norm``,
the attention logit softcapping), FC1 the gated MLP's first linear stage ``gate_proj`` +
``up_proj`` (fc1 mode ``up``: ``up_proj`` alone), FC2 ``down_proj``; which norm is LN2 is the
family's (:mod:`~vitplasticity.models.architectures.hf_llama`,
:mod:`~vitplasticity.models.architectures.hf_gemma`). OLMo2 has no norm before either branch:
its LN1 and LN2 are the norms of the branches' outputs
(:mod:`~vitplasticity.models.architectures.hf_olmo2`).

The embedding output is ``embed_tokens(ids)`` (Gemma's scales by sqrt(hidden) inside that module).
What every layer gets beside it (the embedding's context) is built as the model's own forward
builds it: rotary cos/sin from the model's own ``rotary_emb`` at positions 0..L-1 (Gemma3: one
per layer type, local and global), and an explicit additive mask per layer, causal, and
sliding-window on the layers the model runs with one. An explicit mask makes eager and SDPA
attention compute the same thing (the model's forward may hand SDPA no mask and let it be
causal by itself). The bare ``XModel`` classes are the families; a task class around one
(``XForCausalLM``, ``XForSequenceClassification``, ``XForTokenClassification``,
``XForQuestionAnswering``: the bare model under its ``base_model_prefix``) is accepted too, what
it adds (an untied ``lm_head``, ``score``, ``qa_outputs``) head with the final norm
(:func:`~vitplasticity.models.architectures.base.wrapper_head`); its parameter names keep the
prefix. Matched by class name: transformers is optional and not imported to answer "no".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    AttentionWeights,
    Embedded,
    UndefinedStage,
    UnsupportedModel,
    check_fc1_mode,
)
from vitplasticity.models.architectures.hf_text_common import (
    HFText,
    additive_mask,
    check_fc2_width,
)
from vitplasticity.models.refusals import DECODER_BOUNDS_REASON, DECODER_REFUSALS

ATTENTION_IMPLEMENTATIONS: tuple[str, ...] = ("eager", "sdpa")
"""The attention implementations an explicit float mask is exact for (flash and flex attention
take no additive mask)."""

ATTENTION_LINEARS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Variant:
    """How one bare model class chooses each layer's attention window and rotary table."""

    windows: str
    """``none`` (every layer causal), ``config`` (``config.sliding_window`` on every layer when
    set: Mistral) or ``layer_types`` (on the layers ``config.layer_types`` marks
    ``sliding_attention``)."""
    rotary_by_layer_type: bool = False
    """Whether ``rotary_emb`` takes the layer type (Gemma3: local and global rotary tables)."""


@dataclass(frozen=True)
class DecoderContext:
    """What every layer receives beside the tokens, per layer, as the model's forward gives it."""

    positions: torch.Tensor  # (1, L)
    masks: tuple[torch.Tensor, ...]  # per layer, additive (1, 1, L, L)
    rotary: tuple[tuple[torch.Tensor, torch.Tensor], ...]  # per layer, (cos, sin) (1, L, d_h)


def check_attention_implementation(name: str, config: Any) -> None:
    """Raise :class:`UnsupportedModel` when the model ``name`` (of transformers ``config``) runs
    an attention implementation that would not apply the explicit additive mask every stage
    hands a layer (flash or flex attention build their own)."""
    implementation = config._attn_implementation
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise UnsupportedModel(
            f"{name} runs attention_implementation {implementation!r}: the stages hand every "
            f"layer an explicit additive mask, exact for {', '.join(ATTENTION_IMPLEMENTATIONS)}"
            " only (load it with attn_implementation='eager' or 'sdpa')"
        )


class HFDecoder(HFText):
    """A transformers decoder-only language model with RMSNorm, rotary positions and a gated
    MLP. Subclasses set :attr:`variants` and :attr:`ln2_name` (and :attr:`ln1_name` where it is
    not ``input_layernorm``), and override :meth:`compose_block` where the layer is not the
    pre-norm block (OLMo2)."""

    variants: ClassVar[dict[str, Variant]] = {}
    """The bare model classes of the family, by class name."""
    embedding_names = ("embed_tokens",)
    layers_name = "layers"
    final_norm_name = "norm"
    model_parts = ("rotary_emb",)
    text_refusals = DECODER_REFUSALS
    ln1_name: str = "input_layernorm"
    """The layer's LN1: its norm before attention (OLMo2, which has none, the norm of the
    attention's output)."""
    ln2_name: str = ""
    """The layer's LN2: its norm before the MLP (OLMo2: the norm of the MLP's output)."""
    attention_linears: tuple[str, ...] = ATTENTION_LINEARS
    """The attention's linear layers (in ``self_attn``), which LoRA adapts."""
    fc1_linears: tuple[str, ...] = ("gate_proj", "up_proj")
    """The MLP's first linear stage (in ``mlp``): its output is [gate | up]."""
    activation: str = "act_fn"
    """The MLP's activation (in ``mlp``)."""

    # --- what it is ---------------------------------------------------------------------------

    @property
    def bare_classes(self) -> tuple[str, ...]:  # type: ignore[override]
        """The family's bare classes: its :attr:`variants`."""
        return tuple(self.variants)

    def decoder(self, model: nn.Module) -> tuple[nn.Module, Variant]:
        """The bare decoder model and its variant (of the first class in its MRO that has one).

        Raises:
            UnsupportedModel: when ``model`` is not of this family.
        """
        bare = self.bare(model)
        variant = next(
            self.variants[c.__name__] for c in type(bare).__mro__ if c.__name__ in self.variants
        )
        return bare, variant

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        decoder, _ = self.decoder(model)
        # The model's forward runs layers[:num_hidden_layers]; so do the stages.
        return list(decoder.layers[: decoder.config.num_hidden_layers])

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming what the model has unlike the family (a part
        it lacks, an attention implementation the explicit mask is not exact for, bidirectional
        attention, an lm_head that is no Linear)."""
        super().check_model(model)
        decoder, name = self.bare(model), type(model).__name__
        check_attention_implementation(name, decoder.config)
        if getattr(decoder.config, "use_bidirectional_attention", False):
            raise UnsupportedModel(
                f"{name} attends bidirectionally (use_bidirectional_attention, an embedding "
                "encoder): not the causal decoder this family's masks describe"
            )
        if "lm_head" in dict(model.named_children()) and not isinstance(model.lm_head, nn.Linear):
            raise UnsupportedModel(f"{name}: lm_head is {type(model.lm_head).__name__}, not Linear")

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        layer = f"layer {index} ({type(block).__name__}) of {type(model).__name__}"
        linears = [
            *(f"self_attn.{n}" for n in self.attention_linears),
            *(f"mlp.{n}" for n in (*self.fc1_linears, "down_proj")),
        ]
        norms = (self.ln1_name, self.ln2_name)
        self.check_layer_modules(block, layer, norms, linears, self.activation)
        width = getattr(block, self.ln1_name).weight.shape[0]
        check_fc2_width(layer, "down_proj", block.mlp.down_proj.in_features, width)
        super().check_block(block, index, model)

    # --- which parameters are whose -----------------------------------------------------------

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        mlp = block.mlp
        if check_fc1_mode(fc1) == "up" and "up_proj" not in self.fc1_linears:
            raise UnsupportedModel(
                f"fc1 mode 'up' needs separate gate and up projections; {self.title} packs both "
                f"in {'/'.join(self.fc1_linears)}"
            )
        return {
            "ln1": (getattr(block, self.ln1_name),),
            "mha": (block.self_attn,),
            "ln2": (getattr(block, self.ln2_name),),
            "fc1": tuple(getattr(mlp, name) for name in self.fc1_linears)
            if fc1 == "stage"
            else (mlp.up_proj,),
            "fc2": (mlp.down_proj,),
        }

    # --- how it runs --------------------------------------------------------------------------

    def windows(self, model: nn.Module) -> list[int | None]:
        """Each layer's sliding window (None: the whole causal past), as the model's forward
        chooses its mask.

        Raises:
            UnsupportedModel: for a sliding layer without a window size.
        """
        decoder, variant = self.decoder(model)
        config = decoder.config
        count = len(self.block_list(model))
        if variant.windows == "none":
            return [None] * count
        if variant.windows == "config":
            return [config.sliding_window] * count
        types = config.layer_types[:count]
        if "sliding_attention" in types and config.sliding_window is None:
            raise UnsupportedModel(
                f"{type(model).__name__}: layer_types has sliding_attention layers but "
                "sliding_window is None"
            )
        return [config.sliding_window if t == "sliding_attention" else None for t in types]

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """``embed_tokens(ids)`` and, per layer, its mask and rotary cos/sin.

        Raises:
            ValueError: for sequences longer than the model's ``max_position_embeddings``.
        """
        decoder, variant = self.decoder(model)
        length, limit = inputs.shape[1], decoder.config.max_position_embeddings
        if length > limit:
            raise ValueError(f"sequences of {length} tokens exceed the model's {limit} positions")
        tokens = decoder.embed_tokens(inputs)  # (B, L, d); Gemma's scales inside
        positions = torch.arange(length, device=inputs.device)[None]  # (1, L)
        count = len(self.block_list(model))
        if variant.rotary_by_layer_type:
            types = decoder.config.layer_types[:count]
            tables = {t: decoder.rotary_emb(tokens, positions, t) for t in sorted(set(types))}
            rotary = tuple(tables[t] for t in types)
        else:
            rotary = (decoder.rotary_emb(tokens, positions),) * count
        masks = {w: additive_mask(length, w, tokens) for w in set(self.windows(model))}
        context = DecoderContext(
            positions, tuple(masks[w] for w in self.windows(model)), tuple(rotary)
        )
        return Embedded(tokens, context)

    def layer_inputs(self, embedded: Embedded, index: int) -> dict[str, Any]:
        """Layer ``index``'s mask and rotary cos/sin, and the positions."""
        context: DecoderContext = embedded.context
        return {
            "attention_mask": context.masks[index],
            "position_embeddings": context.rotary[index],
            "position_ids": context.positions,
        }

    def attention_inputs(self, embedded: Embedded, index: int) -> dict[str, Any]:
        """Layer ``index``'s mask and rotary cos/sin (a layer hands its attention no
        positions)."""
        context: DecoderContext = embedded.context
        return {
            "position_embeddings": context.rotary[index],
            "attention_mask": context.masks[index],
        }

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        v: torch.Tensor,
    ) -> torch.Tensor:
        """The MLP from its mapped stages: FC1's output is the concatenation [gate(v), up(v)]
        (docs/protocol.md, section 3.1), split in halves for ``act(gate) * up``."""
        gate, up = torch.cat([linear(v) for linear in fc1], dim=-1).chunk(2, dim=-1)
        hidden = getattr(block.mlp, self.activation)(gate) * up
        return torch.cat([linear(hidden) for linear in fc2], dim=-1)

    # --- other stages -------------------------------------------------------------------------

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        raise UndefinedStage(f"{self.title}: {DECODER_BOUNDS_REASON}")

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        return (
            f"{type(model).__name__} rotates queries and keys by their positions (rotary "
            "position embedding): the paper's MHA bound is stated for softmax(x A x^T) without "
            "rotary positions"
        )

    def lora_linears(self, block: nn.Module) -> Sequence[nn.Module]:
        """The attention's linear layers (``self_attn.{q,k,v,o}_proj``)."""
        return tuple(getattr(block.self_attn, name) for name in self.attention_linears)
