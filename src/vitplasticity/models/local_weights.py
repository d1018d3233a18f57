"""The checksum record of a local ``weights:`` file or folder: what makes it a tracked input.

A model entry's ``weights: <path>`` is read by every compute job of the model, but Snakemake
tracks a file by its mtime and a folder by its own (which changes only when an entry is added
or removed), so replacing the weights would rerun nothing, or touching them would rerun
everything. The workflow therefore makes every such job read
``<resources>/weights/<model>/local.sha256.json`` (:data:`RECORD_FILENAME`): the path and each
file's sha256 and size, rewritten only when that content changes, so that its mtime moves
exactly when the weights do.

It is written while Snakemake builds the DAG (the jobs' input function calls
:func:`update_record`), not by a rule: Snakemake removes a rule's outputs before its job runs
and reruns every job downstream of a job it runs, so no rule can leave the record untouched
when the weights are unchanged. A stat cache beside it (:data:`STAT_CACHE_FILENAME`, no job's
input) spares rehashing files whose size and mtime are unchanged: each SLURM job re-parses the
workflow.

Importing this module imports neither torch nor timm: the workflow's rules use it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitplasticity.models.weights import sha256_file
from vitplasticity.utils.io import write_json

RECORD_FILENAME = "local.sha256.json"
STAT_CACHE_FILENAME = "local.stat.json"


def weights_files(source: Path) -> list[Path]:
    """The files of a local weights ``source``: itself (a file), or every file below it (a
    folder, sorted by path: config, tokenizer and weights alike shape the results)."""
    if source.is_file():
        return [source]
    return sorted(path for path in source.rglob("*") if path.is_file())


def content_record(source: str | Path, stat_cache: dict[str, Any] | None = None) -> dict:
    """The checksum record of ``source``: its path and, per file, the path (relative to a
    folder), size and sha256.

    Args:
        source: the local weights file or folder.
        stat_cache: file path -> {size, mtime_ns, sha256} of an earlier hashing, reused for
            files whose size and mtime are unchanged; updated in place with this one's.

    Raises:
        FileNotFoundError: naming ``source``, when it is neither a file nor a folder.
    """
    source = Path(source)
    if not source.exists():
        raise FileNotFoundError(f"local weights {str(source)!r} do not exist")
    cache = {} if stat_cache is None else stat_cache
    files = []
    for path in weights_files(source):
        stat = path.stat()
        known = cache.get(str(path))
        if not (known and (known["size"], known["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns)):
            known = {
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": sha256_file(path),
            }
            cache[str(path)] = known
        name = path.name if path == source else path.relative_to(source).as_posix()
        files.append({"path": name, "size": known["size"], "sha256": known["sha256"]})
    return {"source": str(source), "files": files}


def update_record(source: str | Path, folder: str | Path) -> Path:
    """Write ``folder``'s checksum record of ``source`` unless it already says the same; return
    its path. The record keeps its mtime while the content of ``source`` is unchanged.

    Raises:
        FileNotFoundError: naming ``source``, when it does not exist.
    """
    folder = Path(folder)
    record_path, cache_path = folder / RECORD_FILENAME, folder / STAT_CACHE_FILENAME
    cache = _read_json(cache_path) or {}
    record = content_record(source, cache)
    if _read_json(record_path) != record:
        write_json(record_path, record)
    if _read_json(cache_path) != cache:
        write_json(cache_path, cache)
    return record_path


def _read_json(path: Path) -> Any:
    """The JSON in ``path``; None when it is missing or unreadable (then rewritten)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
