"""Shared fixtures: a tiny random-init timm ViT and a small prepared dataset."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitplasticity.models import ModelSpec, build_model

TINY_VIT_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 3, "num_heads": 3}
TINY_SPEC = ModelSpec(
    timm_id="vit_tiny_patch16_224", weights="random", normalize="pretrained", kwargs=TINY_VIT_KWARGS
)

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` are skipped, saying why, where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: needs a CUDA device, none is visible to torch")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def tiny_spec() -> ModelSpec:
    """The spec of a 3-block, 48-wide ViT at 32 px (16 patches + cls token)."""
    return TINY_SPEC


@pytest.fixture
def tiny_vit() -> torch.nn.Module:
    """A tiny random-init timm VisionTransformer in eval mode, seeded."""
    torch.manual_seed(0)
    return build_model(TINY_SPEC, num_classes=0).eval()


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic dataset (4 classes, 64 pool + 32 test images at 32 px) in the store."""
    from vitplasticity.data.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("store") / "demo-stripes"
    spec = {
        "style": "stripes",
        "num_classes": 4,
        "n_pool": 64,
        "n_test": 32,
        "image_size": 32,
        "seed": 1,
    }
    prepare_synthetic(out, "demo-stripes", spec)
    return out
