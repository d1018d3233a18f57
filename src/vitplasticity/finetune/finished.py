"""A finished run's verified copy, kept in its folder outside the job's declared outputs.

Snakemake deletes every output of an interrupted job: a pack's (``finetune --runs``, one job)
and, on a cluster, every job of a cancelled group job (the profile's ``groups:``), the
finished runs' too. So every run, packed or not, once its summary.json and metrics.parquet are
written, keeps a copy of them in ``<run>/finished/`` with a record of the settings'
fingerprint, the code that trained it and each file's SHA-256. A later job of the same run
puts the files back from a copy that matches its settings, its code and its hashes instead of
training the run again. The copy stays (it is not an output, so no clean-up removes it): a
run is trained again only when its folder, or its ``finished/``, is deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from vitplasticity.provenance import git_commit
from vitplasticity.utils.io import atomic_path, write_json
from vitplasticity.version import __version__

log = logging.getLogger(__name__)

KEPT_DIR = "finished"
OUTPUTS = ("summary.json", "metrics.parquet")
RECORD = "record.json"  # written last: a copy without it is incomplete


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(source: Path, target: Path) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def code_identity() -> dict[str, Any]:
    """The code that trains a run: a copy from other code is not put back (a forced rerun
    after an update trains anew). The commit without its ``-dirty`` mark: a config.yaml
    edited after an interruption must not cost the finished runs."""
    commit = git_commit()
    return {"version": __version__, "git_commit": commit and commit.removesuffix("-dirty")}


def keep(out_dir: Path, key: str) -> None:
    """Copy the finished run's outputs in ``out_dir`` into ``out_dir/finished/``, recorded
    with the settings fingerprint ``key``, the code and each file's SHA-256."""
    kept = out_dir / KEPT_DIR
    kept.mkdir(exist_ok=True)
    (kept / RECORD).unlink(missing_ok=True)
    for name in OUTPUTS:
        _copy(out_dir / name, kept / name)
    hashes = {name: _sha256(kept / name) for name in OUTPUTS}
    write_json(kept / RECORD, {"fingerprint": key, "code": code_identity(), "sha256": hashes})


def restore(out_dir: Path, key: str) -> bool:
    """Put back the outputs of the run finished earlier in ``out_dir`` with settings ``key``
    and this code; False (nothing changed) when there is no complete, matching copy."""
    kept = out_dir / KEPT_DIR
    try:
        record = json.loads((kept / RECORD).read_text())
    except (OSError, ValueError):
        return False
    if record.get("fingerprint") != key:
        log.warning("%s was kept by other settings; training the run", kept)
        return False
    if record.get("code") != code_identity():
        log.warning("%s was kept by other code (%s); training the run", kept, record.get("code"))
        return False
    hashes = record.get("sha256", {})
    if any(not (kept / n).is_file() or _sha256(kept / n) != hashes.get(n) for n in OUTPUTS):
        log.warning("%s: a kept file is missing or altered; training the run", kept)
        return False
    for name in OUTPUTS:
        _copy(kept / name, out_dir / name)
    return True
