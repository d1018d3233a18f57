"""What a text run records and says of itself: the settings it ran with, never an image-only
setting's default (finetune.num_workers: 4 when the config said 0), and the help of
--val-fraction, whose text split is a fixed rule while the image split is seeded."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.helpers.tiny_models import GPT2_TINY_CONFIG
from vitplasticity.data.store import split_pool
from vitplasticity.data.text import split_sequences
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
from vitplasticity.finetune.text_run import train_text_run
from vitplasticity.settings.declaration import setting_fields

GPT2 = {
    "family": "transformers",
    "hf_id": "tiny-gpt2",
    "weights": "random",
    "config": {"model_type": "gpt2", **GPT2_TINY_CONFIG},
}
TRAINING = TrainingSettings(
    model_spec=GPT2,
    optimizer="adamw",
    steps=2,
    val_every=2,
    batch_size=2,
    micro_batch_size=2,
    warmup_steps=1,
    checkpoint_every=7,
    log_every=1,
    device="cpu",
    val_fraction=0.25,
)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The settings the summary.json of a tiny GPT2 text run records."""
    folder = tmp_path_factory.mktemp("text_run")
    text = folder / "pattern.txt"
    text.write_text(("abcdefgh" * 3 + "\n") * 20)
    run = Run("text", "tiny", "pattern", "mha", 1e-2, 0)
    text_settings = TextFinetuneSettings(sequence_length=12)
    train_text_run(run, TRAINING, text_settings, text, folder / "run")
    return json.loads((folder / "run/summary.json").read_text())["settings"]


# Each training setting: (name, what the summary records: its value, or absent).
ROWS = [
    (
        name,
        None
        if name in ("num_workers", "augment", "compile", "lora_rank", "lora_alpha")
        else getattr(TRAINING, name),
    )
    for name in (field.name for field in dataclasses.fields(TrainingSettings))
    if name not in ("model_spec",)
]


@pytest.mark.parametrize(("name", "value"), ROWS, ids=[row[0] for row in ROWS])
def test_a_text_run_records_the_settings_it_ran_with_and_no_unused_default(
    recorded: dict, name: str, value: object
) -> None:
    if value is None:
        assert name not in recorded, f"{name}: recorded {recorded[name]!r}, unused by a text run"
    else:
        expected = list(value) if isinstance(value, tuple) else value
        assert recorded[name] == expected


def test_the_val_fraction_help_says_which_split_is_seeded() -> None:
    """Images: two seeds, two splits; text: no seed at all, every 1/f-th sequence."""
    help_text = next(
        declared.help
        for field, declared, _ in setting_fields(TrainingSettings)
        if field.name == "val_fraction"
    )
    assert "not seeded" in help_text and "seeded by the run seed" in help_text
    assert split_pool(20, 0, 0.25)[1].tolist() != split_pool(20, 1, 0.25)[1].tolist()
    _, val = split_sequences(np.arange(8)[:, None], 0.25)
    assert val[:, 0].tolist() == [3, 7]
