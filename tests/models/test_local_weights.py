"""vitplasticity.models.local_weights: the checksum record of a local weights file or folder is
rewritten exactly when the content changes, so that its mtime tells Snakemake when to rerun."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from vitplasticity.models.local_weights import RECORD_FILENAME, content_record, update_record


def _touch(path: Path) -> None:
    os.utime(path, (2e9, 2e9))


def _rewrite_same(path: Path) -> None:
    path.write_bytes(path.read_bytes())
    _touch(path)


def _replace(path: Path) -> None:
    path.write_bytes(b"other weights")
    _touch(path)


def _add_file(path: Path) -> None:
    (path.parent / "tokenizer.json").write_text("{}")


def _remove_file(path: Path) -> None:
    path.unlink()


# (case, weights as a folder, what is done to its first file, whether the record changes)
CASES = [
    ("file touched", False, _touch, False),
    ("file rewritten with the same bytes", False, _rewrite_same, False),
    ("file replaced", False, _replace, True),
    ("folder file touched", True, _touch, False),
    ("folder file replaced", True, _replace, True),
    ("folder gains a file", True, _add_file, True),
    ("folder loses a file", True, _remove_file, True),
]


@pytest.mark.parametrize(
    ("folder", "change", "changes"), [case[1:] for case in CASES], ids=[c[0] for c in CASES]
)
def test_the_record_changes_exactly_when_the_content_does(
    tmp_path: Path, folder: bool, change: Callable[[Path], None], changes: bool
) -> None:
    weights = tmp_path / "model"
    if folder:
        weights.mkdir()
        (weights / "config.json").write_text('{"model_type": "x"}')
        (weights / "model.safetensors").write_bytes(b"weights")
        first = weights / "model.safetensors"
    else:
        weights = first = tmp_path / "model.safetensors"
        first.write_bytes(b"weights")
    record = update_record(weights, tmp_path / "resources")
    os.utime(record, (1e9, 1e9))
    before = record.read_text()

    change(first)
    assert update_record(weights, tmp_path / "resources") == record

    assert (record.stat().st_mtime != 1e9) is changes
    assert (record.read_text() != before) is changes
    assert json.loads(record.read_text()) == content_record(weights)


def test_the_record_holds_each_files_sha256_and_size(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m/sub").mkdir()
    contents = {"config.json": b"{}", "sub/model.safetensors": b"abc"}
    for name, data in contents.items():
        (tmp_path / "m" / name).write_bytes(data)
    update_record(tmp_path / "m", tmp_path / "r")
    assert json.loads((tmp_path / "r" / RECORD_FILENAME).read_text()) == {
        "source": str(tmp_path / "m"),
        "files": [
            {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in sorted(contents.items())
        ],
    }


def test_missing_weights_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        update_record(tmp_path / "nowhere", tmp_path / "r")
