"""Bad weights and non-finite results (issue 27): each row gives a stage weights that are not
what it needs (a text model's folder for an image stage, a truncated or random-bytes
safetensors file, tensors of NaN or inf, finite weights whose forward pass overflows), and the
words its one ``ERROR:`` line must hold. Every row runs the CLI: exit 2, no traceback, the
culprit named, nothing written."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.cli_errors import refusal
from tests.helpers.images import write_reference
from tests.helpers.tiny_models import GPT2_TINY_CONFIG, HF_VISION_TINY_CONFIG
from tests.helpers.tiny_vit import TINY_SPEC, TINY_VIT_KWARGS
from vitplasticity.models.architectures import ARCHITECTURES, architecture_for, declared
from vitplasticity.models.spec import TRANSFORMERS_MODEL_CLASSES
from vitplasticity.utils.optional import require_transformers

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HUGE = 3e38
"""A float32 value near its largest: finite weights whose products overflow to inf."""


def timm_entry(weights: Path) -> dict[str, Any]:
    return {"timm_id": TINY_SPEC.timm_id, "weights": str(weights), "kwargs": TINY_VIT_KWARGS}


def hf_entry(weights: Path) -> dict[str, Any]:
    """A saved transformers model's entry; normalize set, as the tiny folders hold no image
    processor (its absence was named before any of these checks)."""
    entry = {"family": "transformers", "hf_id": "tiny/model", "weights": str(weights)}
    return {**entry, "normalize": "imagenet"}


def timm_file(tmp_path: Path, change: Callable[[dict[str, torch.Tensor]], None] = dict) -> Path:
    """The tiny ViT's backbone as a safetensors file, after ``change`` of its tensors."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(TINY_SPEC.timm_id, num_classes=0, **TINY_VIT_KWARGS)
    state = {key: value.contiguous() for key, value in model.state_dict().items()}
    change(state)
    path = tmp_path / "weights" / "model.safetensors"
    path.parent.mkdir(parents=True)
    save_file(state, path)
    return path


def hf_folder(tmp_path: Path, kind: str) -> Path:
    """A saved tiny transformers model: "vit", "gpt2" or a bare "llama"."""
    transformers = require_transformers()
    torch.manual_seed(0)
    if kind == "vit":
        config = transformers.ViTConfig(**HF_VISION_TINY_CONFIG, intermediate_size=96)
        model = transformers.ViTModel(config, add_pooling_layer=False)
    elif kind == "gpt2":
        model = transformers.GPT2Model(transformers.GPT2Config(**GPT2_TINY_CONFIG))
    else:
        sizes = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2}
        heads = {"num_attention_heads": 3, "num_key_value_heads": 3, "vocab_size": 64}
        model = transformers.LlamaModel(transformers.LlamaConfig(**sizes, **heads))
    folder = tmp_path / kind
    model.save_pretrained(folder)
    return folder


def damaged(path: Path, how: str) -> Path:
    """``path`` truncated to half its bytes, or replaced by as many random bytes."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else os.urandom(len(data)))
    return path


def vit_folder_with(tmp_path: Path, value: float) -> Path:
    """A saved tiny ViT whose first block's query weight is all ``value``."""
    from safetensors.torch import load_file, save_file

    folder = hf_folder(tmp_path, "vit")
    path = folder / "model.safetensors"
    state = load_file(path)
    key = next(k for k in state if k.endswith("query.weight"))
    state[key] = torch.full_like(state[key], value)
    save_file(state, path, metadata={"format": "pt"})
    return folder


def fill(key: str, value: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(state: dict[str, torch.Tensor]) -> None:
        state[key] = torch.full_like(state[key], value)

    return change


@dataclass(frozen=True)
class Given:
    """What a row hands the stage: its model entry, and the culprit the error must name."""

    entry: dict[str, Any]
    culprit: str


def gpt2_folder(tmp_path: Path) -> Given:
    folder = hf_folder(tmp_path, "gpt2")
    return Given(hf_entry(folder), str(folder))


def llama_folder(tmp_path: Path) -> Given:
    folder = hf_folder(tmp_path, "llama")
    return Given(hf_entry(folder), str(folder))


def hf_safetensors(how: str) -> Callable[[Path], Given]:
    def build(tmp_path: Path) -> Given:
        folder = hf_folder(tmp_path, "vit")
        return Given(hf_entry(folder), str(damaged(folder / "model.safetensors", how)))

    return build


def timm_safetensors(how: str) -> Callable[[Path], Given]:
    def build(tmp_path: Path) -> Given:
        path = damaged(timm_file(tmp_path), how)
        return Given(timm_entry(path), str(path))

    return build


def timm_nan(tmp_path: Path) -> Given:
    path = timm_file(tmp_path, fill("blocks.1.attn.qkv.weight", float("nan")))
    return Given(timm_entry(path), f"{path}: tensor blocks.1.attn.qkv.weight")


def hf_inf(tmp_path: Path) -> Given:
    # Named as the loaded model names it (transformers renames a checkpoint's keys).
    folder = vit_folder_with(tmp_path, float("inf"))
    return Given(hf_entry(folder), f"{folder}: tensor layers.0.attention.q_proj.weight")


def timm_overflow(tmp_path: Path) -> Given:
    path = timm_file(tmp_path, fill("blocks.1.mlp.fc1.weight", HUGE))
    return Given(timm_entry(path), "of model 'tiny'")


@dataclass(frozen=True)
class Row:
    """One bad input: the stage it is given to, what it is, and the words of the error."""

    stage: str
    build: Callable[[Path], Given]
    says: tuple[str, ...]


ROWS = {
    "gpt2 folder as an image model": Row(
        "plasticity", gpt2_folder, ("GPT2Model", "takes tokens", "this stage feeds it images")
    ),
    "bare llama folder as an image model": Row(
        "plasticity", llama_folder, ("LlamaModel", "takes tokens", "this stage feeds it images")
    ),
    "gpt2 folder given to bounds": Row(
        "bounds", gpt2_folder, ("GPT2Model", "takes tokens", "this stage feeds it images")
    ),
    "truncated safetensors in a transformers folder": Row(
        "plasticity", hf_safetensors("truncated"), ("not a whole safetensors file",)
    ),
    "random-bytes safetensors in a transformers folder": Row(
        "plasticity", hf_safetensors("random"), ("not a whole safetensors file",)
    ),
    "truncated timm safetensors file": Row(
        "plasticity", timm_safetensors("truncated"), ("not a whole safetensors file",)
    ),
    "random-bytes timm safetensors file": Row(
        "recommend", timm_safetensors("random"), ("not a whole safetensors file",)
    ),
    "NaN tensor in a timm file": Row("plasticity", timm_nan, ("is not finite", "NaN")),
    "inf tensor in a transformers folder": Row("plasticity", hf_inf, ("is not finite", "inf")),
    "finite weights whose plasticity overflows": Row(
        "plasticity", timm_overflow, ("plasticity", "on demo-stripes", "block 1", "not finite")
    ),
    "finite weights whose recommend criteria overflow": Row(
        "recommend", timm_overflow, ("recommend criteria", "block 1", "not finite")
    ),
}


def stage_argv(stage: str, entry: dict[str, Any], tmp_path: Path, dataset: Path) -> list[str]:
    """The command line of ``stage`` on the tiny inputs, writing under ``tmp_path/out``."""
    reference = write_reference(tmp_path / "reference.parquet", 8, seed=3, size=(32, 32))
    model = ["--model", "tiny", "--model-spec", json.dumps(entry), "--device", "cpu"]
    out = tmp_path / "out"
    if stage == "plasticity":
        files = ["--out", str(out / "pairs.parquet"), "--summary", str(out / "summary.parquet")]
        sizes = ["--n-pairs", "4", "--batch-size", "4"]
        return ["plasticity", *model, "--reference", str(reference), "--dataset-dir", str(dataset),
                *sizes, *files]  # fmt: skip
    if stage == "bounds":
        return ["bounds", *model, "--reference", str(reference), "--n-images", "4",
                "--out", str(out / "bounds.parquet")]  # fmt: skip
    fast = ["--batch-size", "4", "--batches", "2", "--warmup-steps", "2", "--n-pairs", "4"]
    return ["recommend", *model, "--dataset-dir", str(dataset), "--reference", str(reference),
            *fast, "--out-prefix", str(out / "tiny")]  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_bad_weights_end_in_one_error_line(
    row: Row, tmp_path: Path, demo_dataset: Path, caplog: pytest.LogCaptureFixture
) -> None:
    given = row.build(tmp_path)
    argv = stage_argv(row.stage, given.entry, tmp_path, demo_dataset)
    message = refusal(argv, caplog, tmp_path / "out")
    assert given.culprit in message, message
    for words in row.says:
        assert words in message, message


def test_the_model_classes_copy_matches_the_architectures() -> None:
    """Every class a ``model_class:`` may name is a transformers class that an architecture
    measures, and every transformers class the architectures declare is listed."""
    transformers = require_transformers()
    declared_classes = {
        name
        for architecture in ARCHITECTURES.values()
        for name in [
            *(tower for tower, _ in getattr(architecture, "towers", ())),
            *getattr(architecture, "variants", {}),
        ]
    } | set(declared("default_classes").values())
    assert {n for n in declared_classes if hasattr(transformers, n)} <= TRANSFORMERS_MODEL_CLASSES
    for name in sorted(TRANSFORMERS_MODEL_CLASSES):
        model_class = getattr(transformers, name)
        with torch.device("meta"):
            model = model_class(model_class.config_class())
        assert architecture_for(model) is not None, name


def test_a_copied_vit_folder_still_loads(tmp_path: Path) -> None:
    """The checks refuse only what is bad: a whole, finite folder loads."""
    from vitplasticity.models.build import build_model

    folder = hf_folder(tmp_path, "vit")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    model = build_model(hf_entry(copy), inputs="images")
    assert architecture_for(model).inputs == "images"
