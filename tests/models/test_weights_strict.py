"""Weights files load strictly: a checkpoint that is not the model's is an error naming the file.

Before, ``build_model`` handed the file to ``timm.create_model(pretrained=True)``, which drops
the classifier when the class count differs and then loads with ``strict=False``, only
logging the missing keys: a transformers ViT or CLIP file, or a timm file short of a block,
left (part of) the backbone a random init, and the run's provenance recorded the file's
sha256 as if it had been used.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import save_file

from tests.helpers.tiny_models import TINY_MODELS, TinyModel
from tests.helpers.tiny_vit import TINY_VIT_KWARGS
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import TimmSpec

TIMM_ID = "vit_tiny_patch16_224"
# The transformers twin of TINY_VIT_KWARGS: 3 blocks, 48 wide, 3 heads, 32 px, 8 px patches.
HF_TINY = {
    "hidden_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 3,
    "intermediate_size": 192,
    "image_size": 32,
    "patch_size": 8,
}


def timm_state(seed: int = 3, num_classes: int = 1000, **kwargs) -> dict[str, torch.Tensor]:
    """A tiny timm ViT's state dict, with a 1000-class head like a hub in1k checkpoint."""
    torch.manual_seed(seed)
    model = timm.create_model(TIMM_ID, num_classes=num_classes, **{**TINY_VIT_KWARGS, **kwargs})
    return {key: value.contiguous() for key, value in model.state_dict().items()}


def save(state: dict[str, torch.Tensor], path: Path) -> Path:
    save_file(state, str(path))
    return path


def transformers_vit(folder: Path) -> Path:
    from transformers import ViTConfig, ViTModel

    ViTModel(ViTConfig(**HF_TINY)).save_pretrained(folder)
    return folder / "model.safetensors"


def transformers_clip(folder: Path) -> Path:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    CLIPVisionModel(CLIPVisionConfig(**HF_TINY)).save_pretrained(folder)
    return folder / "model.safetensors"


def block_removed(folder: Path) -> Path:
    state = {k: v for k, v in timm_state().items() if not k.startswith("blocks.2.")}
    return save(state, folder / "short.safetensors")


def extra_key(folder: Path) -> Path:
    return save(
        {**timm_state(), "blocks.0.attn.extra": torch.ones(3)}, folder / "extra.safetensors"
    )


def other_width(folder: Path) -> Path:
    return save(timm_state(embed_dim=24), folder / "narrow.safetensors")


MISMATCHES: list[tuple[Callable[[Path], Path], str]] = [
    (
        transformers_vit,
        r"42 missing keys \(cls_token, pos_embed, patch_embed\.proj\.weight, "
        r"patch_embed\.proj\.bias, \.\.\.\), \d+ unexpected keys \(embeddings\.cls_token, ",
    ),
    (
        transformers_clip,
        r"42 missing keys \(cls_token, .*\), \d+ unexpected keys \(embeddings\.class_embedding, ",
    ),
    (block_removed, r"12 missing keys \(blocks\.2\.norm1\.weight, blocks\.2\.norm1\.bias, "),
    (extra_key, r": 1 unexpected keys \(blocks\.0\.attn\.extra\) \("),
    (
        other_width,
        r": 42 shape mismatches \(cls_token \(1, 1, 24\) in the file, \(1, 1, 48\) in the model",
    ),
]


@pytest.mark.parametrize(("write", "keys"), MISMATCHES, ids=lambda x: getattr(x, "__name__", ""))
@pytest.mark.parametrize("num_classes", [0, 5])
def test_a_checkpoint_that_is_not_the_model_is_an_error(
    tmp_path: Path, write: Callable[[Path], Path], keys: str, num_classes: int
) -> None:
    path = write(tmp_path)
    spec = TimmSpec(TIMM_ID, str(path), kwargs=TINY_VIT_KWARGS)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))} does not match {TIMM_ID}") as e:
        build_model(spec, num_classes=num_classes)
    assert re.search(keys, str(e.value)), str(e.value)
    assert "timm.models.vision_transformer.checkpoint_filter_fn" in str(e.value)


def loads_as_timm_does(
    timm_id: str,
    kwargs: dict,
    path: Path,
    state: dict[str, torch.Tensor],
    num_classes: int,
    seed: int,
) -> dict[str, torch.Tensor]:
    """Build ``timm_id`` from the checkpoint ``path`` (of ``state``) with a new head, ours and
    timm's own way, from one seed; assert that every tensor and the RNG after are timm's and
    every backbone tensor is the file's; return our model's state dict."""
    torch.manual_seed(seed)
    ours = build_model(TimmSpec(timm_id, str(path), kwargs=kwargs), num_classes=num_classes)
    after_ours = torch.rand(3)
    torch.manual_seed(seed)
    theirs = timm.create_model(
        timm_id,
        pretrained=True,
        pretrained_cfg_overlay={"file": str(path)},
        num_classes=num_classes,
        **kwargs,
    )
    assert torch.equal(torch.rand(3), after_ours)
    loaded, reference = ours.state_dict(), theirs.state_dict()
    assert list(loaded) == list(reference)
    for name, tensor in loaded.items():
        assert torch.equal(tensor, reference[name]), name
        if not name.startswith("head."):
            assert torch.equal(tensor, state[name]), name
    return loaded


@pytest.mark.parametrize("suffix", ["safetensors", "pth"])
def test_a_matching_checkpoint_loads_as_timm_loaded_it(tmp_path: Path, suffix: str) -> None:
    """Every backbone tensor from the file; the model, its new head and the RNG after it are
    those of timm's own (non-strict) loading, which the code before used."""
    state = timm_state()
    path = tmp_path / f"model.{suffix}"
    if suffix == "pth":  # a training checkpoint: the state dict nested, as timm's train.py saves
        torch.save({"epoch": 3, "state_dict": state}, path)
    else:
        save(state, path)
    loaded = loads_as_timm_does(TIMM_ID, TINY_VIT_KWARGS, path, state, num_classes=5, seed=11)
    assert not torch.equal(loaded["head.weight"], state["head.weight"][:5])  # a new head


@pytest.mark.parametrize("tiny", [m for m in TINY_MODELS if m.timm_id], ids=lambda m: m.id)
def test_every_timm_family_loads_its_own_checkpoint(tmp_path: Path, tiny: TinyModel) -> None:
    """Each registry family's tiny timm model, saved and loaded back: every backbone tensor
    from the file through its module's checkpoint_filter_fn, and the model and RNG after it
    as timm's own loading leaves them."""
    assert tiny.timm_id is not None and tiny.kwargs is not None
    source = tiny.build()
    state = {key: value.contiguous() for key, value in source.state_dict().items()}
    path = save(state, tmp_path / "model.safetensors")
    loads_as_timm_does(tiny.timm_id, tiny.kwargs, path, state, num_classes=3, seed=4)


def test_original_dinov2_names_are_converted(tmp_path: Path) -> None:
    """An original DINOv2 checkpoint (register_tokens, mask_token, a position for the class
    token) loads through timm.models.vision_transformer.checkpoint_filter_fn."""
    kwargs = {"img_size": 28, "patch_size": 7, "embed_dim": 48, "depth": 2, "num_heads": 3}
    timm_id = "vit_small_patch14_reg4_dinov2"
    torch.manual_seed(0)
    source = timm.create_model(timm_id, num_classes=0, **kwargs).state_dict()
    original = {k: v for k, v in source.items() if k not in ("reg_token", "cls_token", "pos_embed")}
    # timm folds the class token's position into cls_token: zero keeps the sum exact.
    class_position = torch.zeros(1, 1, 48)
    original |= {
        "register_tokens": source["reg_token"],
        "cls_token": source["cls_token"] - class_position,
        "pos_embed": torch.cat([class_position, source["pos_embed"]], dim=1),
        "mask_token": torch.randn(1, 48),
    }
    path = save({k: v.contiguous() for k, v in original.items()}, tmp_path / "dinov2.safetensors")
    loaded = build_model(TimmSpec(timm_id, str(path), kwargs=kwargs)).state_dict()
    assert list(loaded) == list(source)
    for name, tensor in source.items():
        assert torch.equal(loaded[name], tensor), name


def test_a_map_pooled_checkpoint_loads_into_a_gap_siglip(tmp_path: Path) -> None:
    """A SigLIP checkpoint's attention pooling is dropped where the model pools by average
    (timm's VisionTransformer loads SigLIP non-strictly for that case alone); all else loads."""
    kwargs = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 3}
    torch.manual_seed(0)
    source = timm.create_model("vit_base_patch16_siglip_224", num_classes=0, **kwargs)
    assert source.attn_pool is not None
    state = {k: v.contiguous() for k, v in source.state_dict().items()}
    path = save(state, tmp_path / "siglip.safetensors")
    spec = TimmSpec("vit_base_patch16_siglip_gap_224", str(path), kwargs=kwargs)
    loaded = build_model(spec, num_classes=4).state_dict()
    assert {k for k in state if not k.startswith("attn_pool.")} == {
        k for k in loaded if not k.startswith("head.")
    }
    for name, tensor in loaded.items():
        if not name.startswith("head."):
            assert torch.equal(tensor, state[name]), name
    # The model that does pool by attention needs those keys.
    del state["attn_pool.latent"]
    save(state, path)
    with pytest.raises(ValueError, match=r"1 missing keys \(attn_pool\.latent\)"):
        build_model(TimmSpec("vit_base_patch16_siglip_224", str(path), kwargs=kwargs))
