"""transformers ``SwinModel`` (Swin v1) and the classes around it (``SwinForImageClassification``,
``SwinForMaskedImageModeling``).

Stages ``encoder.layers.N``, each ``blocks`` then a ``downsample`` (``SwinPatchMerging``; none
after the last stage): the merging at the end of stage N runs before the first block of stage
N + 1. A block (``SwinLayer``, tokens (B, H W, C) with the grid (H, W) beside them) is ``x +
drop_path(windowed attention(layernorm_before(x)))`` then ``x + dropout(mlp(
layernorm_after(x)))``: LN1 is ``layernorm_before``, MHA ``attention`` (``SwinAttention``:
``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` and its ``relative_position_bias`` table), LN2
``layernorm_after``, FC1 ``mlp.fc1``, FC2 ``mlp.fc2``. Each ``downsample`` is declared
``patch_merging`` (trained by ``full`` alone); the embedding is ``embeddings`` (the patch
projection, its norm, absolute positions and the mask token where the model has them), the
head the final ``layernorm``, the pooler and what a task class adds (``classifier``,
``decoder``). Module names are transformers 5's (older releases named the attention's
projections ``attention.self.query``... : their blocks are refused, naming what they lack).
Swin V2 (``Swinv2Model``) is another class, which no family knows. See :mod:`.swin_common`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import Embedded
from vitplasticity.models.architectures.hf_vision import HFVisionTower
from vitplasticity.models.architectures.swin_common import Grid, SwinFamily, windowed_attention


class HFSwin(SwinFamily, HFVisionTower):
    """transformers ``SwinModel`` with its ``SwinLayer``s."""

    name = "hf_swin"
    title = "transformers SwinModel"
    towers = (("SwinModel", ""),)
    layer_classes = ("SwinLayer",)
    blocks_at = "encoder.layers"
    norm1, attention, norm2 = "layernorm_before", "attention", "layernorm_after"
    output_projection = "o_proj"
    head_parts = ("layernorm", "pooler")
    model_types = ("swin",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "SwinModel": ("SwinForImageClassification", "swin")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {"SwinModel": ("classifier.",)}

    def stages(self, model: nn.Module) -> list[tuple[nn.Module | None, list[nn.Module]]]:
        found: list[tuple[nn.Module | None, list[nn.Module]]] = []
        merge = None
        for stage in self.tower(model).get_submodule(self.blocks_at):
            found.append((merge, list(getattr(stage, "blocks", []))))
            merge = getattr(stage, "downsample", None)
        return found

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        try:
            return super().block_list(model)
        except AttributeError:  # no encoder.layers: blocks() names what the tower lacks
            return []

    def block_window(self, block: nn.Module) -> tuple[Grid, Grid]:
        # The block clamps its window to a smaller grid in its forward pass
        # (set_shift_and_window_size).
        grid = tuple(block.input_resolution)
        window = min(int(block.window_size), *grid)
        return grid, (window, window)

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # SwinModel.forward up to its encoder: patches (B, H W, C), normed, absolute positions
        # where the model has them; the pixels cast to the projection's dtype (ViT's way).
        embeddings = self.tower(model).embeddings
        weight = embeddings.patch_embeddings.projection.weight
        tokens, grid = embeddings(inputs.to(weight.dtype))
        return Embedded(tokens, self.layout(model, tuple(grid)))

    def merge(self, merge: nn.Module, tokens: torch.Tensor, grid: Grid) -> torch.Tensor:
        return merge(tokens, grid)

    def forward_block(self, block: nn.Module, tokens: torch.Tensor, grid: Grid) -> torch.Tensor:
        return block(tokens, grid)[0]  # (tokens, attention weights)

    def compose_swin_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        grid: Grid,
    ) -> torch.Tensor:
        (ln1,), (mha,), (ln2,), fc1, fc2 = (components[c] for c in components)
        block.set_shift_and_window_size(grid)  # as the block's forward does first
        window, shift = int(block.window_size), int(block.shift_size)
        b, _, c = tokens.shape

        def mask_for(padded: torch.Tensor) -> torch.Tensor | None:
            return block.get_attn_mask(*padded.shape[1:3], dtype=padded.dtype, device=padded.device)

        attended = windowed_attention(
            lambda windows, mask: block.dropout(mha(windows, mask)[0]),
            ln1(tokens).view(b, *grid, c),
            (window, window),
            (shift, shift),
            mask_for,
        )
        x = tokens + block.drop_path(attended.reshape(b, -1, c))
        return x + block.dropout(self.mlp(block, fc1, fc2, ln2(x)))
