"""Labelled text for classification (a dataset entry of ``source: labelled_text``): documents
with a class label, read from the user's files, split as an image folder is, and tokenized by
the model's own tokenizer into fixed-length sequences with an attention mask.

``path`` is one of:

- a ``.csv`` file with a header naming a ``text`` and a ``label`` column, or a ``.jsonl`` file
  of objects with ``text`` and ``label`` keys: one document per row;
- a folder with ``train.csv`` and ``test.csv`` (or ``.jsonl``): the pool and test splits;
- a folder of class folders of ``.txt`` files (``<class>/<document>.txt``), or ``train/`` and
  ``test/`` folders of class folders: one document per file.

Without a test file or folder, the fixed seed-42 80/20 split of the image folders
(:func:`vitplasticity.data.store.fixed_split`) makes the pool and test splits; a run then
splits the pool into training and validation by its seed, as an image run does. The classes
are the labels' sorted names (as integers when every label is one), so ``label`` 10 follows 9.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.store import fixed_split

# The source's name is declared once, beside text_file's, where the torch-free workflow reads
# it; imported here so that the reader's module names its source too.
from vitplasticity.settings.sequences import LABELLED_SOURCE as LABELLED_SOURCE

TABLE_SUFFIXES = (".csv", ".jsonl")
"""The file formats of a table of documents and labels."""

BYTE_PAD_ID = 0
"""The padding id of the byte tokenizer's classification sequences: byte b is id
``1 + b mod (vocab - 1)``, so no byte is the padding (a decoder's classifier reads the last
token that is not the padding)."""


@dataclass(frozen=True)
class LabelledSplit:
    """The documents of a split and their class indices (int64, N)."""

    texts: tuple[str, ...]
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class LabelledDataset:
    """The pool and test splits of a labelled text dataset and its class names."""

    classes: tuple[str, ...]
    pool: LabelledSplit
    test: LabelledSplit
    split_rule: str
    """How the test split was made (its files, or the fixed seeded split)."""


def read_labelled(path: str | Path) -> LabelledDataset:
    """The labelled dataset at ``path`` (the module's formats).

    Raises:
        FileNotFoundError: naming ``path`` when it is missing or holds no documents.
        ValueError: naming the file (and row) of a bad document: a missing column, an empty
            text or label, a row that is not JSON, text that is not UTF-8; fewer than two
            classes; a test label the pool does not have.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"labelled text dataset {root} does not exist")
    if root.is_file():
        return _fixed_split(_read_table(root))
    tables = {split: _table_in(root, split) for split in ("train", "test")}
    if tables["train"] and tables["test"]:
        pool, test = _read_table(tables["train"]), _read_table(tables["test"])
        return _named_splits(
            pool, test, f"the files {tables['train'].name} and {tables['test'].name}"
        )
    if (root / "train").is_dir() and (root / "test").is_dir():
        pool, test = _read_class_folders(root / "train"), _read_class_folders(root / "test")
        return _named_splits(pool, test, "the folders train/ and test/")
    return _fixed_split(_read_class_folders(root))


def layout_problem(path: str | Path) -> str | None:
    """What makes ``path`` no labelled dataset, told from its names alone (no document is
    read: the workflow asks when it parses the config, before any job), as a phrase after the
    path ("does not exist"); None when it has one of the module's layouts. A document's own
    problems are :func:`read_labelled`'s."""
    root = Path(path)
    if not root.exists():
        return "does not exist"
    if root.is_file():
        if root.suffix in TABLE_SUFFIXES:
            return None
        return (
            f"is a {root.suffix or 'suffix-less'} file, not a {' or '.join(TABLE_SUFFIXES)} table"
        )
    if _table_in(root, "train") and _table_in(root, "test"):
        return None
    splits = [root / "train", root / "test"]
    if all(folder.is_dir() for folder in splits):
        empty = [f"{folder.name}/" for folder in splits if next(_class_files(folder), None) is None]
        if empty:
            verb = "holds" if len(empty) == 1 else "hold"
            return f"is a folder whose {' and '.join(empty)} {verb} no <class>/<document>.txt files"
        return None
    if next(_class_files(root), None) is None:
        return (
            "is a folder of neither train and test tables (train.csv and test.csv, or .jsonl) "
            "nor <class>/<document>.txt files"
        )
    return None


def _table_in(root: Path, split: str) -> Path | None:
    found = [
        root / f"{split}{suffix}"
        for suffix in TABLE_SUFFIXES
        if (root / f"{split}{suffix}").is_file()
    ]
    return found[0] if found else None


Rows = list[tuple[str, str]]
"""(text, label) of each document, in file order."""


def _read_table(path: Path) -> Rows:
    if path.suffix not in TABLE_SUFFIXES:
        raise ValueError(
            f"labelled text file {path}: expected a {' or '.join(TABLE_SUFFIXES)} file, or a "
            "folder of class folders of .txt files"
        )
    try:
        rows = list(_csv_rows(path) if path.suffix == ".csv" else _jsonl_rows(path))
    except UnicodeDecodeError as error:
        raise ValueError(f"labelled text file {path}: not UTF-8 text ({error.reason})") from None
    if not rows:
        raise FileNotFoundError(f"labelled text file {path}: no documents")
    return rows


def _checked_row(text: object, label: object, where: str) -> tuple[str, str]:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: the text is empty or not a string")
    if label is None or isinstance(label, (dict, list)) or not str(label).strip():
        raise ValueError(f"{where}: the label is empty or not a string or number")
    return text, str(label).strip()


def _csv_rows(path: Path) -> Iterator[tuple[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("text", "label") if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(
                f"labelled text file {path}: its header {reader.fieldnames} lacks the column(s) "
                f"{missing} (a header row naming 'text' and 'label')"
            )
        for row in reader:
            yield _checked_row(row["text"], row["label"], f"{path}, line {reader.line_num}")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, str]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error.msg})") from None
            if not isinstance(row, dict) or "text" not in row or "label" not in row:
                raise ValueError(f"{where}: expected an object with 'text' and 'label' keys")
            yield _checked_row(row["text"], row["label"], where)


def _class_files(root: Path) -> Iterator[tuple[str, Path]]:
    """(class, file) of every ``<class>/<document>.txt`` in ``root``, in sorted order."""
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        for file in sorted(folder.glob("*.txt")):
            yield folder.name, file


def _read_class_folders(root: Path) -> Rows:
    rows: Rows = []
    for label, file in _class_files(root):
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(
                f"labelled text file {file}: not UTF-8 text ({error.reason})"
            ) from None
        rows.append(_checked_row(text, label, str(file)))
    if not rows:
        raise FileNotFoundError(
            f"labelled text folder {root}: no <class>/<document>.txt files (nor train.csv and "
            "test.csv, or .jsonl)"
        )
    return rows


def class_names(labels: Sequence[str]) -> tuple[str, ...]:
    """The sorted distinct ``labels``: numerically when every one is an integer."""
    distinct = set(labels)
    if all(label.lstrip("-").isdigit() for label in distinct):
        return tuple(sorted(distinct, key=int))
    return tuple(sorted(distinct))


def _split(rows: Rows, classes: tuple[str, ...]) -> LabelledSplit:
    index = {name: i for i, name in enumerate(classes)}
    labels = np.array([index[label] for _, label in rows], dtype=np.int64)
    return LabelledSplit(tuple(text for text, _ in rows), labels)


def _check_classes(classes: tuple[str, ...], where: str) -> None:
    if len(classes) < 2:
        raise ValueError(
            f"{where}: {len(classes)} class(es) {list(classes)}; classification needs two"
        )


def _fixed_split(rows: Rows) -> LabelledDataset:
    classes = class_names([label for _, label in rows])
    _check_classes(classes, "labelled text dataset")
    everything = _split(rows, classes)
    pool, test = fixed_split(len(rows), 42, 0.2)
    parts = [
        LabelledSplit(tuple(everything.texts[i] for i in idx), everything.labels[idx])
        for idx in (pool, test)
    ]
    return LabelledDataset(classes, parts[0], parts[1], "the fixed seed-42 80/20 split")


def _named_splits(pool: Rows, test: Rows, rule: str) -> LabelledDataset:
    classes = class_names([label for _, label in pool])
    _check_classes(classes, f"labelled text dataset (the training split of {rule})")
    unknown = sorted({label for _, label in test} - set(classes))
    if unknown:
        raise ValueError(
            f"labelled text dataset ({rule}): the test split has label(s) {unknown[:5]} that "
            "the training split does not"
        )
    return LabelledDataset(classes, _split(pool, classes), _split(test, classes), rule)


@dataclass(frozen=True)
class EncodedTexts:
    """Documents as token ids (N, L) int64, right-padded, and their attention mask (N, L)
    int64 (1 for a token, 0 for padding)."""

    ids: np.ndarray
    attention: np.ndarray
    truncated: int  # how many documents were longer than L tokens (their end is cut)


def encode_texts(
    texts: Sequence[str], tokenizer: str, vocab_size: int, sequence_length: int
) -> tuple[EncodedTexts, int]:
    """(``texts`` tokenized to ``sequence_length`` tokens each, the padding id).

    ``tokenizer`` is ``bytes`` (byte b is id ``1 + b mod (vocab_size - 1)``, the padding
    :data:`BYTE_PAD_ID`) or a transformers tokenizer (hub id or folder), which adds its
    special tokens as its model's sequence classifier expects them (BERT's ``[CLS]`` first),
    truncates and pads with its padding token (its end-of-sequence token where it has none,
    GPT2's).

    Raises:
        ValueError: for a tokenizer with more tokens than the model, or with neither a
            padding nor an end-of-sequence token; a vocabulary below 2 for bytes.
    """
    from vitplasticity.data.text import BYTE_TOKENIZER

    if tokenizer == BYTE_TOKENIZER:
        if vocab_size < 2:
            raise ValueError(f"byte tokenizer: vocab_size must be >= 2, got {vocab_size}")
        rows = [[1 + b % (vocab_size - 1) for b in text.encode("utf-8")] for text in texts]
        return _padded(rows, sequence_length, BYTE_PAD_ID), BYTE_PAD_ID
    loaded = padded_tokenizer(tokenizer, vocab_size)
    # The tokenizer's own truncation keeps its special tokens (BERT's [SEP] stays last).
    full = loaded(list(texts), add_special_tokens=True, verbose=False)["input_ids"]
    cut = loaded(list(texts), add_special_tokens=True, truncation=True, max_length=sequence_length)
    encoded = _padded([list(ids) for ids in cut["input_ids"]], sequence_length, loaded.pad_token_id)
    truncated = sum(len(ids) > sequence_length for ids in full)
    return dataclasses.replace(encoded, truncated=truncated), int(loaded.pad_token_id)


def padding_id(tokenizer: str, vocab_size: int) -> int:
    """The id :func:`encode_texts` pads with (a decoder's classifier reads the last other)."""
    from vitplasticity.data.text import BYTE_TOKENIZER

    if tokenizer == BYTE_TOKENIZER:
        return BYTE_PAD_ID
    return int(padded_tokenizer(tokenizer, vocab_size).pad_token_id)


def padded_tokenizer(name: str, vocab_size: int) -> Any:
    """The transformers tokenizer ``name`` (:func:`vitplasticity.data.text.transformers_tokenizer`),
    its padding token its end-of-sequence token where it has none (GPT2's).

    Raises:
        ValueError: as that function, or for a tokenizer with neither token.
    """
    from vitplasticity.data.text import transformers_tokenizer

    loaded = transformers_tokenizer(name, vocab_size)
    if loaded.pad_token_id is None:
        if loaded.eos_token_id is None:
            raise ValueError(
                f"tokenizer {name!r} has neither a padding nor an end-of-sequence token: a "
                "batch of documents of different lengths cannot be padded"
            )
        loaded.pad_token = loaded.eos_token
    return loaded


def _padded(rows: list[list[int]], length: int, pad_id: int) -> EncodedTexts:
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    attention = np.zeros((len(rows), length), dtype=np.int64)
    truncated = 0
    for i, row in enumerate(rows):
        if len(row) > length:
            truncated += 1
            row = row[:length]  # the document's end is cut
        ids[i, : len(row)] = row
        attention[i, : len(row)] = 1
    return EncodedTexts(ids, attention, truncated)
