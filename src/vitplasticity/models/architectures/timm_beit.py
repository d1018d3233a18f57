"""timm ``Beit`` (BEiT, BEiT v2): relative position bias, LayerScale, q and v biases.

A block is ``x + gamma_1 * attn(norm1(x), shared_rel_pos_bias)`` then ``x + gamma_2 *
mlp(norm2(x))``. MHA is ``attn`` with everything inside it, its relative position bias table
and ``q_bias``/``v_bias`` included; the model-wide shared relative position bias
(``rel_pos_bias``, where the model has one) is declared, trained with MHA: it is a term of every
block's attention logits. ``gamma_1`` is trained with MHA, ``gamma_2`` with FC2.
"""

from __future__ import annotations

import torch
from torch import nn

from vitplasticity.models.architectures.base import Declared, Embedded, Owned
from vitplasticity.models.architectures.timm_common import TimmGammaFamily


class TimmBeit(TimmGammaFamily):
    """timm ``Beit`` with its pre-norm blocks."""

    name = "timm_beit"
    title = "timm Beit"
    model_class = ("timm.models.beit", "Beit")
    block_class = ("timm.models.beit", "Block")
    block_description = "a BEiT Block"

    def declared(self, model: nn.Module) -> list[Declared]:
        found = super().declared(model)
        if isinstance(getattr(model, "rel_pos_bias", None), nn.Module):
            found.append(
                Declared("shared_relative_position_bias", "mha", Owned((model.rel_pos_bias,)))
            )
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
