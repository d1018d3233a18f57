"""transformers ``BeitModel`` (BEiT, BEiT v2 checkpoints): ViT's module names, with layer
scale and optional relative position biases (docs/protocol.md, section 3.1).

A block is ``x + drop_path(lambda_1 * attention(layernorm_before(x), bias))`` then ``x +
drop_path(lambda_2 * mlp(layernorm_after(x)))``; LN1, MHA, LN2, FC1, FC2 are
``layernorm_before``, ``attention`` (q/k/v/o projections), ``layernorm_after``, ``mlp.fc1``,
``mlp.fc2``. As for timm's Beit (``timm_beit``): ``lambda_1`` is trained with MHA,
``lambda_2`` with FC2 (plain floats, nothing to train, when ``layer_scale_init_value`` is 0);
a block's relative position bias (``use_relative_position_bias``: the block's
``relative_position_bias`` table, added to its attention logits) and the model-wide one
(``use_shared_relative_position_bias``: ``shared_position_bias``, added to every block's) are
declared and trained with MHA. MHA is the attention with the bias its block adds: the
embedding protocol feeds each block's attention the embedding with that block's bias, and the
paper's MHA bound, stated for ``softmax(x A x^T)`` without a bias, is refused for a model that
has one. The embedding is ``embeddings`` (patches, cls and mask tokens, absolute positions where
the model has them); the head is the final ``layernorm`` (an identity with mean pooling), the
``pooler`` (mean pooling and its norm) and what a wrapper class adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import Declared, Embedded, Owned
from vitplasticity.models.architectures.hf_vision import HFVisionTower


@dataclass(frozen=True)
class BeitContext:
    """What every BEiT block gets beside the tokens: the image resolution (the blocks size
    their relative bias from it), the model-wide bias, and per block the whole bias its
    attention adds to its logits (the block's own plus the model-wide one; None: none)."""

    resolution: tuple[int, int]
    shared: torch.Tensor | None
    biases: tuple[torch.Tensor | None, ...]


def _sum(*terms: torch.Tensor | None) -> torch.Tensor | None:
    present = [term for term in terms if term is not None]
    return sum(present[1:], present[0]) if present else None


class HFBeit(HFVisionTower):
    """transformers ``BeitModel`` (and ``BeitForImageClassification``,
    ``BeitForMaskedImageModeling``)."""

    name = "hf_beit"
    title = "transformers BeitModel"
    towers = (("BeitModel", ""),)
    layer_classes = ("BeitLayer",)
    blocks_at = "layers"
    norm1, attention, norm2 = "layernorm_before", "attention", "layernorm_after"
    output_projection = "o_proj"
    head_parts = ("layernorm", "pooler")
    model_types = ("beit",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "BeitModel": ("BeitForImageClassification", "beit")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {"BeitModel": ("classifier.",)}

    def declared(self, model: nn.Module) -> list[Declared]:
        found = []
        for index, block in enumerate(self.block_list(model)):
            for label, trained_by, scale in (
                ("layer_scale_attn", "mha", block.lambda_1),
                ("layer_scale_mlp", "fc2", block.lambda_2),
            ):
                if isinstance(scale, nn.Parameter):
                    found.append(Declared(label, trained_by, Owned(parameters=(scale,)), index))
            if block.relative_position_bias is not None:
                owned = Owned((block.relative_position_bias,))
                found.append(Declared("relative_position_bias", "mha", owned, index))
        shared = self.tower(model).shared_position_bias
        if shared is not None:
            found.append(Declared("shared_relative_position_bias", "mha", Owned((shared,))))
        return found

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # BeitModel.forward up to its blocks: patches, cls token, absolute positions where the
        # model has them, dropout; the relative biases sized for the patch grid.
        tower = self.tower(model)
        tokens = tower.embeddings(inputs)  # (B, 1 + patches, d)
        height, width = inputs.shape[2:]
        window = (height // tower.config.patch_size, width // tower.config.patch_size)

        def bias(table: nn.Module | None) -> torch.Tensor | None:
            return None if table is None else table(window, dim_size=tokens.shape[1])

        shared = bias(tower.shared_position_bias)  # (1, heads, n, n) or None
        biases = tuple(
            _sum(shared, bias(block.relative_position_bias)) for block in self.block_list(model)
        )
        return Embedded(tokens, BeitContext((height, width), shared, biases))

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, attention_mask=embedded.context.biases[index])[0]

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        context: BeitContext = embedded.context
        return block(tokens, attention_mask=context.shared, resolution=context.resolution)

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.drop_path(block.lambda_1 * block.dropout(out))

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.drop_path(block.lambda_2 * block.dropout(out))

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        relative = self.tower(model).shared_position_bias is not None or any(
            block.relative_position_bias is not None for block in self.block_list(model)
        )
        if relative:
            return (
                f"{type(model).__name__} adds a learned relative position bias to the attention "
                "logits: the paper's MHA bound is stated for softmax(x A x^T) without it"
            )
        return None
