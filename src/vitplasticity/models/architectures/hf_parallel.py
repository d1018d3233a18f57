"""What transformers' decoders with parallel attention and MLP share (GPT-NeoX, Falcon): token-id
inputs, LayerNorm pre-norms, a fused ``query_key_value`` with rotary positions, a plain MLP
``dense_4h_to_h(act(dense_h_to_4h(v)))``, and a layer that runs its two branches either in
parallel or one after the other (docs/protocol.md, section 3.1; docs/architectures.md).

The convention for a parallel layer (two pre-norms, one per branch)::

    x + attn(ln_a(x)) + mlp(ln_b(x))      LN1 = ln_a, MHA = attn, LN2 = ln_b, FC1, FC2 the MLP's

LN1 is the attention's norm, LN2 the MLP's: the two norms of the paper's block, each before its
branch; only their input differs from a sequential block's (both read the layer's input x, not
LN2 the sum x + attn(...)). The in-situ protocol measures each component on the input it
receives in the layer, so LN1 and LN2 both see x there. A sequential layer (``x + attn(ln1(x))``
then ``+ mlp(ln2(.))``) is the usual pre-norm block. A layer with one norm feeding both branches
has no separate LN2 and is refused by the family (Falcon 7B's layout).

MHA is the whole attention module: the fused ``query_key_value`` (queries, keys and values as
row blocks of one weight, in the family's own order; trained, adapted by LoRA and exported
whole, as Phi3's ``qkv_proj``), its rotary positions and ``dense``. The embedding output and
what each layer gets beside it (a causal additive mask, the model's own rotary cos/sin at
positions 0..L-1) are built as the model's forward builds them
(:mod:`~vitplasticity.models.architectures.hf_decoder` for why the mask is explicit). A task
class around the bare model is accepted, its additions head. Matched by class name:
transformers is optional and not imported to answer "no".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures.base import (
    Architecture,
    AttentionWeights,
    Embedded,
    Owned,
    UndefinedStage,
    UnsupportedModel,
    bare_model_of,
    check_fc1_mode,
    wrapper_head,
)
from vitplasticity.models.architectures.hf_decoder import (
    DecoderContext,
    additive_mask,
    check_attention_implementation,
)

PARALLEL, SEQUENTIAL = "parallel", "sequential"
"""A layer's layouts: both branches on the layer's input, or the MLP after the attention."""

FC1_NAME, FC2_NAME, ACTIVATION = "dense_h_to_4h", "dense_4h_to_h", "act"
"""The MLP's linears and activation (in ``mlp``), the same in GPT-NeoX and Falcon."""

ATTENTION_LINEARS: tuple[str, ...] = ("query_key_value", "dense")
"""The attention's linears: the fused q/k/v and the output projection."""

_ROTARY = (
    "rotates queries and keys by their positions (rotary position embedding): the paper's MHA "
    "bound is stated for softmax(x A x^T) without rotary positions"
)


def _is_linear(module: nn.Module) -> bool:
    """A Linear (Falcon's ``FalconLinear`` is one), or peft's LoRA layer around one."""
    return isinstance(module, nn.Linear) or isinstance(
        getattr(module, "base_layer", None), nn.Linear
    )


class HFParallel(Architecture):
    """A transformers decoder whose layers run attention and MLP in parallel (or, configured
    so, one after the other). Subclasses name the model's parts and say each layer's layout
    and norms (:meth:`layout`, :meth:`norm_names`)."""

    inputs = "tokens"
    bare_class: str = ""
    """The bare model's class name (``GPTNeoXModel``)."""
    embedding_name: str = ""
    """The bare model's token embedding."""
    layers_name: str = ""
    """The bare model's list of layers."""
    final_norm_name: str = ""
    """The bare model's norm after the last layer."""
    attention_name: str = ""
    """A layer's attention module."""

    # --- what it is ---------------------------------------------------------------------------

    def _bare(self, model: nn.Module) -> nn.Module | None:
        return bare_model_of(model, (self.bare_class,))

    def decoder(self, model: nn.Module) -> nn.Module:
        """The bare model: ``model`` itself, or the one its task class holds.

        Raises:
            UnsupportedModel: when ``model`` is neither.
        """
        found = self._bare(model)
        if found is None:
            raise UnsupportedModel(f"{type(model).__name__} is not a {self.bare_class}")
        return found

    def matches(self, model: nn.Module) -> bool:
        return self._bare(model) is not None

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(getattr(self.decoder(model), self.layers_name, []))

    def layout(self, block: nn.Module) -> str:
        """:data:`PARALLEL` or :data:`SEQUENTIAL`, as the layer's forward runs.

        Raises:
            UnsupportedModel: for a layout with no LN1 and LN2 in the paper's sense.
        """
        raise NotImplementedError

    def norm_names(self, block: nn.Module) -> tuple[str, str]:
        """The layer's norm before the attention (LN1) and before the MLP (LN2)."""
        raise NotImplementedError

    def check_config(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming a setting of the model's config the family
        cannot account for (the default: none)."""

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming what the model has unlike the family."""
        decoder, name = self.decoder(model), type(model).__name__
        parts = (self.embedding_name, self.layers_name, self.final_norm_name, "rotary_emb")
        missing = [part for part in parts if not hasattr(decoder, part)]
        if missing:
            raise UnsupportedModel(f"{name} is not a {self.title}: it lacks {missing}")
        check_attention_implementation(name, decoder.config)
        self.check_config(model)

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        layer = f"layer {index} ({type(block).__name__}) of {type(model).__name__}"
        self.layout(block)  # refuses a layer without two norms
        linears = [
            *(f"{self.attention_name}.{n}" for n in ATTENTION_LINEARS),
            *(f"mlp.{n}" for n in (FC1_NAME, FC2_NAME)),
        ]
        modules = dict(block.named_modules())
        missing = [n for n in [*self.norm_names(block), *linears] if n not in modules]
        if missing:
            raise UnsupportedModel(f"{layer} is not a {self.title} layer: it lacks {missing}")
        not_linear = [n for n in linears if not _is_linear(modules[n])]
        if not_linear or not hasattr(block.mlp, ACTIVATION):
            raise UnsupportedModel(
                f"{layer}: expected Linear {not_linear or linears} and an MLP activation "
                f"{ACTIVATION}"
            )
        width = modules[self.norm_names(block)[0]].weight.shape[0]
        fc2 = modules[f"mlp.{FC2_NAME}"]
        if fc2.in_features < width:
            raise UnsupportedModel(
                f"{layer}: {FC2_NAME} takes {fc2.in_features} features, fewer than the {width} "
                "of a token: the zero-padded FC2 input is undefined"
            )
        super().check_block(block, index, model)

    # --- which parameters are whose -----------------------------------------------------------

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        # A plain MLP: its first linear stage is the up projection, in either fc1 mode.
        check_fc1_mode(fc1)
        ln1, ln2 = self.norm_names(block)
        return {
            "ln1": (getattr(block, ln1),),
            "mha": (getattr(block, self.attention_name),),
            "ln2": (getattr(block, ln2),),
            "fc1": (getattr(block.mlp, FC1_NAME),),
            "fc2": (getattr(block.mlp, FC2_NAME),),
        }

    def embedding(self, model: nn.Module) -> Owned:
        return Owned((getattr(self.decoder(model), self.embedding_name),))

    def head(self, model: nn.Module) -> Owned:
        """The final norm, and what a task class adds (an untied ``lm_head``, ``score``,
        ``classifier``, ``qa_outputs``)."""
        decoder = self.decoder(model)
        return Owned((getattr(decoder, self.final_norm_name), *wrapper_head(model, decoder)))

    # --- how it runs --------------------------------------------------------------------------

    def embedded_tokens(self, decoder: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """What the model's forward feeds its first layer (the default: the token embedding)."""
        return getattr(decoder, self.embedding_name)(inputs)

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """The embedding output and what every layer gets beside it: the causal mask and the
        model's own rotary cos/sin at positions 0..L-1.

        Raises:
            ValueError: for sequences longer than the model's ``max_position_embeddings``.
        """
        decoder = self.decoder(model)
        length, limit = inputs.shape[1], decoder.config.max_position_embeddings
        if length > limit:
            raise ValueError(f"sequences of {length} tokens exceed the model's {limit} positions")
        tokens = self.embedded_tokens(decoder, inputs)  # (B, L, d)
        positions = torch.arange(length, device=inputs.device)[None]  # (1, L)
        count = len(self.block_list(model))
        rotary = decoder.rotary_emb(tokens, positions)
        mask = additive_mask(length, None, tokens)
        return Embedded(tokens, DecoderContext(positions, (mask,) * count, (rotary,) * count))

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        context: DecoderContext = embedded.context
        return attention(
            hidden_states=tokens,
            attention_mask=context.masks[index],
            position_ids=context.positions,
            position_embeddings=context.rotary[index],
        )[0]  # (output, weights)

    def hook_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]

    def hook_output(self, output: Any) -> torch.Tensor:
        return output[0] if isinstance(output, tuple) else output  # attn: (output, weights)

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        context: DecoderContext = embedded.context
        out = block(
            tokens,
            attention_mask=context.masks[index],
            position_ids=context.positions,
            position_embeddings=context.rotary[index],
        )
        return out[0] if isinstance(out, tuple) else out

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        (up,), (down,) = fc1, fc2
        return down(getattr(block.mlp, ACTIVATION)(up(x)))

    def parallel_sum(
        self, block: nn.Module, attention: torch.Tensor, mlp: torch.Tensor
    ) -> torch.Tensor:
        """What a parallel layer adds to its input from its two branches' outputs (the default:
        each branch as :meth:`attention_branch` and :meth:`mlp_branch` leave it, summed)."""
        return self.attention_branch(block, attention) + self.mlp_branch(block, mlp)

    def compose_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        """A parallel layer ``x + parallel_sum(attn(ln1(x)), mlp(ln2(x)))``, both norms on the
        layer's input; a sequential one the pre-norm block (:meth:`Architecture.compose_block`)."""
        if self.layout(block) == SEQUENTIAL:
            return super().compose_block(block, components, tokens, embedded, index)
        (ln1,), (mha,), (ln2,), fc1, fc2 = (components[c] for c in COMPONENTS)
        attention = self.attend(mha, ln1(tokens), embedded, index)
        return tokens + self.parallel_sum(block, attention, self.mlp(block, fc1, fc2, ln2(tokens)))

    # --- other stages -------------------------------------------------------------------------

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        raise UndefinedStage(f"{self.title}: the MHA bound is not defined: it {_ROTARY}")

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        return f"{type(model).__name__} {_ROTARY}"
