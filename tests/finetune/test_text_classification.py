"""Text classification (``finetune --labelled-text``): labelled text read in every format with
errors naming the culprit, tokenized as the model's classifier expects it, a bare checkpoint
inside its sequence-classification class with a new head (logits equal transformers' own
class holding the same weights), runs that learn on tiny models of each family kind and on
the real all-MiniLM-L6-v2, and the refusals before compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from tests.helpers.labelled_text import (
    licence_paragraphs,
    write_first_byte_csv,
    write_licence_csv,
)
from tests.helpers.tiny_models import ENCODER_TINY_CONFIG, HF_TEXT_TINY_CONFIG
from vitplasticity.data.labelled import BYTE_PAD_ID, encode_texts, read_labelled
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
from vitplasticity.finetune.text_run import TextSource
from vitplasticity.finetune.train import train_runs
from vitplasticity.models.build import build_model
from vitplasticity.models.text import sequence_classifier, text_model_spec

transformers = pytest.importorskip("transformers", reason="the text models are transformers'")

# --- reading labelled text -------------------------------------------------------------------

ROWS = [
    (f"document {i} about {'cats' if i % 2 else 'dogs'}", "cat" if i % 2 else "dog")
    for i in range(10)
]


def _csv(path: Path, rows=ROWS, header="text,label") -> Path:
    import csv

    with path.open("w", newline="", encoding="utf-8") as handle:
        handle.write(header + "\n")
        csv.writer(handle).writerows(rows)
    return path


def _jsonl(path: Path, rows=ROWS) -> Path:
    path.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    return path


def _class_folders(root: Path, rows=ROWS) -> Path:
    for i, (text, label) in enumerate(rows):
        (root / label).mkdir(parents=True, exist_ok=True)
        (root / label / f"{i:02d}.txt").write_text(text, encoding="utf-8")
    return root


def test_a_single_table_gets_the_image_folders_fixed_split(tmp_path: Path) -> None:
    from vitplasticity.data.store import fixed_split

    for path in (
        _csv(tmp_path / "d.csv"),
        _jsonl(tmp_path / "d.jsonl"),
        _class_folders(tmp_path / "f"),
    ):
        dataset = read_labelled(path)
        assert dataset.classes == ("cat", "dog")
        pool, test = fixed_split(10, 42, 0.2)
        assert len(dataset.pool) == len(pool) == 8 and len(dataset.test) == len(test) == 2
        assert "seed-42" in dataset.split_rule
    # The CSV and JSONL keep file order, so they split the same documents the same way.
    csv_dataset, jsonl_dataset = (
        read_labelled(tmp_path / "d.csv"),
        read_labelled(tmp_path / "d.jsonl"),
    )
    assert csv_dataset.test.texts == jsonl_dataset.test.texts == tuple(ROWS[i][0] for i in test)
    assert csv_dataset.test.labels.tolist() == [("cat", "dog").index(ROWS[i][1]) for i in test]


def test_train_and_test_files_or_folders_are_the_pool_and_test_splits(tmp_path: Path) -> None:
    (tmp_path / "tables").mkdir()
    _csv(tmp_path / "tables" / "train.csv", ROWS[:8])
    _jsonl(tmp_path / "tables" / "test.jsonl", ROWS[8:])
    _class_folders(tmp_path / "folders" / "train", ROWS[:8])
    _class_folders(tmp_path / "folders" / "test", ROWS[8:])
    for root in (tmp_path / "tables", tmp_path / "folders"):
        dataset = read_labelled(root)
        assert sorted(dataset.test.texts) == sorted(t for t, _ in ROWS[8:])
        assert len(dataset.pool) == 8


def test_integer_labels_are_ordered_as_numbers(tmp_path: Path) -> None:
    rows = [(f"text {i}", str(label)) for i, label in enumerate([10, 9, 2, 10, 9, 2])]
    assert read_labelled(_csv(tmp_path / "d.csv", rows)).classes == ("2", "9", "10")


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda p: _csv(p / "d.csv", header="body,label"), "lacks the column(s) ['text']"),
        (lambda p: _csv(p / "d.csv", [("", "a"), ("x", "b")]), "d.csv, line 2: the text is empty"),
        (lambda p: _csv(p / "d.csv", [("x", " "), ("y", "b")]), "line 2: the label is empty"),
        (
            lambda p: (
                (p / "d.jsonl").write_text('{"text": "a", "label": 1}\n{oops\n') and p / "d.jsonl"
            ),
            "d.jsonl, line 2: not JSON",
        ),
        (
            lambda p: (p / "d.jsonl").write_text('{"text": "a"}\n') and p / "d.jsonl",
            "line 1: expected an object with 'text' and 'label'",
        ),
        (
            lambda p: _csv(p / "d.csv", [("x", "a"), ("y", "a")]),
            "1 class(es) ['a']; classification needs two",
        ),
        (
            lambda p: (p / "d.tsv").write_text("text\tlabel\n") and p / "d.tsv",
            "expected a .csv or .jsonl file",
        ),
        (
            lambda p: (p / "d.csv").write_bytes(b"text,label\n\xff\xfe,a\n") and p / "d.csv",
            "not UTF-8 text",
        ),
    ],
    ids=["column", "empty-text", "empty-label", "json", "keys", "one-class", "suffix", "utf8"],
)
def test_a_bad_labelled_file_is_refused_naming_it(tmp_path: Path, write, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        read_labelled(write(tmp_path))
    assert message in str(caught.value)


def test_a_test_label_the_pool_lacks_and_missing_inputs_are_refused(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    _csv(tmp_path / "t" / "train.csv", [("a", "x"), ("b", "y")])
    _csv(tmp_path / "t" / "test.csv", [("c", "z")])
    with pytest.raises(ValueError, match=r"the test split has label\(s\) \['z'\]"):
        read_labelled(tmp_path / "t")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_labelled(tmp_path / "absent.csv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no <class>/<document>\.txt files"):
        read_labelled(tmp_path / "empty")


# --- tokenizing ------------------------------------------------------------------------------


def test_bytes_are_padded_with_an_id_no_byte_takes_and_cut_at_the_length() -> None:
    encoded, pad = encode_texts(["ab", "abcdef"], "bytes", vocab_size=64, sequence_length=4)
    assert pad == BYTE_PAD_ID
    expected = [[1 + ord("a") % 63, 1 + ord("b") % 63, pad, pad], [1 + b % 63 for b in b"abcd"]]
    assert encoded.ids.tolist() == expected
    assert encoded.attention.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert encoded.truncated == 1 and (encoded.ids[encoded.attention == 1] != pad).all()


def test_a_real_tokenizer_adds_its_special_tokens_and_keeps_them_when_it_cuts(
    minilm_folder: Path,
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder)
    long = " ".join(["licence"] * 50)
    encoded, pad = encode_texts(["a short one", long], str(minilm_folder), 30522, 16)
    assert pad == tokenizer.pad_token_id
    short = tokenizer("a short one")["input_ids"]
    assert (
        encoded.ids[0, : len(short)].tolist() == short
        and (encoded.ids[0, len(short) :] == pad).all()
    )
    assert (
        encoded.ids[1, 0] == tokenizer.cls_token_id and encoded.ids[1, -1] == tokenizer.sep_token_id
    )
    assert encoded.truncated == 1 and encoded.attention[1].all()


# --- the model -------------------------------------------------------------------------------

BARE = {
    # id: (config class, bare class, config)
    "gpt2": (
        "GPT2Config",
        "GPT2Model",
        {"n_embd": 48, "n_layer": 2, "n_head": 3, "vocab_size": 64, "n_positions": 16},
    ),
    "llama": ("LlamaConfig", "LlamaModel", HF_TEXT_TINY_CONFIG),
    "bert": ("BertConfig", "BertModel", ENCODER_TINY_CONFIG),
    "deberta_v2": (
        "DebertaV2Config",
        "DebertaV2Model",
        {**ENCODER_TINY_CONFIG, "relative_attention": True, "pos_att_type": ["p2c", "c2p"]},
    ),
}


def _bare_folder(tmp_path: Path, case: str, pooler: bool = True) -> Path:
    config_class, model_class, config = BARE[case]
    torch.manual_seed(0)
    built = getattr(transformers, config_class)(**config)
    model = (
        getattr(transformers, model_class)(built, add_pooling_layer=False)
        if not pooler
        else getattr(transformers, model_class)(built)
    )
    folder = tmp_path / f"{case}{'' if pooler else '-nopooler'}"
    model.save_pretrained(folder)
    return folder


def _entry(folder: Path) -> dict:
    return {"family": "transformers", "hf_id": folder.name, "weights": str(folder)}


@pytest.mark.parametrize("case", sorted(BARE))
def test_a_bare_checkpoint_classifies_as_its_family_class_does_with_a_new_seeded_head(
    tmp_path: Path, case: str
) -> None:
    folder = _bare_folder(tmp_path, case)
    saved = transformers.AutoModel.from_pretrained(folder).state_dict()

    def classifier(seed: int) -> tuple[torch.nn.Module, list[str]]:
        torch.manual_seed(seed)
        bare = build_model(text_model_spec(case, _entry(folder)))
        return sequence_classifier(bare, 3, pad_token_id=0)

    model, drawn = classifier(0)
    model.eval()
    assert type(model).__name__.endswith("ForSequenceClassification")
    # Every backbone weight is the checkpoint's; the head is what was drawn.
    backbone = model.base_model.state_dict()
    assert all(torch.equal(backbone[k], v) for k, v in saved.items() if k in backbone)
    head = {n: p for n, p in model.named_parameters() if n in drawn}
    assert head and all(
        not n.startswith(model.base_model_prefix + ".") or "pooler" in n for n in head
    )
    again, _ = classifier(0)
    other, _ = classifier(1)
    assert all(torch.equal(p, dict(again.named_parameters())[n]) for n, p in head.items())
    assert any(not torch.equal(p, dict(other.named_parameters())[n]) for n, p in head.items())
    # Independent: transformers' own class from the folder, given the same head.
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=3, pad_token_id=0
    )
    reference.load_state_dict(model.state_dict())
    reference.eval()
    ids = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    attention = (ids != 0).long()
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=attention).logits
        theirs = reference(input_ids=ids, attention_mask=attention).logits
    torch.testing.assert_close(ours, theirs)  # float32; the attention kernels may differ


def test_a_checkpoint_without_the_pooler_gets_one_drawn_and_says_so(tmp_path: Path, caplog) -> None:
    folder = _bare_folder(tmp_path, "bert", pooler=False)
    with caplog.at_level("INFO"):
        bare = build_model(text_model_spec("bert", _entry(folder)))
    assert sum("holds no pooler" in r.getMessage() for r in caplog.records) == 1
    _, drawn = sequence_classifier(bare, 2, 0)
    assert drawn == [
        "bert.pooler.dense.bias",
        "bert.pooler.dense.weight",
        "classifier.bias",
        "classifier.weight",
    ]


def test_a_checkpoint_missing_a_backbone_weight_is_still_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = _bare_folder(tmp_path, "bert")
    weights = load_file(folder / "model.safetensors")
    del weights["encoder.layer.1.output.dense.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ValueError, match=r"1 missing weight\(s\): encoder.layer.1.output.dense.weight"
    ):
        build_model(text_model_spec("bert", _entry(folder)))


# --- runs ------------------------------------------------------------------------------------


def _training(spec: dict, steps: int = 24, **overrides) -> TrainingSettings:
    values = {
        "model_spec": spec, "optimizer": "adamw", "steps": steps, "val_every": steps // 2,
        "batch_size": 8, "micro_batch_size": 4, "warmup_steps": 2, "log_every": 1,
        "device": "cpu", "val_fraction": 0.25,
    }  # fmt: skip
    return TrainingSettings(**{**values, **overrides})


@pytest.mark.parametrize("case", ["gpt2", "bert"])
def test_a_classification_run_learns_and_reports_like_an_image_run(
    tmp_path: Path, case: str
) -> None:
    folder = _bare_folder(tmp_path, case)
    source = TextSource(
        TextFinetuneSettings(tokenizer="bytes", sequence_length=12),
        write_first_byte_csv(tmp_path / "learnable.csv"),
        "learnable",
        labelled=True,
    )
    run = Run("x", case, "learnable", "full", 3e-3, 0)
    summary = train_runs([(run, tmp_path / "run")], _training(_entry(folder), steps=40), source)[0]
    metrics = pl.read_parquet(tmp_path / "run" / "metrics.parquet")
    assert {"val_accuracy", "test_accuracy"} <= set(metrics.columns)
    assert summary["best_val_accuracy"] == 1.0 and summary["test_accuracy"] == 1.0
    assert "sequences_per_second" in summary and "mask_probability" not in summary["settings"]


def test_the_mask_probability_is_refused_with_labelled_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from vitplasticity import cli

    argv = [
        "finetune", "--experiment", "x", "--model", "m", "--dataset", "d",
        "--model-spec", "{}", "--labelled-text", str(tmp_path), "--mask-probability", "0.3",
        "--steps", "2", "--val-every", "1",
        "--configuration", "ln1", "--lr", "0.1", "--seed", "0", "--out-dir", str(tmp_path / "o"),
    ]  # fmt: skip
    assert cli.main(argv) == 2
    assert "finetune: --mask-probability goes with --text (an encoder's masked-LM" in caplog.text
    assert not (tmp_path / "o").exists()


def test_the_real_minilm_learns_licences_from_its_layer_norms_alone(
    tmp_path: Path, minilm_folder: Path
) -> None:
    """sentence-transformers all-MiniLM-L6-v2, a bare BertModel with its pooler: the LN1
    configuration (its pre-attention LayerNorms, the pooler and a new head) classifies
    licence paragraphs of three licences better than the majority class within 20 steps."""
    data = write_licence_csv(tmp_path / "licences.csv")
    source = TextSource(TextFinetuneSettings(sequence_length=64), data, "licences", labelled=True)
    run = Run("x", "minilm", "licences", "ln1", 1e-2, 0)
    training = _training(_entry(minilm_folder), steps=20, batch_size=16, micro_batch_size=16)
    summary = train_runs([(run, tmp_path / "run")], training, source)[0]
    labels = np.array([label for _, label in licence_paragraphs()])
    majority = max(np.mean(labels == name) for name in set(labels))
    assert summary["test_accuracy"] > majority + 0.1, (summary, majority)


# --- a new LM head on a bare checkpoint ------------------------------------------------------

LM_CASES = {
    # id: (bare folder case, config changes, the task, the head drawn)
    "gpt2-tied": ("gpt2", {}, "causal", []),
    "llama-untied": ("llama", {"tie_word_embeddings": False}, "causal", ["lm_head.weight"]),
    "bert": ("bert", {}, "masked", ["cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias"]),
    "deberta_v2": ("deberta_v2", {}, "masked", ["cls.predictions.bias", "cls.predictions.transform.dense.weight"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(LM_CASES))
def test_a_bare_checkpoint_finetunes_as_a_language_model_with_a_new_head_where_it_has_none(
    tmp_path: Path, case: str
) -> None:
    folder_case, changes, task, drawn_some = LM_CASES[case]
    config_class, model_class, config = BARE[folder_case]
    torch.manual_seed(0)
    built = getattr(transformers, model_class)(
        getattr(transformers, config_class)(**{**config, **changes})
    )
    folder = tmp_path / case
    built.save_pretrained(folder)
    text = tmp_path / "pattern.txt"
    text.write_text(("abcdefgh" * 3 + "\n") * 40)
    source = TextSource(
        TextFinetuneSettings(tokenizer="bytes", sequence_length=12), text, "pattern"
    )
    run = Run("x", case, "pattern", "full", 3e-3, 0)
    summary = train_runs([(run, tmp_path / "run")], _training(_entry(folder), steps=16), source)[0]
    assert summary["task"] == task
    metrics = pl.read_parquet(tmp_path / "run" / "metrics.parquet").drop_nulls("val_loss")
    assert metrics["val_loss"][-1] < metrics["val_loss"][0]
    head = summary["settings"]["resolved"]["lm_head"]
    if drawn_some:
        assert head.startswith("initialised from the run seed, not loaded")
        assert all(name in head for name in drawn_some)
    else:
        assert head.startswith("the checkpoint's")
