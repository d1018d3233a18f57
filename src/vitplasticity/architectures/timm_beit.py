"""timm ``Beit`` (BEiT, BEiT v2): relative position bias, LayerScale, q and v biases.

A block is ``x + gamma_1 * attn(norm1(x), shared_rel_pos_bias)`` then ``x + gamma_2 *
mlp(norm2(x))``. MHA is ``attn`` with everything inside it, its relative position bias table
and ``q_bias``/``v_bias`` included; the model-wide shared relative position bias
(``rel_pos_bias``, where the model has one) is declared, trained with MHA: it is a term of every
block's attention logits. ``gamma_1`` is trained with MHA, ``gamma_2`` with FC2.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitplasticity.architectures.base import (
    Architecture,
    AttentionWeights,
    Declared,
    Embedded,
    Owned,
    UnsupportedModel,
)
from vitplasticity.architectures.timm_common import (
    fused_attention_weights,
    mlp_fc1,
    mlp_from_parts,
    mlp_norm_declared,
    timm_embedding,
    timm_head,
)
from vitplasticity.architectures.timm_eva import _layer_scale, _scaled


class TimmBeit(Architecture):
    """timm ``Beit`` with its pre-norm blocks."""

    name = "timm_beit"
    title = "timm Beit"

    def matches(self, model: nn.Module) -> bool:
        from timm.models.beit import Beit

        return isinstance(model, Beit)

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(getattr(model, "blocks", []))

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        from timm.models.beit import Block

        if type(block) is not Block:
            raise UnsupportedModel(
                f"block {index} of {type(model).__name__} is a {type(block).__name__}, not a "
                "BEiT Block"
            )
        super().check_block(block, index, model)

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        return {
            "ln1": (block.norm1,),
            "mha": (block.attn,),
            "ln2": (block.norm2,),
            "fc1": mlp_fc1(block.mlp, fc1),
            "fc2": (block.mlp.fc2,),
        }

    def embedding(self, model: nn.Module) -> Owned:
        return timm_embedding(model)

    def head(self, model: nn.Module) -> Owned:
        return timm_head(model)

    def declared(self, model: nn.Module) -> list[Declared]:
        found = []
        if isinstance(getattr(model, "rel_pos_bias", None), nn.Module):
            found.append(
                Declared("shared_relative_position_bias", "mha", Owned((model.rel_pos_bias,)))
            )
        for index, block in enumerate(self.block_list(model)):
            found += _layer_scale(block, index) + mlp_norm_declared(block, index)
        return found

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # Beit.forward_features up to its blocks: patches, cls token, absolute positions
        # where the model has them; the shared relative position bias goes to every block.
        x = model.patch_embed(inputs)
        x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        if model.pos_embed is not None:
            x = x + model.pos_embed
        shared = model.rel_pos_bias() if model.rel_pos_bias is not None else None
        return Embedded(model.pos_drop(x), shared)

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, shared_rel_pos_bias=embedded.context)

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        return block(tokens, shared_rel_pos_bias=embedded.context)

    def compose_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        (ln1,), (mha,), (ln2,), fc1, (fc2,) = components.values()
        x = tokens + _scaled(block.gamma_1, self.attend(mha, ln1(tokens), embedded, index))
        return x + _scaled(block.gamma_2, mlp_from_parts(block.mlp, fc1, fc2, ln2(x)))

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        relative = getattr(model, "rel_pos_bias", None) is not None or any(
            getattr(block.attn, "relative_position_bias_table", None) is not None
            for block in self.block_list(model)
        )
        if relative:
            return (
                f"{type(model).__name__} adds a learned relative position bias to the attention "
                "logits: the paper's MHA bound is stated for softmax(x A x^T) without it"
            )
        return None

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        return fused_attention_weights(attention)
