"""timm ``SwinTransformer`` (Swin v1: swin_tiny ... swin_large, S3/AutoFormerV2).

Stages ``layers.N``, each a ``downsample`` (``PatchMerging``; an identity in the first stage)
then ``blocks``. A block (``SwinTransformerBlock``, tokens (B, H, W, C)) is ``x +
drop_path1(windowed attn(norm1(x)))`` then ``x + drop_path2(mlp(norm2(x)))``: LN1 is
``norm1``, MHA ``attn`` (``WindowAttention``: ``qkv``, ``proj`` and its
``relative_position_bias_table``), LN2 ``norm2``, FC1 ``mlp.fc1``, FC2 ``mlp.fc2``. Each
stage's ``downsample`` is declared ``patch_merging`` (trained by ``full`` alone); the embedding
is ``patch_embed`` (its projection and norm), the head the final ``norm`` and ``head``.
Swin V2 (``SwinTransformerV2``: cosine attention with a logit scale, post-norm blocks) is
another class, which no family knows. See :mod:`.swin_common`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitplasticity.models.architectures.base import Embedded
from vitplasticity.models.architectures.swin_common import Grid, SwinFamily, windowed_attention
from vitplasticity.models.architectures.timm_common import TimmPreNormFamily


class TimmSwin(SwinFamily, TimmPreNormFamily):
    """timm ``SwinTransformer`` with its ``SwinTransformerBlock``s."""

    name = "timm_swin"
    title = "timm SwinTransformer"
    model_class = ("timm.models.swin_transformer", "SwinTransformer")
    block_class = ("timm.models.swin_transformer", "SwinTransformerBlock")
    block_description = "a Swin v1 SwinTransformerBlock"

    def stages(self, model: nn.Module) -> list[tuple[nn.Module | None, list[nn.Module]]]:
        found = []
        for stage in getattr(model, "layers", []):
            merge = getattr(stage, "downsample", None)
            merge = None if merge is None or isinstance(merge, nn.Identity) else merge
            found.append((merge, list(getattr(stage, "blocks", []))))
        return found

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return SwinFamily.block_list(self, model)

    def block_window(self, block: nn.Module) -> tuple[Grid, Grid]:
        # timm clamps the window to a smaller grid when it builds the block.
        return tuple(block.input_resolution), tuple(block.window_size)

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # SwinTransformer.forward_features up to its stages: patches (B, H, W, C), normed.
        tokens = model.patch_embed(inputs)
        return Embedded(tokens, self.layout(model, tuple(tokens.shape[1:3])))

    def merge(self, merge: nn.Module, tokens: torch.Tensor, grid: Grid) -> torch.Tensor:
        return merge(tokens)

    def forward_block(self, block: nn.Module, tokens: torch.Tensor, grid: Grid) -> torch.Tensor:
        return block(tokens)

    def compose_swin_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        grid: Grid,
    ) -> torch.Tensor:
        (ln1,), (mha,), (ln2,), fc1, fc2 = (components[c] for c in components)

        def mask_for(padded: torch.Tensor) -> torch.Tensor | None:
            # A model built for any image size (dynamic_mask) makes the mask per grid.
            if getattr(block, "dynamic_mask", False):
                return block.get_attn_mask(padded)
            return block.attn_mask

        b, h, w, c = tokens.shape
        attended = windowed_attention(
            lambda windows, mask: mha(windows, mask=mask),
            ln1(tokens),
            tuple(block.window_size),
            tuple(block.shift_size),
            mask_for,
        )
        x = (tokens + block.drop_path1(attended)).reshape(b, -1, c)
        x = x + block.drop_path2(self.mlp(block, fc1, fc2, ln2(x)))
        return x.reshape(b, h, w, c)
