"""Atomic file writing: a killed job never leaves a file that looks complete."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it, so set it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only on success.

    The temporary file lives in the same directory so that the final ``os.replace`` is an
    atomic rename on POSIX file systems. On any exception the temporary file is removed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    # mkstemp creates the file 0600; a result must get the mode any new file gets (the
    # umask's), or collaborators on a shared cluster file system cannot read it.
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """Write ``payload`` as indented, key-sorted JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def write_parquet(
    path: str | os.PathLike[str], frame: pl.DataFrame, metadata: dict[str, Any] | None = None
) -> None:
    """Write ``frame`` to Parquet atomically, with ``metadata`` JSON-encoded in the footer.

    Each metadata value is stored under its key as a JSON string, so that
    :func:`read_parquet_metadata` gives back the original structure.
    """
    import pyarrow.parquet as pq

    table = frame.to_arrow()
    if metadata:
        encoded = {k: json.dumps(v, sort_keys=True, default=str) for k, v in metadata.items()}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **encoded})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read the JSON metadata that :func:`write_parquet` stored in a Parquet footer."""
    import pyarrow.parquet as pq

    raw = pq.read_schema(path).metadata or {}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.decode()
        if name.startswith("ARROW:") or name == "pandas":
            continue
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value.decode()
    return out
