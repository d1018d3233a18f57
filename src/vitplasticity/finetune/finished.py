"""A finished run's verified copy, kept in its folder outside the job's declared outputs.

Snakemake deletes every output of an interrupted job: a pack's (``finetune --runs``, one job)
and, on a cluster, every job of a cancelled group job (the profile's ``groups:``), the
finished runs' too. So every run, packed or not, once its summary.json and metrics.parquet are
written, keeps a copy of them in ``<run>/finished/`` with a record of the settings'
fingerprint, the code that trained it and each file's SHA-256. A later job of the same run
puts the files back from a copy that matches its settings, its code and its hashes instead of
training the run again. The copy stays (it is not an output, so no clean-up removes it): a
run is trained again only when its folder, or its ``finished/``, is deleted.

The code is what decides a run's numbers, not the repository's commit: the SHA-256 of the
source file of every module of the package loaded in the training process when the copy is
kept, and the installed version of each of the numeric dependencies it had loaded. A commit
of the README or the docs, a config.yaml edit, or a module the run never imported (the
workflow, the report's tables and figures) keeps the copies; a changed line of the training
loop, or another torch, does not. The modules are read from the process, not declared, so a
module the training comes to import is covered without a list to keep up; the set errs towards
training again (the CLI loads every command module, the registry every architecture), which
costs compute, where a declared list that missed a module would put back wrong numbers. The
copy is checked against those same files as they are now, so a rerun need not have imported
them all before its first run's check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from vitplasticity.utils.io import atomic_path, write_json

log = logging.getLogger(__name__)

KEPT_DIR = "finished"
OUTPUTS = ("summary.json", "metrics.parquet")
RECORD = "record.json"  # written last: a copy without it is incomplete

PACKAGE = "vitplasticity"
# Source paths are recorded relative to the folder that holds the package (src/ in a clone,
# site-packages in an install), so a copy kept by a clone is recognized by an install.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]
# The installed packages that compute a run's numbers (by their distribution names, which are
# their module names): recorded where the training process had imported them.
NUMERIC_DEPENDENCIES = ("numpy", "torch", "torchvision", "timm", "transformers", "peft")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy(source: Path, target: Path) -> None:
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def loaded_sources() -> dict[str, str]:
    """The SHA-256 of the source file of every module of the package loaded in this process,
    by its path below :data:`PACKAGE_PARENT` (``vitplasticity/finetune/loop.py``), sorted."""
    sources = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file is None or (name != PACKAGE and not name.startswith(f"{PACKAGE}.")):
            continue
        path = Path(file).resolve()
        sources[path.relative_to(PACKAGE_PARENT).as_posix()] = _sha256(path)
    return dict(sorted(sources.items()))


def code_identity() -> dict[str, Any]:
    """The code that trains a run, as this process has it: ``sources`` (:func:`loaded_sources`)
    and ``dependencies``, the installed version of each of :data:`NUMERIC_DEPENDENCIES` that
    the process imported."""
    dependencies = {
        name: _installed_version(name) for name in NUMERIC_DEPENDENCIES if name in sys.modules
    }
    return {"sources": loaded_sources(), "dependencies": dependencies}


def code_changes(recorded: Any) -> list[str]:
    """What differs between the code a copy was kept by (its record's ``code``) and the code
    installed now: each recorded source file changed or gone, each recorded dependency of
    another version; empty when it is the same code."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("sources"), dict):
        return ["kept by a vitplasticity that recorded no source hashes"]
    changes = []
    for relative, digest in recorded["sources"].items():
        path = PACKAGE_PARENT / relative
        if not path.is_file():
            changes.append(f"{relative} is gone")
        elif _sha256(path) != digest:
            changes.append(f"{relative} changed")
    for name, version in (recorded.get("dependencies") or {}).items():
        installed = _installed_version(name)
        if installed != version:
            changes.append(f"{name} {version} is now {installed or 'not installed'}")
    return changes


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
    changes = code_changes(record.get("code"))
    if changes:
        log.warning("%s was kept by other code (%s); training the run", kept, "; ".join(changes))
        return False
    hashes = record.get("sha256", {})
    if any(not (kept / n).is_file() or _sha256(kept / n) != hashes.get(n) for n in OUTPUTS):
        log.warning("%s: a kept file is missing or altered; training the run", kept)
        return False
    for name in OUTPUTS:
        _copy(kept / name, out_dir / name)
    return True
