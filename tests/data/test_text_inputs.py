"""vitplasticity.data.text's refusals of bad text inputs, each naming the culprit and the
remedy: a text file that is not UTF-8 (the file, the line, the byte offset), and a tokenizer
folder without tokenizer files (a text model's weights folder saved without its tokenizer)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vitplasticity.data.text import byte_tokenizer, load_tokenizer, read_sequences

# (case, the file's bytes, the error's text, or None and the byte tokens read)
TEXTS = [
    ("Latin-1 on line 2", b"first line\ncaf\xe9\n", "byte 0xe9 at byte offset 14 (line 2)"),
    ("UTF-16 from its first byte", "hi\n".encode("utf-16"), "byte 0xff at byte offset 0 (line 1)"),
    ("a bad byte after a CRLF line", b"ok\r\nab\x80\n", "byte 0x80 at byte offset 6 (line 2)"),
    ("UTF-8 with CRLF and CR line ends", "é\r\ncd\ref\n".encode(), None),
]


@pytest.mark.parametrize(("data", "message"), [t[1:] for t in TEXTS], ids=[t[0] for t in TEXTS])
def test_a_text_file_that_is_not_utf8_is_named_with_its_line_and_offset(
    tmp_path: Path, data: bytes, message: str | None
) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    if message is None:
        # Universal newlines, as Python's text mode: each document followed by a newline.
        tokens = read_sequences(path, byte_tokenizer(256), 1)[:, 0].tolist()
        assert tokens == list("é\ncd\nef\n".encode())
        return
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        read_sequences(path, byte_tokenizer(256), 1)
    assert str(path) in str(error.value) and "convert the file to UTF-8" in str(error.value)
    assert "\n" not in str(error.value)


def _bert_tokenizer(folder: Path) -> None:
    transformers = pytest.importorskip("transformers")
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nab\ncd\n")
    transformers.BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)


def _weights_only(folder: Path) -> None:
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    (folder / "model.safetensors").write_bytes(b"")


# (case, what the folder holds, the error's text or None and the ids of "ab cd")
FOLDERS = [
    ("a weights folder without its tokenizer", _weights_only, "has no tokenizer files"),
    ("an empty folder", lambda folder: None, "has no tokenizer files"),
    ("a saved tokenizer", _bert_tokenizer, None),
]


@pytest.mark.parametrize(("fill", "message"), [f[1:] for f in FOLDERS], ids=[f[0] for f in FOLDERS])
def test_a_tokenizer_folder_without_tokenizer_files_is_named_with_what_it_lacks(
    tmp_path: Path, fill, message: str | None
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    fill(folder)
    if message is None:
        assert load_tokenizer(str(folder), 100)("ab cd") == [5, 6]
        return
    with pytest.raises(ValueError, match=message) as error:
        load_tokenizer(str(folder), 100)
    text = str(error.value)
    assert str(folder) in text and "tokenizer.json" in text and "tokenizer_config.json" in text
