"""Tiny models saved as their families save a checkpoint, for the streamed measurement's
tests (tests/plasticity/test_streamed.py, tests/recommend/test_recommend_streamed.py)."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from tests.helpers.tiny_models import TINY_MODELS, TinyModel, perturbed


def tiny_model(case: str) -> TinyModel:
    """The tiny model of ``tests.helpers.tiny_models`` whose id is ``case``."""
    return next(t for t in TINY_MODELS if t.id == case)


def saved_checkpoint(folder: Path, case: str) -> dict:
    """The tiny model ``case``, its weights moved off their init, saved in ``folder`` as its
    family saves a checkpoint (timm: one safetensors file of its state dict, head included;
    transformers: save_pretrained); the ``models:`` entry naming it."""
    tiny = tiny_model(case)
    model = perturbed(tiny.build()).float()
    if tiny.timm_id is not None:
        path = folder / "model.safetensors"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
        return {"timm_id": tiny.timm_id, "kwargs": tiny.kwargs, "weights": str(path)}
    model.save_pretrained(folder / "model")
    return {"family": "transformers", "hf_id": f"tiny/{case}", "weights": str(folder / "model")}
