"""A packed job's finished runs, kept until the whole pack is done.

Snakemake sees a pack (``finetune --runs``) as one job: when it is interrupted it deletes
every output of the job, the finished runs' too, and a rerun starts the job afresh. So a
packed run, once its summary.json and metrics.parquet are written, also keeps a copy of them
in ``<run>/pack_finished/`` with a record of the settings' fingerprint and each file's SHA-256.
A rerun of the pack puts a run's files back from a copy that matches its settings and its
hashes instead of training it again, and the job removes the copies once all its runs are
done, leaving each run folder as an unpacked run leaves it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from vitplasticity.utils.io import atomic_path, write_json

log = logging.getLogger(__name__)

KEPT_DIR = "pack_finished"
OUTPUTS = ("summary.json", "metrics.parquet")
RECORD = "record.json"  # written last: a copy without it is incomplete


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(source: Path, target: Path) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def keep(out_dir: Path, key: str) -> None:
    """Copy the finished run's outputs in ``out_dir`` aside, recorded with the settings
    fingerprint ``key``."""
    kept = out_dir / KEPT_DIR
    kept.mkdir(exist_ok=True)
    (kept / RECORD).unlink(missing_ok=True)
    for name in OUTPUTS:
        _copy(out_dir / name, kept / name)
    hashes = {name: _sha256(kept / name) for name in OUTPUTS}
    write_json(kept / RECORD, {"fingerprint": key, "sha256": hashes})


def restore(out_dir: Path, key: str) -> bool:
    """Put back the outputs of a run finished earlier with settings ``key``; False (nothing
    changed) when there is no complete copy of them with those settings."""
    kept = out_dir / KEPT_DIR
    try:
        record = json.loads((kept / RECORD).read_text())
    except (OSError, ValueError):
        return False
    if record.get("fingerprint") != key:
        log.warning("%s was kept by other settings; training the run", kept)
        return False
    hashes = record.get("sha256", {})
    if any(not (kept / n).is_file() or _sha256(kept / n) != hashes.get(n) for n in OUTPUTS):
        log.warning("%s: a kept file is missing or altered; training the run", kept)
        return False
    for name in OUTPUTS:
        _copy(kept / name, out_dir / name)
    return True


def discard(out_dir: Path) -> None:
    """Remove the copies of ``out_dir`` (once its pack is done)."""
    shutil.rmtree(out_dir / KEPT_DIR, ignore_errors=True)
