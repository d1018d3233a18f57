"""timm ``VisionTransformer``: the paper's ViT-B/L/H, DeiT3, the CLIP and SigLIP towers, and
DINOv2 (LayerScale, register tokens).

A block is ``x + ls1(attn(norm1(x)))`` then ``x + ls2(mlp(norm2(x)))``: LN1 is ``norm1``, MHA
``attn`` (all of it: qkv, proj, and q/k norms where present), LN2 ``norm2``, FC1 ``mlp.fc1``
(``mlp.fc1_g`` + ``mlp.fc1_x`` for a SwiGLU), FC2 ``mlp.fc2``. LayerScale ``ls1`` is trained
with MHA and ``ls2`` with FC2: each scales that component's output channel-wise (it folds into
``attn.proj`` / ``mlp.fc2``). The embedding is ``patch_embed`` with the cls/register tokens
and the position embedding (and CLIP's ``norm_pre``); the head is the final norm(s), SigLIP's
attention pooling and the classifier.
"""

from __future__ import annotations

import torch
from torch import nn

from vitplasticity.models.architectures.base import Declared, Embedded, Owned
from vitplasticity.models.architectures.timm_common import TimmPreNormFamily, mlp_norm_declared


class TimmVisionTransformer(TimmPreNormFamily):
    """timm ``VisionTransformer`` with pre-norm ``Block``s."""

    name = "timm_vit"
    title = "timm VisionTransformer"
    model_class = ("timm.models.vision_transformer", "VisionTransformer")
    block_class = ("timm.models.vision_transformer", "Block")
    block_description = (
        "a pre-norm timm Block (post-norm and parallel blocks have no LN1/LN2 in the paper's sense)"
    )

    def declared(self, model: nn.Module) -> list[Declared]:
        found = []
        for index, block in enumerate(self.block_list(model)):
            found += [
                Declared("layer_scale_attn", "mha", Owned((block.ls1,)), index),
                Declared("layer_scale_mlp", "fc2", Owned((block.ls2,)), index),
                *mlp_norm_declared(block, index),
            ]
        return found

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # patch_drop and norm_pre are identities in the paper's models (norm_pre is CLIP's
        # ln_pre): the embedding output is what the first block receives.
        tokens = model._pos_embed(model.patch_embed(inputs))
        return Embedded(model.norm_pre(model.patch_drop(tokens)))  # (B, n, d)

    def attention_branch(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block.ls1(x)

    def mlp_branch(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return block.ls2(x)
