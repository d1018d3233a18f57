"""A strict transformers load (vitplasticity.models.hf_build.load_strict) keeps quiet about what
it checks itself (the LOAD REPORT table, "This checkpoint seem corrupted") and lets through the
warnings it does not check."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.tiny_models import ENCODER_TINY_CONFIG, GPT2_TINY_CONFIG, HF_VISION_TINY_CONFIG
from vitplasticity.models.hf_build import load_strict
from vitplasticity.models.spec import HFModelSpec

transformers = pytest.importorskip("transformers")


class _Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    """The messages transformers' loggers emit at WARNING and above (transformers' root logger
    does not propagate, so pytest's caplog would not see them)."""
    handler = _Collected()
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


# A token id outside the tiny vocabulary, written into the saved config.json only (transformers
# warns once per message: the id is one no other test uses).
FOREIGN_TOKEN_ID = 4242

# (case, class saved, config, class loaded, refused, text that shows, text that must not)
CASES = [
    (
        "a dropped classifier head",
        "ViTForImageClassification",
        ("ViTConfig", HF_VISION_TINY_CONFIG),
        "ViTModel",
        False,
        None,
        ("LOAD REPORT",),
    ),
    (
        "a bare encoder into its masked-LM class",
        "BertModel",
        ("BertConfig", ENCODER_TINY_CONFIG),
        "BertForMaskedLM",
        True,
        None,
        ("LOAD REPORT", "This checkpoint seem corrupted"),
    ),
    (
        "a config's token ids outside the vocabulary (not checked)",
        "GPT2Model",
        ("GPT2Config", {**GPT2_TINY_CONFIG, "bos_token_id": 0, "eos_token_id": 0}),
        "GPT2Model",
        False,
        f"eos_token_id must be `None` or an integer within the vocabulary (between 0 and 63), "
        f"got {FOREIGN_TOKEN_ID}",
        ("LOAD REPORT",),
    ),
]


@pytest.mark.parametrize(
    ("saved", "config", "loaded", "refused", "shown", "hidden"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_strict_load_shows_only_the_warnings_it_does_not_check(
    tmp_path: Path,
    warnings: list[str],
    saved: str,
    config: tuple[str, dict],
    loaded: str,
    refused: bool,
    shown: str | None,
    hidden: tuple[str, ...],
) -> None:
    config_class, settings = config
    torch.manual_seed(0)
    model_config = getattr(transformers, config_class)(**settings)
    getattr(transformers, saved)(model_config).save_pretrained(tmp_path)
    if shown is not None:
        saved_config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(
            json.dumps({**saved_config, "eos_token_id": FOREIGN_TOKEN_ID})
        )
    warnings.clear()
    spec = HFModelSpec(hf_id="tiny", weights=str(tmp_path), model_class=loaded)
    if refused:
        with pytest.raises(ValueError, match="missing weight"):
            load_strict(transformers, spec, {}, torch.float32)
    else:
        load_strict(transformers, spec, {}, torch.float32)
    for text in hidden:
        assert not [m for m in warnings if text in m], warnings
    if shown is not None:
        assert [m for m in warnings if shown in m], warnings
