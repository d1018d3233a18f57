"""Architecture.train_flops_per_image: the training FLOPs of one image, against counts worked
by hand for a tiny ViT, on every device and whatever the model's trainable state."""

from __future__ import annotations

import pytest
import timm
import torch

from tests.helpers.flops import hand_count
from tests.helpers.tiny_models import TINY_MODELS
from vitplasticity.models.architectures import architecture_for
from vitplasticity.models.build import train_flops_per_image

# A tiny timm ViT: 32 px images in 8 px patches (16 patches + the class token), 48 wide,
# 2 blocks of 3 heads, MLP 4x.
KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 3}


def tiny_vit(device: str = "cpu") -> torch.nn.Module:
    with torch.device(device):
        return timm.create_model("vit_tiny_patch16_224", num_classes=0, **KWARGS)


def test_the_count_of_a_tiny_vit_is_the_hand_count() -> None:
    assert hand_count() == 6_562_944
    model = tiny_vit()
    images = torch.randn(1, 3, 32, 32)
    assert architecture_for(model).train_flops_per_image(model, images) == hand_count()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_the_count_is_per_image_and_the_same_on_every_device(device: str) -> None:
    """The CPU's fused attention kernel is invisible to the counter: the math kernel is used."""
    model = tiny_vit(device)
    images = torch.randn(3, 3, 32, 32, device=device)
    assert architecture_for(model).train_flops_per_image(model, images) == hand_count()


def test_frozen_parameters_are_counted_as_trained_and_left_frozen() -> None:
    model = tiny_vit()
    model.requires_grad_(False)
    model.blocks[1].mlp.fc2.requires_grad_(True)
    images = torch.randn(1, 3, 32, 32)
    assert architecture_for(model).train_flops_per_image(model, images) == hand_count()
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable == ["blocks.1.mlp.fc2.weight", "blocks.1.mlp.fc2.bias"]
    assert all(p.grad is None for p in model.parameters())


def test_a_timm_id_is_counted_on_the_meta_device_at_its_resolution() -> None:
    assert train_flops_per_image("vit_tiny_patch16_224", KWARGS) == hand_count()
    # ViT-B/16 at 224 px: 196 patches, 768 wide, 12 blocks, MLP 3072.
    base = hand_count(patches=196, width=768, depth=12, mlp=3072, patch=16)
    assert train_flops_per_image("vit_base_patch16_224") == base == 105_147_150_336
    # DINOv3 ViT-S/16 at its 256 px: 256 patches after a class and 4 register tokens (its
    # rotary positions and layer scales are elementwise: not counted).
    dinov3 = hand_count(patches=256, width=384, depth=12, mlp=1536, patch=16, prefix=5)
    assert train_flops_per_image("vit_small_patch16_dinov3") == dinov3


@pytest.mark.parametrize("tiny", [m for m in TINY_MODELS if m.timm_id], ids=lambda m: m.id)
def test_every_family_counts_on_meta_as_on_cpu(tiny) -> None:
    """Eva (rope, SwiGLU) and BEiT (relative position tables) too: the meta count, which the
    runtime estimate uses, is the CPU count."""
    model = tiny.build()
    images = tiny.inputs(1)
    cpu = architecture_for(model).train_flops_per_image(model, images)
    assert cpu > 0
    assert train_flops_per_image(tiny.timm_id, tiny.kwargs) == cpu
