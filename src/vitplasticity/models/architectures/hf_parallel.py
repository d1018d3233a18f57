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

from typing import Any

import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures.base import (
    AttentionWeights,
    Embedded,
    UndefinedStage,
    check_fc1_mode,
)
from vitplasticity.models.architectures.hf_decoder import (
    DecoderContext,
    check_attention_implementation,
)
from vitplasticity.models.architectures.hf_text_common import (
    HFText,
    additive_mask,
    check_fc2_width,
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


class HFParallel(HFText):
    """A transformers decoder whose layers run attention and MLP in parallel (or, configured
    so, one after the other). Subclasses name the model's parts (its bare class, token
    embedding, layers, final norm, a layer's attention) and say each layer's layout and norms
    (:meth:`layout`, :meth:`norm_names`)."""

    model_parts = ("rotary_emb",)
    attention_name: str = ""
    """A layer's attention module."""

    # --- what it is ---------------------------------------------------------------------------

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
        """Raise :class:`UnsupportedModel` naming what the model has unlike the family (a part
        it lacks, an attention implementation the explicit mask is not exact for, a setting of
        its config)."""
        super().check_model(model)
        check_attention_implementation(type(model).__name__, self.bare(model).config)
        self.check_config(model)

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        layer = f"layer {index} ({type(block).__name__}) of {type(model).__name__}"
        self.layout(block)  # refuses a layer without two norms
        linears = [
            *(f"{self.attention_name}.{n}" for n in ATTENTION_LINEARS),
            *(f"mlp.{n}" for n in (FC1_NAME, FC2_NAME)),
        ]
        modules = self.check_layer_modules(
            block, layer, self.norm_names(block), linears, ACTIVATION
        )
        width = modules[self.norm_names(block)[0]].weight.shape[0]
        check_fc2_width(layer, FC2_NAME, modules[f"mlp.{FC2_NAME}"].in_features, width)
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

    # --- how it runs --------------------------------------------------------------------------

    def embedded_tokens(self, decoder: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """What the model's forward feeds its first layer (the default: the token embedding)."""
        (token_embedding,) = self.embedding_names
        return getattr(decoder, token_embedding)(inputs)

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """The embedding output and what every layer gets beside it: the causal mask and the
        model's own rotary cos/sin at positions 0..L-1.

        Raises:
            ValueError: for sequences longer than the model's ``max_position_embeddings``.
        """
        decoder = self.bare(model)
        length, limit = inputs.shape[1], decoder.config.max_position_embeddings
        if length > limit:
            raise ValueError(f"sequences of {length} tokens exceed the model's {limit} positions")
        tokens = self.embedded_tokens(decoder, inputs)  # (B, L, d)
        positions = torch.arange(length, device=inputs.device)[None]  # (1, L)
        count = len(self.block_list(model))
        rotary = decoder.rotary_emb(tokens, positions)
        mask = additive_mask(length, None, tokens)
        return Embedded(tokens, DecoderContext(positions, (mask,) * count, (rotary,) * count))

    def layer_inputs(self, embedded: Embedded, index: int) -> dict[str, Any]:
        """Layer ``index``'s mask, the positions and its rotary cos/sin (a layer's and its
        attention's)."""
        context: DecoderContext = embedded.context
        return {
            "attention_mask": context.masks[index],
            "position_ids": context.positions,
            "position_embeddings": context.rotary[index],
        }

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
