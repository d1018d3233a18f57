"""Strict loading of text models (through vitplasticity.models.build.build_model) on real saved
folders.

transformers loads a saved Llama, Qwen2 or BERT folder into a GPT2Model with a warning, and a
GPT2 checkpoint missing a tensor with that tensor at its random init: the text plasticity stage
then measured a random model and exited 0. Each such folder is now an error naming it, before
any measurement; a complete GPT2 folder loads exactly the saved weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers.text_entries import gpt2_entry
from vitplasticity.cli import main
from vitplasticity.models.build import build_model

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TINY_GPT2 = {"n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 64, "n_positions": 16}


# One block of width 16, 2 heads, 64 token ids: each family's config with these sizes.
SMALL = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "vocab_size": 64,
}
OTHER_CONFIGS: dict[str, tuple[str, dict]] = {
    "llama": ("Llama", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2", {"num_key_value_heads": 2}),
    "bert": ("Bert", {"max_position_embeddings": 16}),
}
"""Text models researchers use, each saved as its own model type (the key): the prefix of its
transformers Model and Config classes, and its config besides :data:`SMALL`."""


def other_model(model_type: str) -> nn.Module:
    """A tiny random-init model of ``model_type`` (:data:`OTHER_CONFIGS`)."""
    prefix, extra = OTHER_CONFIGS[model_type]
    config = getattr(transformers, f"{prefix}Config")(**SMALL, **extra)
    return getattr(transformers, f"{prefix}Model")(config)


def saved(model: nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


def tiny_gpt2() -> nn.Module:
    torch.manual_seed(0)
    return transformers.GPT2Model(transformers.GPT2Config(**TINY_GPT2))


def folder_entry(folder: Path) -> dict:
    return gpt2_entry(str(folder))


@pytest.mark.parametrize("model_type", sorted(OTHER_CONFIGS))
def test_another_model_type_is_an_error_naming_folder_and_both_types(
    tmp_path: Path, model_type: str
) -> None:
    folder = saved(other_model(model_type), tmp_path / f"my_{model_type}")
    assert json.loads((folder / "config.json").read_text())["model_type"] == model_type
    expected = rf"my_{model_type}'.*model_type '{model_type}', not 'gpt2'"
    with pytest.raises(ValueError, match=expected):
        build_model(folder_entry(folder))
    # The same folder given as a hub id (from_pretrained takes a local path there too).
    with pytest.raises(ValueError, match=expected):
        build_model(gpt2_entry("hub", hf_id=str(folder)))


def test_text_plasticity_refuses_a_saved_llama_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The stage end to end: a Llama folder given to a GPT2Model entry exits 2 naming it,
    writes nothing."""
    folder = saved(other_model("llama"), tmp_path / "llama_folder")
    text = tmp_path / "text.txt"
    text.write_text("some text to measure, long enough for a few sequences.\n" * 20)
    code = main(
        [
            "plasticity",
            "--model",
            "tiny",
            "--model-spec",
            json.dumps(
                {
                    "family": "transformers",
                    "hf_id": "tiny",
                    "weights": str(folder),
                    "model_class": "GPT2Model",
                }
            ),
            "--reference",
            str(text),
            "--text",
            str(text),
            "--tokenizer",
            "bytes",
            "--sequence-length",
            "8",
            "--n-pairs",
            "2",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "pairs.parquet"),
            "--summary",
            str(tmp_path / "summary.parquet"),
        ]
    )
    assert code == 2
    assert "llama_folder" in caplog.text and "model_type 'llama', not 'gpt2'" in caplog.text
    assert not (tmp_path / "pairs.parquet").exists()


def test_a_folder_without_config_json_is_an_error_naming_it(tmp_path: Path) -> None:
    folder = saved(tiny_gpt2(), tmp_path / "weights_only")
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"'.*weights_only' has no config\.json"):
        build_model(folder_entry(folder))


def test_a_config_json_that_is_not_json_is_an_error_naming_it(tmp_path: Path) -> None:
    folder = saved(tiny_gpt2(), tmp_path / "broken")
    (folder / "config.json").write_text("model_type: gpt2\n")
    with pytest.raises(ValueError, match=r"broken/config\.json: not a JSON file"):
        build_model(folder_entry(folder))


def test_a_checkpoint_missing_a_tensor_is_an_error_naming_folder_and_key(tmp_path: Path) -> None:
    folder = saved(tiny_gpt2(), tmp_path / "cut")
    weights = safetensors_torch.load_file(folder / "model.safetensors")
    del weights["h.1.mlp.c_fc.weight"]
    safetensors_torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"'.*cut'.*1 missing weight\(s\): h\.1\.mlp\.c_fc\.weight"
    ):
        build_model(folder_entry(folder))


def test_a_checkpoint_with_an_extra_tensor_is_an_error_naming_it(tmp_path: Path) -> None:
    folder = saved(tiny_gpt2(), tmp_path / "extra")
    weights = safetensors_torch.load_file(folder / "model.safetensors")
    weights["score.weight"] = torch.zeros(3, TINY_GPT2["n_embd"])  # a classifier head
    safetensors_torch.save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"'.*extra'.*1 unexpected weight\(s\): score\.weight"):
        build_model(folder_entry(folder))


def test_a_complete_gpt2_folder_loads_the_saved_weights(tmp_path: Path) -> None:
    original = tiny_gpt2()
    folder = saved(original, tmp_path / "gpt2")
    loaded = build_model(folder_entry(folder))
    assert type(loaded).__name__ == "GPT2Model" and not loaded.training
    assert loaded.config._attn_implementation == "eager"
    expected, found = original.state_dict(), loaded.state_dict()
    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(found[name], tensor, rtol=0, atol=0, msg=name)


def test_a_saved_lm_head_model_loads_its_backbone(tmp_path: Path) -> None:
    """GPT2LMHeadModel (the hub's "gpt2" layout) ties lm_head to wte: nothing is left over."""
    torch.manual_seed(0)
    original = transformers.GPT2LMHeadModel(transformers.GPT2Config(**TINY_GPT2))
    folder = saved(original, tmp_path / "lm")
    loaded = build_model(folder_entry(folder))
    for name, tensor in original.transformer.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_entry_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown model keys \['timm_id'\]"):
        build_model({**gpt2_entry(), "timm_id": "x"})
    with pytest.raises(FileNotFoundError, match="no/such/folder"):
        build_model(gpt2_entry("no/such/folder"))
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(ImportError, match=r"vitplasticity\[extras\]"):
        build_model(gpt2_entry("random"))
