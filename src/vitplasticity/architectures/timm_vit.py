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


class TimmVisionTransformer(Architecture):
    """timm ``VisionTransformer`` with pre-norm ``Block``s."""

    name = "timm_vit"
    title = "timm VisionTransformer"

    def matches(self, model: nn.Module) -> bool:
        from timm.models.vision_transformer import VisionTransformer

        return isinstance(model, VisionTransformer)

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(getattr(model, "blocks", []))

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        from timm.models.vision_transformer import Block

        if type(block) is not Block:
            raise UnsupportedModel(
                f"block {index} of {type(model).__name__} is a {type(block).__name__}, not a "
                "pre-norm timm Block (post-norm and parallel blocks have no LN1/LN2 in the "
                "paper's sense)"
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

    def compose_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        (ln1,), (mha,), (ln2,), fc1, (fc2,) = components.values()
        x = tokens + block.ls1(self.attend(mha, ln1(tokens), embedded, index))
        return x + block.ls2(mlp_from_parts(block.mlp, fc1, fc2, ln2(x)))

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        return fused_attention_weights(attention)
