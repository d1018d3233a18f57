"""Atomic writes: the file appears whole or not at all, with the mode of any new file."""

from __future__ import annotations

import os
import stat

import polars as pl
import pytest

from vitplasticity import io


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_written_files_get_the_umask_mode(tmp_path, mask):
    previous = os.umask(mask)
    try:
        io.write_json(tmp_path / "a.json", {"x": 1})
        io.write_parquet(tmp_path / "a.parquet", pl.DataFrame({"x": [1]}))
        plain = tmp_path / "plain"
        plain.write_text("")  # what open() gives a new file under this umask
    finally:
        os.umask(previous)
    expected = stat.S_IMODE(plain.stat().st_mode)
    assert expected == 0o666 & ~mask
    for name in ("a.json", "a.parquet"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.json"
    with pytest.raises(RuntimeError), io.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == []
