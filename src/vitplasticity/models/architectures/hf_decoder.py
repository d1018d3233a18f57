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
    Architecture,
    AttentionWeights,
    Embedded,
    Owned,
    UndefinedStage,
    UnsupportedModel,
    base_model_of,
    check_fc1_mode,
    wrapper_head,
)

ATTENTION_IMPLEMENTATIONS: tuple[str, ...] = ("eager", "sdpa")
"""The attention implementations an explicit float mask is exact for (flash and flex attention
take no additive mask)."""

MODEL_PARTS: tuple[str, ...] = ("embed_tokens", "layers", "norm", "rotary_emb")
"""What a bare decoder model holds: token embedding, layers, final norm, rotary embedding."""

ATTENTION_LINEARS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

_BOUNDS_REASON = (
    "the paper's bounds are stated for LayerNorm (RMSNorm does not centre) and for attention "
    "without rotary positions (these models rotate queries and keys by position)"
)

_REFUSALS: dict[str, str] = {
    "bounds": _BOUNDS_REASON,
}
"""The stages a decoder language model is refused by, and why (plasticity, lora, finetune and
recommend on text, ``vitplasticity finetune-text`` and ``recommend-text``, are supported)."""


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


def _is_linear(module: nn.Module) -> bool:
    """A Linear, or peft's LoRA layer around one (its ``base_layer``)."""
    return isinstance(module, nn.Linear) or isinstance(
        getattr(module, "base_layer", None), nn.Linear
    )


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


def _class_names(model: nn.Module) -> list[str]:
    return [cls.__name__ for cls in type(model).__mro__]


def additive_mask(length: int, window: int | None, tokens: torch.Tensor) -> torch.Tensor:
    """Additive mask (1, 1, L, L): 0 where query i may see key j (j <= i, and i - j < window
    for a sliding window, as transformers' ``sliding_window_overlay``), the dtype's min
    elsewhere."""
    query = torch.arange(length, device=tokens.device)[:, None]
    key = torch.arange(length, device=tokens.device)[None, :]
    blocked = key > query
    if window is not None:
        blocked |= key <= query - window
    mask = torch.zeros(length, length, dtype=tokens.dtype, device=tokens.device)
    return mask.masked_fill(blocked, torch.finfo(tokens.dtype).min)[None, None]


class HFDecoder(Architecture):
    """A transformers decoder-only language model with RMSNorm, rotary positions and a gated
    MLP. Subclasses set :attr:`variants` and :attr:`ln2_name` (and :attr:`ln1_name` where it is
    not ``input_layernorm``), and override :meth:`compose_block` where the layer is not the
    pre-norm block (OLMo2)."""

    inputs = "tokens"
    variants: ClassVar[dict[str, Variant]] = {}
    """The bare model classes of the family, by class name."""
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

    def _bare(self, model: nn.Module) -> tuple[nn.Module, Variant] | None:
        """The bare decoder model that ``model`` is or wraps (a task class's base model) and its
        variant; None when ``model`` is not of the family."""
        for candidate in (model, base_model_of(model)):
            if candidate is None:
                continue
            for name in _class_names(candidate):
                if name in self.variants:
                    return candidate, self.variants[name]
        return None

    def decoder(self, model: nn.Module) -> tuple[nn.Module, Variant]:
        """The bare decoder model and its variant.

        Raises:
            UnsupportedModel: when ``model`` is not of this family.
        """
        found = self._bare(model)
        if found is None:
            raise UnsupportedModel(f"{type(model).__name__} is not a {self.title}")
        return found

    def matches(self, model: nn.Module) -> bool:
        return self._bare(model) is not None

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        decoder, _ = self.decoder(model)
        # The model's forward runs layers[:num_hidden_layers]; so do the stages.
        return list(decoder.layers[: decoder.config.num_hidden_layers])

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming what the model has unlike the family."""
        decoder, _ = self.decoder(model)
        name = type(model).__name__
        missing = [part for part in MODEL_PARTS if not hasattr(decoder, part)]
        if missing:
            raise UnsupportedModel(f"{name} is not a {self.title}: it lacks {missing}")
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
        modules = dict(block.named_modules())
        missing = [name for name in [self.ln1_name, self.ln2_name, *linears] if name not in modules]
        if missing:
            raise UnsupportedModel(f"{layer} is not a {self.title} layer: it lacks {missing}")
        not_linear = [name for name in linears if not _is_linear(modules[name])]
        if not_linear or not hasattr(block.mlp, self.activation):
            raise UnsupportedModel(
                f"{layer}: expected Linear {not_linear or linears} and an MLP activation "
                f"{self.activation}"
            )
        width = getattr(block, self.ln1_name).weight.shape[0]
        if block.mlp.down_proj.in_features < width:
            raise UnsupportedModel(
                f"{layer}: down_proj takes {block.mlp.down_proj.in_features} features, fewer than "
                f"the {width} of a token: the zero-padded FC2 input is undefined"
            )
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

    def embedding(self, model: nn.Module) -> Owned:
        decoder, _ = self.decoder(model)
        return Owned((decoder.embed_tokens,))

    def head(self, model: nn.Module) -> Owned:
        """The final norm, and what a task class adds: a causal LM's ``lm_head`` unless it is
        tied to the token embedding (its weight is then the embedding's, trained by ``emb``),
        a classifier's ``score``."""
        decoder, _ = self.decoder(model)
        return Owned((decoder.norm, *wrapper_head(model, decoder)))

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

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        context: DecoderContext = embedded.context
        return attention(
            hidden_states=tokens,
            position_embeddings=context.rotary[index],
            attention_mask=context.masks[index],
        )[0]  # (output, weights)

    def hook_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]  # self_attn(hidden_states=...)

    def hook_output(self, output: Any) -> torch.Tensor:
        return output[0] if isinstance(output, tuple) else output  # attn: (output, weights)

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        context: DecoderContext = embedded.context
        out = block(
            tokens,
            attention_mask=context.masks[index],
            position_embeddings=context.rotary[index],
            position_ids=context.positions,
        )
        return out[0] if isinstance(out, tuple) else out

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
        raise UndefinedStage(f"{self.title}: {_BOUNDS_REASON}")

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        return (
            f"{type(model).__name__} rotates queries and keys by their positions (rotary "
            "position embedding): the paper's MHA bound is stated for softmax(x A x^T) without "
            "rotary positions"
        )

    def lora_targets(self, model: nn.Module) -> list[str]:
        """The attention's linear layers in every layer (``self_attn.{q,k,v,o}_proj``; fully
        qualified names)."""
        targets = {
            id(getattr(block.self_attn, name))
            for block in self.block_list(model)
            for name in self.attention_linears
        }
        return [name for name, module in model.named_modules() if id(module) in targets]

    def refusal(self, stage: str, model: nn.Module) -> str | None:
        reason = _REFUSALS.get(stage)
        return None if reason is None else f"{type(model).__name__} is a text model: {reason}"
