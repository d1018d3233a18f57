"""Text finetuning (vitplasticity.finetune.text_run): the train/val split, the losses against
computations written out here, the data order, and the refusals before compute (resume, rungs
and packs of text runs: tests/finetune/test_one_loop.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from tests.helpers.real_checkpoints import ENGLISH
from tests.helpers.text_entries import BERT_MLM, GPT2, LENGTH
from tests.helpers.tiny_models import ENCODER_TINY_CONFIG
from vitplasticity.data.loader import batch_indices
from vitplasticity.data.text import split_sequences
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.loop import train_steps
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.resumable import ResumableState
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
from vitplasticity.finetune.tasks import (
    masked_inputs,
    masked_lm_loss,
    next_token_loss,
    perplexity,
)
from vitplasticity.finetune.text_run import TextSource, masked_positions, train_text_run
from vitplasticity.models.architectures import UnsupportedModel
from vitplasticity.models.build import build_model
from vitplasticity.models.text import masked_lm, text_model_spec

DEBERTA_V2_MLM = {
    "family": "transformers",
    "hf_id": "tiny-deberta-v2",
    "weights": "random",
    "model_class": "DebertaV2ForMaskedLM",
    "config": {
        "model_type": "deberta-v2",
        **ENCODER_TINY_CONFIG,
        "relative_attention": True,
        "pos_att_type": ["p2c", "c2p"],
    },
}
ATTENTION_LINEARS = (  # BERT's attention linears, LoRA's targets
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
)


def _pattern(tmp_path: Path, lines: int = 40) -> Path:
    """A learnable text: one repeated line (byte tokens, each the next one's cue)."""
    path = tmp_path / "pattern.txt"
    path.write_text(("abcdefgh" * 3 + "\n") * lines)
    return path


def _training(spec: dict, **overrides) -> TrainingSettings:
    values = {
        "model_spec": spec,
        "optimizer": "adamw",
        "steps": 12,
        "val_every": 4,
        "batch_size": 4,
        "micro_batch_size": 2,
        "warmup_steps": 2,
        "log_every": 1,
        "checkpoint_every": 5,
        "device": "cpu",
        "val_fraction": 0.25,
    }
    return TrainingSettings(**{**values, **overrides})


def _run(configuration: str = "mha", model: str = "tiny") -> Run:
    return Run("text", model, "pattern", configuration, 1e-2, 0)


# --- split ----------------------------------------------------------------------------------


def test_the_split_takes_every_sequence_whose_share_crosses_an_integer() -> None:
    sequences = np.arange(10)[:, None] * np.ones((1, 3), dtype=np.int64)  # row i is i
    train, val = split_sequences(sequences, 0.3)
    # floor((i + 1) 0.3) > floor(i 0.3) at i = 3 (1 > 0), 6 (2 > 1), 9 (3 > 2).
    assert val[:, 0].tolist() == [3, 6, 9]
    assert train[:, 0].tolist() == [0, 1, 2, 4, 5, 7, 8]
    # The same for a fraction of one half: every second sequence.
    assert split_sequences(sequences, 0.5)[1][:, 0].tolist() == [1, 3, 5, 7, 9]


def test_a_split_without_a_validation_or_training_sequence_is_refused() -> None:
    with pytest.raises(ValueError, match=r"2 sequences: a val_fraction of 0.3 leaves 0"):
        split_sequences(np.zeros((2, 4), dtype=np.int64), 0.3)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\)"):
        split_sequences(np.zeros((8, 4), dtype=np.int64), 1.0)


# --- losses ---------------------------------------------------------------------------------


def _cross_entropy(logits: torch.Tensor, target: int) -> float:
    """-log softmax(logits)[target], in float64, written out."""
    values = logits.double()
    return float(torch.log(torch.exp(values - values.max()).sum()) + values.max() - values[target])


def test_the_next_token_loss_predicts_each_token_from_the_previous_position() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=generator)
    ids = torch.randint(0, 7, (2, 5), generator=generator)
    expected = np.mean(
        [_cross_entropy(logits[b, t], int(ids[b, t + 1])) for b in range(2) for t in range(4)]
    )
    assert float(next_token_loss(logits, ids)) == pytest.approx(expected, rel=1e-6)
    assert perplexity(float(next_token_loss(logits, ids))) == pytest.approx(math.exp(expected))


def test_the_masked_lm_loss_scores_the_original_tokens_at_the_masked_positions() -> None:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 9, (3, 8), generator=generator)
    mask = masked_positions(ids.shape, 0.25, torch.Generator().manual_seed(2))
    assert mask.sum(dim=1).tolist() == [2, 2, 2]  # round(0.25 * 8) per sequence
    inputs = masked_inputs(ids, mask, 9)
    assert torch.equal(inputs[~mask], ids[~mask]) and bool((inputs[mask] == 9).all())
    logits = torch.randn(3, 8, 10, generator=generator)
    positions = mask.nonzero().tolist()
    expected = np.mean([_cross_entropy(logits[b, t], int(ids[b, t])) for b, t in positions])
    assert float(masked_lm_loss(logits, ids, mask)) == pytest.approx(expected, rel=1e-6)
    # At least one position even where the share rounds to none: the loss stays defined.
    tiny = masked_positions(torch.Size((2, 3)), 0.01, torch.Generator().manual_seed(0))
    assert tiny.sum(dim=1).tolist() == [1, 1]


def test_the_batches_of_an_epoch_are_a_permutation_known_from_the_step() -> None:
    n, batch = 10, 4
    stream = np.concatenate([batch_indices(step, batch, n, seed=3) for step in range(5)])
    assert sorted(stream[:10].tolist()) == list(range(10))  # epoch 0
    assert sorted(stream[10:20].tolist()) == list(range(10))  # epoch 1
    assert stream[:10].tolist() != stream[10:20].tolist()
    assert batch_indices(3, batch, n, seed=3).tolist() == stream[12:16].tolist()


# --- runs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "task"), [(GPT2, "causal"), (BERT_MLM, "masked"), (DEBERTA_V2_MLM, "masked")]
)
def test_a_run_trains_its_configuration_and_selects_the_lowest_validation_loss(
    tmp_path: Path, spec: dict, task: str
) -> None:
    text = _pattern(tmp_path)
    summary = train_text_run(
        _run(),
        _training(spec),
        TextFinetuneSettings(sequence_length=LENGTH),
        text,
        tmp_path / "run",
    )
    metrics = pl.read_parquet(tmp_path / "run/metrics.parquet")
    val = metrics.filter(pl.col("kind") == "val")
    assert val["step"].to_list() == [4, 8, 12]
    best = val.sort(["val_loss", "step"]).row(0, named=True)
    assert summary["task"] == task and summary["status"] == "completed"
    assert summary["best_step"] == best["step"]
    assert summary["best_val_loss"] == best["val_loss"]
    assert summary["best_val_perplexity"] == pytest.approx(math.exp(best["val_loss"]))
    assert val["val_perplexity"].to_list() == pytest.approx([math.exp(v) for v in val["val_loss"]])
    n = 40 * 25 // LENGTH  # 40 lines of 25 bytes, in sequences of LENGTH
    assert summary["settings"]["resolved"]["split_sizes"] == {"train": n - n // 4, "val": n // 4}
    assert not (tmp_path / "run/checkpoint.pt").exists()


def test_a_bare_encoder_gets_a_masked_lm_head_drawn_from_the_run_seed() -> None:
    """A bare BertModel inside BertForMaskedLM: the encoder's own modules (its pooler left
    out), the decoder the word embedding, the transform and output bias drawn from the torch
    RNG, so the same seed draws the same head and another seed another."""
    bare = {key: value for key, value in BERT_MLM.items() if key != "model_class"}

    def built(seed: int) -> tuple[torch.nn.Module, torch.nn.Module, list[str]]:
        encoder = build_model(text_model_spec("tiny", bare))
        torch.manual_seed(seed)
        lm, drawn = masked_lm(encoder)
        return encoder, lm, drawn

    before = {
        k: v.clone() for k, v in build_model(text_model_spec("tiny", bare)).state_dict().items()
    }
    encoder, lm, drawn = built(0)
    after = encoder.state_dict()  # the encoder as built: the draw touched none of it
    assert all(torch.equal(after[k], v) for k, v in before.items() if not k.startswith("pooler."))
    assert type(lm).__name__ == "BertForMaskedLM" and lm.bert is encoder
    assert encoder.pooler is None
    assert lm.get_output_embeddings().weight is encoder.get_input_embeddings().weight
    assert drawn == [  # the output bias once: the decoder's bias is the same tensor
        "cls.predictions.bias",
        "cls.predictions.transform.LayerNorm.bias",
        "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.dense.weight",
    ]
    assert lm.cls.predictions.decoder.bias is lm.cls.predictions.bias
    assert not any(t.is_meta for t in (*lm.parameters(), *lm.buffers()))
    dense = lm.cls.predictions.transform.dense.weight
    assert float(dense.std()) == pytest.approx(lm.config.initializer_range, rel=0.3)
    assert torch.equal(built(0)[1].cls.predictions.transform.dense.weight, dense)
    assert not torch.equal(built(1)[1].cls.predictions.transform.dense.weight, dense)
    with_head = build_model(text_model_spec("tiny", BERT_MLM))
    assert masked_lm(with_head) == (with_head, [])  # a masked LM is used as it is


def test_a_bare_encoder_run_says_its_head_was_initialised_not_loaded(tmp_path: Path) -> None:
    bare = {key: value for key, value in BERT_MLM.items() if key != "model_class"}
    summary = train_text_run(
        _run(), _training(bare), TextFinetuneSettings(sequence_length=LENGTH),
        _pattern(tmp_path), tmp_path / "run",
    )  # fmt: skip
    resolved = summary["settings"]["resolved"]
    assert summary["task"] == "masked" and resolved["lm_class"] == "BertForMaskedLM"
    assert resolved["lm_head"].startswith("initialised from the run seed, not loaded: cls.")


def test_the_real_minilm_finetunes_with_the_masked_lm_loss(
    minilm_folder: Path, tmp_path: Path
) -> None:
    """The real bare checkpoint (sentence-transformers saves no MLM head) finetunes its LN1
    on English text: its own tokenizer and [MASK] token, the head drawn from the run seed and
    trained with LN1: 6 x 768 LayerNorm parameters and the head's 147,840 (transform) + 768
    (its LayerNorm) + 30,522 (output bias; the decoder is the word embedding, not trained)."""
    text = tmp_path / "english.txt"
    text.write_text(ENGLISH * 4)
    entry = {"family": "transformers", "hf_id": "all-MiniLM-L6-v2", "weights": str(minilm_folder)}
    training = _training(entry, steps=4, val_every=2)
    summary = train_text_run(
        _run("ln1", "minilm"), training, TextFinetuneSettings(sequence_length=16),
        text, tmp_path / "run",
    )  # fmt: skip
    resolved = summary["settings"]["resolved"]
    assert summary["status"] == "completed" and summary["task"] == "masked"
    assert resolved["tokenizer"] == str(minilm_folder) and resolved["mask_token_id"] == 103
    assert resolved["lm_head"].startswith("initialised from the run seed, not loaded")
    assert math.isfinite(summary["best_val_loss"])
    assert summary["trainable_parameters"] == 6 * 768 + 147_840 + 768 + 30_522


def test_an_image_model_is_refused_before_it_is_built(tmp_path: Path) -> None:
    vit = {"family": "timm", "timm_id": "vit_tiny_patch16_224", "weights": "random"}
    with pytest.raises(UnsupportedModel, match=r"'tiny' takes images: .*vitplasticity finetune"):
        train_text_run(
            _run(), _training(vit), TextFinetuneSettings(sequence_length=LENGTH),
            _pattern(tmp_path), tmp_path / "run",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "adapted"), [(GPT2, ("attn.c_attn", "attn.c_proj")), (BERT_MLM, ATTENTION_LINEARS)]
)
def test_a_lora_run_trains_the_adapters_of_every_attention_linear_and_the_head(
    tmp_path: Path, spec: dict, adapted: tuple[str, ...]
) -> None:
    settings = FinetuneSettings(_run("lora"), _training(spec, steps=3, val_every=3))
    source = TextSource(TextFinetuneSettings(sequence_length=LENGTH), _pattern(tmp_path))
    context = source.setup(settings, torch.device("cpu"), tmp_path / "run")
    model = context.run_model.model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    train_steps(context, ResumableState.resume(context))
    trained = {name for name, _ in context.run_model.trainable}
    blocks = spec["config"].get("n_layer", spec["config"].get("num_hidden_layers"))
    prefix = "transformer.h" if spec is GPT2 else "bert.encoder.layer"
    adapters = {
        f"{prefix}.{block}.{linear}.lora_{side}.default.weight"
        for block in range(blocks)
        for linear in adapted
        for side in "AB"
    }
    assert {n for n in trained if ".lora_" in n} == adapters
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == trained  # every adapter learned (B starts at zero); nothing else moved


def test_compile_and_a_sequence_beyond_the_positions_are_refused(tmp_path: Path) -> None:
    text = _pattern(tmp_path)
    with pytest.raises(ValueError, match=r"^--compile \(finetune.compile\): not implemented"):
        train_text_run(
            _run(), _training(GPT2, compile=True), TextFinetuneSettings(sequence_length=LENGTH),
            text, tmp_path / "compiled",
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"--sequence-length 20 exceeds the 16 positions"):
        train_text_run(
            _run(), _training(GPT2), TextFinetuneSettings(sequence_length=20), text,
            tmp_path / "long",
        )  # fmt: skip


def test_the_image_finetuning_refuses_a_text_model_naming_the_text_stage() -> None:
    settings = FinetuneSettings(_run(), _training(GPT2))
    with pytest.raises(ValueError, match=r"GPT2Model has no classification class.*finetune --text"):
        build_run_model(settings, num_classes=3, device=torch.device("cpu"))
