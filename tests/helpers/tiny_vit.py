"""The tiny random-init timm ViT most stage tests build: 3 blocks, 48 wide, 32 px images in
8 px patches (16 patches + the class token)."""

from __future__ import annotations

from vitplasticity.models.spec import TimmSpec

TINY_VIT_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 3, "num_heads": 3}
TINY_SPEC = TimmSpec(
    timm_id="vit_tiny_patch16_224", weights="random", normalize="pretrained", kwargs=TINY_VIT_KWARGS
)
