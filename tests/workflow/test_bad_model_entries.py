"""Bad model entries named when the config is parsed, before any job (issue 27): a local
``weights:`` path that is not what the family loads (a timm weights file; a transformers
saved-model folder), and a random transformers model's ``model_type`` or ``model_class`` that
no registered architecture declares. Each row: the entry, and the words of the error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.configs import DEMO, PAPER, load_config, merged
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config

TIMM = {"family": "timm", "timm_id": "vit_tiny_patch16_224"}
HF = {"family": "transformers", "hf_id": "tiny/model"}
RANDOM_VIT = {**HF, "weights": "random", "config": {"model_type": "vit"}}


def folder(tmp: Path, *files: str) -> Path:
    """``tmp/saved`` holding an empty file of each name."""
    path = tmp / "saved"
    path.mkdir()
    for name in files:
        (path / name).write_text("{}")
    return path


Entry = Callable[[Path], dict[str, Any]]
ROWS: dict[str, tuple[Entry, list[str]]] = {
    "timm weights file missing": (
        lambda tmp: {**TIMM, "weights": str(tmp / "vit.safetensors")},
        ["models.mine.weights:", "vit.safetensors", "does not exist", "a weights file"],
    ),
    "timm weights a folder": (
        lambda tmp: {**TIMM, "weights": str(folder(tmp))},
        ["models.mine.weights:", "saved", "is a folder", "the weights file in it"],
    ),
    "transformers weights folder missing": (
        lambda tmp: {**HF, "weights": str(tmp / "dinov2")},
        ["models.mine.weights:", "dinov2", "does not exist", "a saved-model folder"],
    ),
    "transformers weights a file": (
        lambda tmp: {**HF, "weights": str(folder(tmp, "model.safetensors") / "model.safetensors")},
        ["models.mine.weights:", "model.safetensors", "is a file", "a saved-model folder"],
    ),
    "transformers folder without config.json": (
        lambda tmp: {**HF, "weights": str(folder(tmp, "model.safetensors"))},
        ["models.mine.weights:", "saved", "has no config.json"],
    ),
    "random model of an unknown model_type": (
        lambda tmp: {**HF, "weights": "random", "config": {"model_type": "vitt"}},
        ["models.mine.config.model_type:", "'vitt'", "registered architectures", "dinov2"],
    ),
    "unknown model_class": (
        lambda tmp: {**RANDOM_VIT, "model_class": "ViTModle"},
        ["models.mine.model_class:", "'ViTModle'", "registered architectures", "ViTModel"],
    ),
}


@pytest.mark.parametrize(("entry", "words"), ROWS.values(), ids=ROWS.keys())
def test_bad_model_entry_is_named_at_parse(tmp_path: Path, entry: Entry, words: list[str]) -> None:
    config = merged(load_config(PAPER, DEMO), {"models": {"mine": entry(tmp_path)}})
    with pytest.raises(ConfigError) as error:
        check_config(config)
    problems = str(error.value).splitlines()[1:]
    assert len(problems) == 1, problems
    for word in words:
        assert word in problems[0], f"{word!r} not in:\n{problems[0]}"


def test_good_local_weights_pass(tmp_path: Path) -> None:
    """A timm weights file and a saved transformers folder pass the checks."""
    timm_file = tmp_path / "vit.safetensors"
    timm_file.write_bytes(b"")
    models = {
        "a": {**TIMM, "weights": str(timm_file)},
        "b": {**HF, "weights": str(folder(tmp_path, "config.json"))},
        "c": {**RANDOM_VIT, "model_class": "ViTModel"},
    }
    check_config(merged(load_config(PAPER, DEMO), {"models": models}))
