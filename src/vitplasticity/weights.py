"""The weights stage: fetch a model's pretrained checkpoint once, for compute jobs offline.

Compute nodes of many clusters have no internet, and 1,500 jobs asking the hub at once invite
rate limits. So one local job per model (on the login node) downloads the checkpoint timm
would load, through huggingface_hub (which honours HF_ENDPOINT, HF_TOKEN and HF_HOME), into
``<resources>/weights/<model>/model.safetensors``, with ``weights.json`` beside it: repo,
file, revision asked for, commit it resolved to, sha256, size and URL. Compute jobs then load
that file (``models.build_model`` with ``weights: <path>``) with HF_HUB_OFFLINE=1, strictly:
a file that is not the model's checkpoint stops them, naming the file and the keys.

The local file is always a safetensors file: timm prefers the safetensors twin of a
checkpoint (``model.safetensors`` for its default ``pytorch_model.bin``) and every timm hub
repo has one. A repo without it is an error here, not a silent pickle load.

Importing this module imports neither torch nor timm: the workflow's rules use its names.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LOCAL_FILENAME = "model.safetensors"
RECORD_FILENAME = "weights.json"
# The timm.create_model kwargs that change where pretrained weights come from: the weights
# stage depends on these (and on timm_id and revision) only.
SOURCE_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class HubFile:
    """The file of a hub repo that timm would load for a model."""

    repo_id: str
    filename: str
    revision: str


def hub_file(
    timm_id: str,
    revision: str = "main",
    kwargs: Mapping[str, Any] | None = None,
    model: str = "?",
) -> HubFile:
    """The hub repo, file and revision of ``timm_id``'s pretrained weights, as timm finds them.

    Resolves the pretrained_cfg the way ``timm.create_model`` does (the tag of
    ``arch.tag``, or the architecture's default tag; ``kwargs``' ``pretrained_cfg`` and
    ``pretrained_cfg_overlay`` applied) and takes its ``hf_hub_id``. A revision pinned in
    ``hf_hub_id`` (``repo@rev``) is used unless ``revision`` names another than "main".

    Args:
        timm_id: the model's timm id (config ``models.<model>.timm_id``).
        revision: branch, tag or commit (config ``models.<model>.revision``).
        kwargs: the model's timm.create_model kwargs.
        model: the model's config key, for error messages.

    Raises:
        ValueError: naming ``models.<model>`` when timm does not know the id, or its
            pretrained_cfg names no hub repo or no safetensors file.
    """
    import timm
    from timm.models import parse_model_name, split_model_name_tag
    from timm.models._builder import resolve_pretrained_cfg

    where = f"models.{model}.timm_id {timm_id!r}"
    source, name = parse_model_name(timm_id)
    if source:
        raise ValueError(
            f"{where}: '{source}:' ids load their config from the hub in every job; use the timm "
            "registry id (arch.tag) or download the file yourself and set weights: <path>"
        )
    arch, tag = split_model_name_tag(name)
    if not timm.is_model(arch):
        raise ValueError(f"{where}: timm has no architecture {arch!r}")
    kwargs = kwargs or {}
    try:
        cfg = resolve_pretrained_cfg(
            arch, kwargs.get("pretrained_cfg") or tag or None, kwargs.get("pretrained_cfg_overlay")
        )
    except RuntimeError as error:  # timm: "Invalid pretrained tag (...) for <arch>"
        raise ValueError(f"{where}: {error}") from error
    if not cfg.hf_hub_id:
        raise ValueError(
            f"{where}: no hub weights (its timm pretrained_cfg has no hf_hub_id); "
            "use weights: random or a local weights file"
        )
    repo_id, _, pinned = cfg.hf_hub_id.partition("@")
    filename = safetensors_name(cfg.hf_hub_filename or "pytorch_model.bin")
    if filename is None:
        raise ValueError(
            f"{where}: hub file {cfg.hf_hub_filename!r} of {repo_id} has no safetensors "
            "counterpart; download it yourself and set weights: <path>"
        )
    if cfg.hf_hub_filename and cfg.custom_load:
        raise ValueError(
            f"{where}: {repo_id}/{cfg.hf_hub_filename} needs timm's custom loader; "
            "download it yourself and set weights: <path>"
        )
    return HubFile(repo_id, filename, revision if revision != "main" else pinned or "main")


def safetensors_name(filename: str) -> str | None:
    """The safetensors file timm loads in place of ``filename`` (timm's _get_safe_alternatives)."""
    if filename.endswith(".safetensors"):
        return filename
    special = {
        "pytorch_model.bin": "model.safetensors",
        "open_clip_pytorch_model.bin": "open_clip_model.safetensors",
    }
    if filename in special:
        return special[filename]
    return filename.removesuffix(".bin") + ".safetensors" if filename.endswith(".bin") else None


def fetch(
    model: str,
    timm_id: str,
    out_dir: str | Path,
    *,
    revision: str = "main",
    kwargs: Mapping[str, Any] | None = None,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Download ``model``'s checkpoint into ``out_dir`` with its record; return the record.

    The file goes through the huggingface_hub cache (a second fetch of the same commit
    downloads nothing), is copied into ``out_dir/model.safetensors`` atomically while its
    sha256 is computed, and checked against the hub's LFS sha256 where the cache names the
    blob by it. ``weights.json`` is written last, atomically.

    Args:
        model: the model's config key (for messages and the record).
        timm_id: its timm id; ``revision`` and ``kwargs`` as in :func:`hub_file`.
        out_dir: the model's folder, ``<resources>/weights/<model>``.
        endpoint: the hub URL (default: HF_ENDPOINT, else huggingface.co).
        cache_dir: the huggingface_hub cache (default: HF_HUB_CACHE / HF_HOME's).

    Raises:
        ValueError: a repo, revision or file that does not exist, or a gated repo without
            access, naming ``models.<model>`` and the URL.
        RuntimeError: the hub cannot be reached and the file is not in the cache.
    """
    import huggingface_hub

    source = hub_file(timm_id, revision, kwargs, model)
    endpoint = endpoint or huggingface_hub.constants.ENDPOINT
    cached = download(source, model, timm_id, endpoint, cache_dir)
    where = f"models.{model} ({timm_id})"

    # The cache layout is snapshots/<commit>/<filename>, its files links to blobs/<etag>.
    commit = cached.parents[source.filename.count("/")].name
    out_dir = Path(out_dir)
    target = out_dir / LOCAL_FILENAME
    sha256, size = _copy_hashing(cached, target)
    blob = cached.resolve().name
    if _SHA256.fullmatch(blob) and blob != sha256:
        target.unlink()
        raise RuntimeError(
            f"{where}: {cached} has sha256 {sha256}, the hub says {blob}; remove it from the "
            "huggingface_hub cache and fetch again"
        )
    record = {
        "model": model,
        "timm_id": timm_id,
        "repo_id": source.repo_id,
        "filename": source.filename,
        "revision": source.revision,
        "commit": commit if _COMMIT.fullmatch(commit) else None,
        "url": huggingface_hub.hf_hub_url(
            source.repo_id,
            source.filename,
            revision=commit if _COMMIT.fullmatch(commit) else source.revision,
            endpoint=endpoint,
        ),
        "sha256": sha256,
        "size": size,
        "fetched": datetime.now(UTC).isoformat(timespec="seconds"),
        "huggingface_hub": huggingface_hub.__version__,
    }
    from vitplasticity.io import write_json

    write_json(out_dir / RECORD_FILENAME, record)
    return record


def download(
    source: HubFile,
    model: str,
    timm_id: str,
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """The path of ``source`` in the huggingface_hub cache, downloaded there if need be.

    With HF_HUB_OFFLINE=1 it is found in the cache or not at all.

    Args:
        source: the repo, file and revision (:func:`hub_file`).
        model: the model's config key and ``timm_id`` its timm id, for messages.
        endpoint: the hub URL (default: HF_ENDPOINT, else huggingface.co).
        cache_dir: the huggingface_hub cache (default: HF_HUB_CACHE / HF_HOME's).

    Raises:
        ValueError: a repo, revision or file that does not exist, or a gated repo without
            access, naming ``models.<model>`` and the URL.
        RuntimeError: the hub cannot be reached and the file is not in the cache.
    """
    import huggingface_hub
    from huggingface_hub import errors

    endpoint = endpoint or huggingface_hub.constants.ENDPOINT
    where = f"models.{model} ({timm_id})"
    url = huggingface_hub.hf_hub_url(
        source.repo_id, source.filename, revision=source.revision, endpoint=endpoint
    )
    try:
        return Path(
            huggingface_hub.hf_hub_download(
                source.repo_id,
                source.filename,
                revision=source.revision,
                endpoint=endpoint,
                cache_dir=cache_dir,
            )
        )
    except errors.GatedRepoError as error:
        raise ValueError(
            f"{where}: {source.repo_id} is gated: accept its terms on the hub and set HF_TOKEN "
            f"({url}: HTTP {error.response.status_code})"
        ) from error
    except errors.RepositoryNotFoundError as error:
        raise ValueError(
            f"{where}: hub repo {source.repo_id} not found at {endpoint} (a private or gated "
            f"repo needs HF_TOKEN) ({url}: HTTP {error.response.status_code})"
        ) from error
    except errors.RevisionNotFoundError as error:
        raise ValueError(
            f"models.{model}.revision {source.revision!r}: no such revision of "
            f"{source.repo_id} ({url})"
        ) from error
    except errors.LocalEntryNotFoundError as error:  # before EntryNotFoundError: a subclass
        raise RuntimeError(
            f"{where}: cannot reach the hub at {endpoint} for {url}, and the file is not in the "
            "huggingface_hub cache; run the weights jobs where there is internet (a login "
            f"node), or check HF_ENDPOINT and proxy settings ({error.__cause__ or error})"
        ) from error
    except errors.EntryNotFoundError as error:
        raise ValueError(
            f"{where}: {source.repo_id} has no {source.filename} at revision "
            f"{source.revision!r} ({url}); download the weights yourself and set weights: <path>"
        ) from error
    except errors.HfHubHTTPError as error:
        raise RuntimeError(f"{where}: {url}: {error}") from error


def _copy_hashing(source: Path, target: Path) -> tuple[str, int]:
    """Copy ``source`` to ``target`` atomically; return the copy's sha256 and size."""
    from vitplasticity.io import atomic_path

    digest = hashlib.sha256()
    size = 0
    with atomic_path(target) as tmp, source.open("rb") as reader, tmp.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as reader:
        while chunk := reader.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_record(weights_file: str | Path) -> dict[str, Any] | None:
    """The weights stage's record beside ``weights_file`` (None when there is none)."""
    path = Path(weights_file).with_name(RECORD_FILENAME)
    if not path.is_file():
        return None
    return json.loads(path.read_text())
