"""One tiny random-init model per architecture family and variant, built offline (timm with
small kwargs; transformers from its config class), for the contract test and the stages."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TinyModel:
    """A tiny model of one family: how to build it and a batch of its inputs."""

    id: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int], torch.Tensor]
    timm_id: str | None = None
    kwargs: dict | None = None


def _timm(timm_id: str, family: str, image: int = 32, **kwargs) -> TinyModel:
    import timm

    kwargs = {"img_size": image, "embed_dim": 48, "depth": 2, "num_heads": 3, **kwargs}

    def build() -> nn.Module:
        torch.manual_seed(0)
        return timm.create_model(timm_id, pretrained=False, num_classes=5, **kwargs)

    def inputs(n: int) -> torch.Tensor:
        return torch.randn(n, 3, image, image, generator=torch.Generator().manual_seed(n))

    return TinyModel(timm_id, family, build, inputs, timm_id, kwargs)


TINY_MODELS: list[TinyModel] = [
    _timm("vit_tiny_patch16_224", "timm_vit", patch_size=8),
    _timm("deit3_small_patch16_224", "timm_vit", patch_size=8),
    _timm("vit_base_patch16_clip_224", "timm_vit", patch_size=8),
    _timm("vit_base_patch16_siglip_224", "timm_vit", patch_size=8),
    _timm("vit_small_patch14_reg4_dinov2", "timm_vit", image=28, patch_size=7),
    _timm("vit_small_patch16_dinov3", "timm_eva"),
    _timm("vit_small_plus_patch16_dinov3", "timm_eva"),
    _timm("vit_small_patch16_dinov3_qkvb", "timm_eva"),
    _timm("eva02_tiny_patch14_224", "timm_eva", image=28),
    _timm("vit_base_patch16_rope_reg1_gap_256", "timm_eva"),
    _timm("vit_base_patch16_rope_mixed_224", "timm_eva"),
    _timm("beit_base_patch16_224", "timm_beit"),
    _timm("beitv2_base_patch16_224", "timm_beit"),
]
"""Every family's tiny models; each family has at least one (tests/test_architectures.py)."""


def perturbed(model: nn.Module, seed: int = 0) -> nn.Module:
    """float64, eval, every parameter moved far from its init (norm gains around 1, biases and
    layer scales off zero), so that a swapped or missing module shows in the numbers."""
    model = model.double().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if parameter.ndim == 1:
                parameter.copy_(1.0 + 0.5 * noise)
            else:
                parameter.add_(0.1 * noise)
    return model
