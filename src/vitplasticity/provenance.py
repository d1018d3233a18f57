"""What made a file: settings, package versions, device, git commit and model weights."""

from __future__ import annotations

import functools
import logging
import os
import platform
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from vitplasticity.models.spec import spec_class
from vitplasticity.models.weights import read_record, read_snapshot_record, sha256_file
from vitplasticity.utils.gpu_slots import SLOT_VARIABLE

log = logging.getLogger(__name__)

# Every library that computes a number of a result (the model, its tokenizer, LoRA, the
# tables), recorded where installed.
_PACKAGES = (
    "vitplasticity",
    "torch",
    "torchvision",
    "timm",
    "transformers",
    "tokenizers",
    "peft",
    "safetensors",
    "numpy",
    "polars",
    "pyarrow",
)


@functools.cache
def git_commit() -> str | None:
    """The commit of the working tree this package runs from, with ``-dirty`` when modified."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def versions() -> dict[str, str]:
    """Installed versions of the packages that shape the numbers."""
    found: dict[str, str] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def device_description(device: Any = None) -> str:
    """A human-readable name of ``device`` (a torch.device or string), e.g. the GPU model."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda" and torch.cuda.is_available():
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return f"{dev.type}:{platform.processor() or platform.machine()}"


@functools.cache
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of ``path``, once per process and file version (a packed job's runs share it)."""
    return sha256_file(path)


def _file_record(path: Path) -> dict[str, Any]:
    stat = path.stat()
    sha256 = _file_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    return {"path": str(path), "size": stat.st_size, "sha256": sha256}


def weights_record(model_spec: Any) -> dict[str, Any] | None:
    """What a result's model weights were, from its model spec (config ``models.<name>``).

    A weights file: its path, size and sha256, with the weights stage's hub record (repo,
    revision, commit, URL) when ``weights.json`` beside it has the same sha256. A weights
    folder (a transformers model): each weights and config file's path, size and sha256
    (:func:`_folder_record`). ``random``: the init seed. ``hub``: the file timm loaded from
    the huggingface_hub cache, where it is found there. None for a spec without ``weights``.
    """
    if not isinstance(model_spec, Mapping) or "weights" not in model_spec:
        return None
    weights = str(model_spec["weights"])
    if weights == "random":
        return {"source": "random", "init_seed": model_spec.get("init_seed", 0)}
    if weights == "hub":
        return {"source": "hub", **_hub_cache_record(model_spec)}
    path = Path(weights)
    if path.is_dir():
        return _folder_record(path)
    if not path.is_file():
        return {"source": "file", "path": weights, "sha256": None}
    record: dict[str, Any] = {"source": "file", **_file_record(path)}
    fetched = read_record(path)
    if fetched is None:
        return record
    if fetched.get("sha256") != record["sha256"]:
        # The file was replaced after the weights stage wrote it: its hub record is stale.
        log.warning("%s: sha256 differs from %s's; hub record left out", path, "weights.json")
        return record
    keys = ("repo_id", "filename", "revision", "commit", "url", "fetched")
    return {**record, "hub": {key: fetched.get(key) for key in keys}}


def _folder_record(folder: Path) -> dict[str, Any]:
    """A weights folder's files: those the weights stage's ``weights.json`` lists (with its
    hub record when every file still has the sha256 recorded), else the folder's config.json
    and safetensors files, each with its path, size and sha256."""
    fetched = read_snapshot_record(folder)
    names = (
        [str(entry["path"]) for entry in fetched["files"]]
        if fetched
        else sorted(
            p.relative_to(folder).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and (p.name == "config.json" or ".safetensors" in p.name)
        )
    )
    files = [
        {**_file_record(folder / name), "path": name} for name in names if (folder / name).is_file()
    ]
    record: dict[str, Any] = {"source": "folder", "path": str(folder), "files": files}
    if fetched is None:
        return record
    recorded = {str(entry["path"]): entry.get("sha256") for entry in fetched["files"]}
    if {f["path"]: f["sha256"] for f in files} != recorded:
        # A file was replaced or removed after the weights stage wrote it: its record is stale.
        log.warning("%s: files differ from %s's; hub record left out", folder, "weights.json")
        return record
    keys = ("repo_id", "revision", "commit", "url", "fetched")
    return {**record, "hub": {key: fetched.get(key) for key in keys}}


def _hub_cache_record(model_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The repo, revision and cached file (with sha256) of a ``weights: hub`` model that loads
    one hub file (timm); the repo and revision of one whose weights are a folder (transformers:
    the weights stage's folder records its files)."""
    revision = str(model_spec.get("revision", "main"))
    try:
        spec = spec_class(model_spec)
        source = spec.hub_weights_file(model_spec)
        if source is None:
            return {"repo_id": model_spec.get(spec.id_key), "revision": revision, "sha256": None}
        from huggingface_hub import try_to_load_from_cache
    except (ImportError, KeyError, ValueError) as error:
        return {"revision": revision, "sha256": None, "note": str(error)}
    found: dict[str, Any] = {"repo_id": source.repo_id, "revision": source.revision}
    cached = try_to_load_from_cache(source.repo_id, source.filename, revision=source.revision)
    if isinstance(cached, str):
        found.update(_file_record(Path(cached)))
        found["commit"] = Path(cached).parents[source.filename.count("/")].name
    else:
        found["sha256"] = None
    return found


def provenance(settings: dict[str, Any], device: Any = None) -> dict[str, Any]:
    """The record stored beside every result: resolved settings, versions, device, commit,
    and the model's weights (see :func:`weights_record`). A job started through
    :mod:`vitplasticity.utils.gpu_slots` also records the GPU its slot gave it (``gpu_slot``, the
    id it set ``CUDA_VISIBLE_DEVICES`` to); other jobs have no such key."""
    record = {
        "settings": settings,
        "versions": versions(),
        "device": device_description(device),
        "git_commit": git_commit(),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
    }
    slot = os.environ.get(SLOT_VARIABLE)
    if slot is not None:
        record["gpu_slot"] = slot
    weights = weights_record(settings.get("model_spec"))
    if weights is not None:
        record["weights"] = weights
    return record
