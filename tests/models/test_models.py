"""Model building from config entries, and preprocessing from pretrained_cfg."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.helpers.tiny_vit import TINY_VIT_KWARGS
from vitplasticity.data.preprocessing import IMAGENET_MEAN
from vitplasticity.models.build import build_model, preprocessing
from vitplasticity.models.spec import ModelSpec, TimmSpec


def test_random_init_uses_kwargs(tiny_spec: TimmSpec) -> None:
    model = build_model(tiny_spec, num_classes=7)
    assert len(model.blocks) == 3 and model.embed_dim == 48 and model.head.out_features == 7
    pre = preprocessing(model, tiny_spec)
    assert pre.input_size == 32 and pre.mean == (0.5, 0.5, 0.5)  # vit_tiny's pretrained_cfg


def test_normalize_overrides() -> None:
    model = build_model(TimmSpec("vit_tiny_patch16_224", "random", kwargs=TINY_VIT_KWARGS))
    assert preprocessing(model, TimmSpec("x", normalize="imagenet")).mean == IMAGENET_MEAN
    custom = preprocessing(
        model, TimmSpec("x", normalize={"mean": [0.1, 0.2, 0.3], "std": [1, 1, 1]})
    )
    assert custom.mean == (0.1, 0.2, 0.3)
    assert preprocessing(model, TimmSpec("x", crop_pct=1.0)).resize_size == 32
    with pytest.raises(ValueError, match="normalize"):
        preprocessing(model, TimmSpec("x", normalize="cifar"))


def test_local_weights_file(tmp_path: Path, tiny_spec: TimmSpec) -> None:
    torch.manual_seed(1)
    source = build_model(tiny_spec, num_classes=0)
    path = tmp_path / "weights.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    loaded = build_model(
        TimmSpec(tiny_spec.timm_id, str(path), kwargs=TINY_VIT_KWARGS), num_classes=0
    )
    for name, tensor in source.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_bad_weights_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothere\.safetensors"):
        build_model(TimmSpec("vit_tiny_patch16_224", str(tmp_path / "nothere.safetensors")))
    with pytest.raises(ValueError, match="expected 'hub', 'random'"):
        build_model(TimmSpec("vit_tiny_patch16_224", "imagenet21k"))
    with pytest.raises(ValueError, match="unknown model keys"):
        ModelSpec.from_config({"timm_id": "x", "pretrained": True})


def test_random_backbone_is_the_same_in_every_job(tiny_spec: TimmSpec) -> None:
    """Plasticity, bounds and every finetuning run must see one backbone; heads follow the run seed."""
    torch.manual_seed(1)
    first = build_model(tiny_spec, num_classes=5)
    after_first = torch.rand(1)
    torch.manual_seed(2)
    second = build_model(tiny_spec, num_classes=5)
    without_head = build_model(tiny_spec, num_classes=0)
    for name, tensor in first.state_dict().items():
        if name.startswith("head."):
            continue
        assert torch.equal(tensor, second.state_dict()[name]), name
        assert torch.equal(tensor, without_head.state_dict()[name]), name
    assert not torch.equal(first.head.weight, second.head.weight)
    assert torch.equal(first.head.bias, torch.zeros(5))
    assert abs(float(first.head.weight.detach().std()) - 0.02) < 0.01
    # The head is drawn from the caller's RNG, which the backbone did not consume.
    torch.manual_seed(1)
    head = torch.nn.Linear(48, 5)  # reset_classifier's layer, then its timm init
    torch.nn.init.trunc_normal_(head.weight, std=0.02)
    assert torch.equal(head.weight, first.head.weight)
    assert torch.equal(torch.rand(1), after_first)
    other = build_model(TimmSpec(tiny_spec.timm_id, "random", init_seed=7, kwargs=TINY_VIT_KWARGS))
    assert not torch.equal(other.blocks[0].attn.qkv.weight, without_head.blocks[0].attn.qkv.weight)
