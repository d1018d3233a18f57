"""Text for GPT2 plasticity: read a text file, tokenize it, cut it into fixed-length sequences.

A text file holds one document per line (e.g. a WikiText dump). Its non-empty lines are
tokenized in file order, each followed by the tokens of a newline, and the token stream is cut
into consecutive sequences of ``sequence_length`` tokens (the remainder is dropped). Pairing
follows the image plasticity (the reference code's rule): pair i is reference sequence i with
downstream sequence i, the downstream sequences cycled when there are fewer.

Tokenizers: ``bytes`` is a built-in byte-level fallback for random-init models (no download):
token id = UTF-8 byte value mod ``vocab_size``. Anything else is a transformers tokenizer, by
hub id or local folder (``AutoTokenizer.from_pretrained``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

BYTE_TOKENIZER = "bytes"
"""The built-in byte-level tokenizer's name."""

Tokenize = Callable[[str], list[int]]
"""A tokenizer: text to token ids."""


def byte_tokenizer(vocab_size: int) -> Tokenize:
    """The byte-level fallback: each UTF-8 byte of the text is one token, id = byte mod vocab.

    Raises:
        ValueError: when ``vocab_size`` < 1.
    """
    if vocab_size < 1:
        raise ValueError(f"byte tokenizer: vocab_size must be >= 1, got {vocab_size}")

    def tokenize(text: str) -> list[int]:
        return [byte % vocab_size for byte in text.encode("utf-8")]

    return tokenize


def load_tokenizer(name: str, vocab_size: int) -> Tokenize:
    """The tokenizer ``name``: ``bytes`` (built-in, mod ``vocab_size``), else a transformers
    tokenizer by hub id or local folder.

    Raises:
        ImportError: naming the optional extra when transformers is missing.
        ValueError: when a transformers tokenizer yields ids the model has no embedding for,
            or ``name`` is a folder without tokenizer files (naming it and what it lacks).
    """
    if name == BYTE_TOKENIZER:
        return byte_tokenizer(vocab_size)
    tokenizer = transformers_tokenizer(name, vocab_size)

    def tokenize(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return tokenize


def transformers_tokenizer(name: str, vocab_size: int) -> Any:
    """The transformers tokenizer ``name`` (hub id or local folder), checked against the
    model's ``vocab_size``.

    Raises:
        ImportError: naming the optional extra when transformers is missing.
        ValueError: when it has more tokens than the model has embeddings, or ``name`` is a
            folder without tokenizer files (naming it and what it lacks).
    """
    if Path(name).is_dir():
        check_tokenizer_folder(Path(name))
    from vitplasticity.utils.optional import require_transformers

    tokenizer = require_transformers().AutoTokenizer.from_pretrained(name)
    if len(tokenizer) > vocab_size:
        raise ValueError(
            f"tokenizer {name!r} has {len(tokenizer)} tokens, more than the model's vocab_size "
            f"{vocab_size}"
        )
    return tokenizer


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""A saved transformers tokenizer's own files (``save_pretrained`` writes both)."""
VOCABULARY_FILES = ("vocab.json", "vocab.txt", "*.model")
"""The vocabulary files from which transformers can build a tokenizer without them: a
byte-level BPE's vocab.json (with merges.txt), WordPiece's vocab.txt, a SentencePiece model."""


def check_tokenizer_folder(folder: Path) -> None:
    """Raise unless ``folder`` holds a tokenizer's own files or a vocabulary to build one from.

    Raises:
        ValueError: naming the folder, the files it lacks and the remedy.
    """
    found = [
        pattern for pattern in (*TOKENIZER_FILES, *VOCABULARY_FILES) if any(folder.glob(pattern))
    ]
    if found:
        return
    raise ValueError(
        f"{str(folder)!r}, the tokenizer's folder (a model's weights folder when its "
        f"tokenizer is auto), has no tokenizer files: none of "
        f"{', '.join((*TOKENIZER_FILES, *VOCABULARY_FILES))}; save the model's tokenizer there "
        "(tokenizer.save_pretrained(folder)), or set the dataset's tokenizer "
        "(datasets.<name>.tokenizer) to a tokenizer folder or to bytes"
    )


def _documents(path: Path) -> Iterator[str]:
    """The non-empty lines of ``path`` as UTF-8 text (a line ends at ``\\n``, ``\\r\\n`` or
    ``\\r``, as Python's universal newlines), read in binary to know where a bad byte is.

    Raises:
        ValueError: naming the file, the line and byte offset of the first byte that is not
            UTF-8, and the remedy.
    """
    offset = 0
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    _not_utf8(path, number, offset + error.start, raw[error.start])
                ) from None
            offset += len(raw)
            for document in line.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
                if document.strip():
                    yield document


def _not_utf8(path: Path, line: int, offset: int, byte: int) -> str:
    """The message of a text file with a byte that is not UTF-8."""
    return (
        f"{path}: not UTF-8 text: byte 0x{byte:02x} at byte offset {offset} (line {line}); "
        f"convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8 {path} > {path}.utf8, if it "
        "is Latin-1) and point the config at the converted file"
    )


def read_sequences(
    path: str | Path,
    tokenize: Tokenize,
    sequence_length: int,
    max_sequences: int | None = None,
) -> np.ndarray:
    """The token sequences (N, sequence_length) of a text file, in file order (int64).

    Reading stops once ``max_sequences`` sequences are complete, so a large dump costs only
    the tokens used.

    Raises:
        FileNotFoundError: naming ``path`` when it is not a file.
        ValueError: when ``sequence_length`` < 1, the file holds fewer tokens than one
            sequence (naming the file and its token count), or a byte that is not UTF-8
            before the sequences are complete (naming the file, the line and the offset).
    """
    path = Path(path)
    if sequence_length < 1:
        raise ValueError(f"sequence_length must be >= 1, got {sequence_length}")
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    return cut_documents(_documents(path), tokenize, sequence_length, max_sequences, str(path))


def cut_documents(
    documents: Iterable[str],
    tokenize: Tokenize,
    sequence_length: int,
    max_sequences: int | None = None,
    where: str = "text",
) -> np.ndarray:
    """The token sequences (N, sequence_length) of ``documents`` as a text file's lines are
    cut (:func:`read_sequences`): each document's tokens and a newline's, one stream cut into
    sequences, the remainder dropped; ``where`` names them in an error.

    Raises:
        ValueError: when they hold fewer tokens than one sequence.
    """
    newline = tokenize("\n")
    needed = None if max_sequences is None else max_sequences * sequence_length
    tokens: list[int] = []
    for document in documents:
        tokens.extend(tokenize(document))
        tokens.extend(newline)
        if needed is not None and len(tokens) >= needed:
            break
    n_sequences = len(tokens) // sequence_length
    if max_sequences is not None:
        n_sequences = min(n_sequences, max_sequences)
    if n_sequences == 0:
        raise ValueError(
            f"{where}: {len(tokens)} tokens, fewer than one sequence of {sequence_length}"
        )
    kept = np.asarray(tokens[: n_sequences * sequence_length], dtype=np.int64)
    return kept.reshape(n_sequences, sequence_length)


def cycled(sequences: np.ndarray, n: int) -> np.ndarray:
    """``n`` sequences: sequence i is ``sequences[i mod len(sequences)]`` (the pairing rule).

    Raises:
        ValueError: when ``sequences`` is empty or ``n`` < 1.
    """
    if len(sequences) == 0:
        raise ValueError("no sequences to cycle")
    if n < 1:
        raise ValueError(f"number of sequences must be >= 1, got {n}")
    return sequences[np.arange(n) % len(sequences)]


def split_sequences(sequences: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) sequences of a text file for finetuning, split deterministically.

    The rule: sequence i (in file order) is a validation sequence when
    ``floor((i + 1) * val_fraction) > floor(i * val_fraction)``, so ``floor(n * val_fraction)``
    of the ``n`` sequences go to validation, spread evenly over the file (every
    ``1 / val_fraction``-th one): a file whose topic drifts has its validation sequences drawn
    from all of it, not from its end alone. No seed: every run of every configuration is
    validated on the same sequences, so their losses compare.

    Raises:
        ValueError: when ``val_fraction`` is not in (0, 1), or the split leaves no training or
            no validation sequence (naming the count).
    """
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    index = np.arange(len(sequences))
    is_val = np.floor((index + 1) * val_fraction) > np.floor(index * val_fraction)
    n_val = int(is_val.sum())
    if n_val == 0 or n_val == len(sequences):
        raise ValueError(
            f"{len(sequences)} sequences: a val_fraction of {val_fraction} leaves "
            f"{n_val} for validation and {len(sequences) - n_val} for training; both need one "
            "(a longer text, shorter sequences or another val_fraction)"
        )
    return sequences[~is_val], sequences[is_val]
