"""The weights stage: fetch a model's pretrained checkpoint once, for compute jobs offline.

Compute nodes of many clusters have no internet, and 1,500 jobs asking the hub at once invite
rate limits. So one local job per model (on the login node) downloads its weights through
huggingface_hub (which honours HF_ENDPOINT, HF_TOKEN and HF_HOME) into
``<resources>/weights/<model>/``, with ``weights.json`` beside them, and compute jobs load
them from there with HF_HUB_OFFLINE=1, strictly: weights that are not the model's stop them,
naming the file and the keys.

- A timm model (:func:`fetch`): the checkpoint timm would load, as ``model.safetensors``;
  ``weights.json`` records repo, file, revision asked for, commit it resolved to, sha256, size
  and URL. Compute jobs get ``weights: <that file>``.
- A transformers model (:func:`fetch_snapshot`): a snapshot of the repo at the revision, the
  files ``from_pretrained`` reads (:data:`SNAPSHOT_PATTERNS`: config.json, the safetensors
  shards and their index, the image processor and tokenizer files), in the repo's layout;
  ``weights.json``, written last, records repo, revision asked for, commit resolved and each
  file's path, sha256 and size. Compute jobs get ``weights: <the folder>``.

The local file is always a safetensors file: timm prefers the safetensors twin of a
checkpoint (``model.safetensors`` for its default ``pytorch_model.bin``) and every timm hub
repo has one. A repo without it is an error here, not a silent pickle load.

Importing this module imports neither torch nor timm: the workflow's rules use its names.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vitplasticity.models.hub_file import HubFile, hub_file

LOCAL_FILENAME = "model.safetensors"
RECORD_FILENAME = "weights.json"
# The files of a transformers repo that from_pretrained reads for a model, its image
# processor and its tokenizer; never pickled weights (pytorch_model.bin) nor other formats.
SNAPSHOT_PATTERNS = (
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "preprocessor_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "vocab*",
    "merges.txt",
)
SHARD_INDEX = "model.safetensors.index.json"
# The timm.create_model kwargs that change where pretrained weights come from: the weights
# stage depends on these (and on timm_id and revision) only.
SOURCE_KWARGS = ("pretrained_cfg", "pretrained_cfg_overlay")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_GIT_OID = _COMMIT  # a git blob id: sha1 of "blob <size>\0" + the bytes
_SHA256 = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20


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

    Through the huggingface_hub cache (a second fetch of a commit downloads nothing), copied
    into ``out_dir/model.safetensors`` atomically, its sha256 checked against the hub's LFS
    one where the cache names the blob by it; ``weights.json`` written last, atomically.

    Args:
        model: the model's config key (for messages and the record).
        timm_id: its timm id; ``revision`` and ``kwargs`` as in :func:`hub_file`.
        out_dir: the model's folder, ``<resources>/weights/<model>``.
        endpoint: the hub URL (default: HF_ENDPOINT, else huggingface.co).
        cache_dir: the huggingface_hub cache (default: HF_HUB_CACHE / HF_HOME's).

    Raises:
        ValueError: naming ``models.<model>`` and the URL, for a repo, revision or file that
            does not exist or a gated repo without access.
        RuntimeError: the hub cannot be reached and the file is not in the cache.
    """
    import huggingface_hub

    source = hub_file(timm_id, revision, kwargs, model)
    endpoint = endpoint or huggingface_hub.constants.ENDPOINT
    cached = download(source, model, timm_id, endpoint, cache_dir)
    # The cache layout is snapshots/<commit>/<filename>, its files links to blobs/<etag>.
    commit = _commit_or_none(cached.parents[source.filename.count("/")].name)
    out_dir = Path(out_dir)
    where = f"models.{model} ({timm_id})"
    sha256, size = _copy_verified(cached, out_dir / LOCAL_FILENAME, where)
    url = huggingface_hub.hf_hub_url(
        source.repo_id, source.filename, revision=commit or source.revision, endpoint=endpoint
    )
    names = {"model": model, "timm_id": timm_id, "repo_id": source.repo_id}
    where_from = {"filename": source.filename, "revision": source.revision, "commit": commit}
    record = {**names, **where_from, "url": url, "sha256": sha256, "size": size, **_fetch_stamp()}
    _write_record(out_dir, record)
    return record


def fetch_snapshot(
    model: str,
    hf_id: str,
    out_dir: str | Path,
    *,
    revision: str = "main",
    endpoint: str | None = None,
    cache_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Download a snapshot of transformers model ``model`` into ``out_dir``; return its record.

    The files of ``hf_id`` at ``revision`` matching :data:`SNAPSHOT_PATTERNS`, through the
    huggingface_hub cache, copied into ``out_dir`` in the repo's layout atomically, each
    checked against the id the hub gave it (an LFS sha256, a git blob id). Snapshot files in
    ``out_dir`` that this one lacks are removed (fewer shards leave none behind);
    ``weights.json`` is written last, atomically.

    Args:
        model: the model's config key (for messages and the record).
        hf_id: its hub repo id (config ``models.<model>.hf_id``).
        out_dir: the model's folder, ``<resources>/weights/<model>``.
        revision: branch, tag or commit (config ``models.<model>.revision``).
        endpoint: the hub URL (default: HF_ENDPOINT, else huggingface.co).
        cache_dir: the huggingface_hub cache (default: HF_HUB_CACHE / HF_HOME's).

    Raises:
        ValueError: a repo or revision that does not exist, a gated repo without access, or
            a snapshot without config.json, without safetensors weights or missing a shard
            its index names, naming ``models.<model>`` and the repo.
        RuntimeError: the hub cannot be reached and the snapshot is not in the cache, or a
            cached file whose bytes are not the hub's.
    """
    from huggingface_hub import constants  # a submodule: not imported with the package

    endpoint = endpoint or constants.ENDPOINT
    where = f"models.{model} ({hf_id})"
    snapshot = _download_snapshot(hf_id, revision, endpoint, cache_dir, where, model)
    files = sorted(
        path.relative_to(snapshot).as_posix() for path in snapshot.rglob("*") if path.is_file()
    )
    _check_snapshot(files, snapshot, where, revision)
    commit = _commit_or_none(snapshot.name)
    out_dir = Path(out_dir)
    _remove_stale_files(out_dir, keep=set(files))
    url = f"{endpoint}/{hf_id}/tree/{commit or revision}"
    files_record = _copy_snapshot(snapshot, files, out_dir, where)
    names = {"model": model, "repo_id": hf_id, "revision": revision, "commit": commit}
    record = {**names, "url": url, "files": files_record, **_fetch_stamp()}
    _write_record(out_dir, record)
    return record


def _copy_snapshot(snapshot: Path, files: list[str], out_dir: Path, where: str) -> list[dict]:
    """Each of ``files`` copied from ``snapshot`` into ``out_dir`` (verified): its record."""
    records = []
    for name in files:
        sha256, size = _copy_verified(snapshot / name, out_dir / name, where)
        records.append({"path": name, "sha256": sha256, "size": size})
    return records


def _download_snapshot(
    hf_id: str,
    revision: str,
    endpoint: str,
    cache_dir: str | Path | None,
    where: str,
    model: str,
) -> Path:
    """The folder of ``hf_id``'s snapshot (:data:`SNAPSHOT_PATTERNS`) at ``revision`` in the
    huggingface_hub cache, downloaded there if need be; errors as :func:`_hub_errors`'."""
    import huggingface_hub

    with _hub_errors(where, model, hf_id, revision, endpoint, f"{endpoint}/{hf_id}"):
        return Path(
            huggingface_hub.snapshot_download(
                repo_id=hf_id,
                revision=revision,
                allow_patterns=list(SNAPSHOT_PATTERNS),
                endpoint=endpoint,
                cache_dir=cache_dir,
            )
        )


def _commit_or_none(name: str) -> str | None:
    """``name`` (a cache folder's) if it is a commit id, else None (a revision the cache
    names otherwise)."""
    return name if _COMMIT.fullmatch(name) else None


def _copy_verified(cached: Path, target: Path, where: str) -> tuple[str, int]:
    """Copy ``cached`` to ``target`` atomically; return the copy's sha256 and size.

    Raises:
        RuntimeError: naming ``where`` and the cached file, when its bytes are not those the
            hub named its blob by (:func:`_cache_mismatch`); ``target`` is removed then.
    """
    sha256, size = _copy_hashing(cached, target)
    problem = _cache_mismatch(cached, sha256)
    if problem:
        target.unlink()
        raise RuntimeError(
            f"{where}: {cached} {problem}; remove it from the huggingface_hub cache and fetch again"
        )
    return sha256, size


def _fetch_stamp() -> dict[str, str]:
    """When a record was fetched, and with which huggingface_hub."""
    import huggingface_hub

    return {
        "fetched": datetime.now(UTC).isoformat(timespec="seconds"),
        "huggingface_hub": huggingface_hub.__version__,
    }


def _write_record(out_dir: Path, record: dict[str, Any]) -> None:
    """Write ``record`` as ``out_dir``'s weights.json, atomically: the stage's last write."""
    from vitplasticity.utils.io import write_json

    write_json(out_dir / RECORD_FILENAME, record)


@contextlib.contextmanager
def _hub_errors(
    where: str,
    model: str,
    repo_id: str,
    revision: str,
    endpoint: str,
    url: str,
    *,
    filename: str | None = None,
) -> Iterator[None]:
    """huggingface_hub's errors of a download (one file, or with ``filename`` None a whole
    snapshot) as errors naming the model, the repo and the URL.

    Raises:
        ValueError: a gated repo without access, a repo, revision or file that does not
            exist.
        RuntimeError: the hub cannot be reached and what is asked is not in the cache, or
            another HTTP error.
    """
    from huggingface_hub import errors

    try:
        yield
    except errors.GatedRepoError as error:
        raise ValueError(
            f"{where}: {repo_id} is gated: accept its terms on the hub and set HF_TOKEN "
            f"({url}: HTTP {error.response.status_code})"
        ) from error
    except errors.RepositoryNotFoundError as error:
        raise ValueError(
            f"{where}: hub repo {repo_id} not found at {endpoint} (a private or gated repo "
            f"needs HF_TOKEN) ({url}: HTTP {error.response.status_code})"
        ) from error
    except errors.RevisionNotFoundError as error:
        raise ValueError(
            f"models.{model}.revision {revision!r}: no such revision of {repo_id} ({url})"
        ) from error
    except errors.LocalEntryNotFoundError as error:  # before EntryNotFoundError: a subclass
        missing = f"{repo_id}, and its snapshot is not (completely)" if filename is None else url
        raise RuntimeError(_unreachable(where, endpoint, missing, filename, error)) from error
    except errors.EntryNotFoundError as error:
        if filename is None:
            raise RuntimeError(f"{where}: {url}: {error}") from error
        raise ValueError(
            f"{where}: {repo_id} has no {filename} at revision {revision!r} ({url}); "
            "download the weights yourself and set weights: <path>"
        ) from error
    except errors.HfHubHTTPError as error:
        raise RuntimeError(f"{where}: {url}: {error}") from error


def _unreachable(
    where: str, endpoint: str, missing: str, filename: str | None, error: Exception
) -> str:
    """The message of a download the hub cannot serve and the cache does not hold."""
    if filename is not None:
        missing = f"{missing}, and the file is not"
    return (
        f"{where}: cannot reach the hub at {endpoint} for {missing} in the huggingface_hub "
        "cache; run the weights jobs where there is internet (a login node), or check "
        f"HF_ENDPOINT and proxy settings ({error.__cause__ or error})"
    )


def _check_snapshot(files: list[str], snapshot: Path, where: str, revision: str) -> None:
    """Raise unless the snapshot holds config.json and complete safetensors weights."""
    at = f"at revision {revision!r}"
    if "config.json" not in files:
        raise ValueError(f"{where}: the repo has no config.json {at}: not a transformers model")
    weights = [name for name in files if name.endswith(".safetensors")]
    if not weights:
        raise ValueError(
            f"{where}: the repo has no safetensors weights {at} (pickled pytorch_model.bin "
            "files are not fetched): load it once with from_pretrained, save_pretrained it "
            "and set weights: <that folder>"
        )
    for index in (name for name in files if name.endswith(".safetensors.index.json")):
        shards = set(json.loads((snapshot / index).read_text()).get("weight_map", {}).values())
        folder = index.rpartition("/")[0]
        missing = sorted(s for s in shards if f"{folder}/{s}".lstrip("/") not in files)
        if missing:
            raise ValueError(f"{where}: {index} names shards the repo lacks {at}: {missing}")


def _cache_mismatch(cached: Path, sha256: str) -> str | None:
    """What is wrong with a cached file of ``sha256``, by the id its blob is named by: an LFS
    file's sha256, a git file's blob id (sha1 of "blob <size>\\0" + bytes); None if it agrees."""
    blob = cached.resolve().name
    if _SHA256.fullmatch(blob):
        return None if blob == sha256 else f"has sha256 {sha256}, the hub says {blob}"
    if _GIT_OID.fullmatch(blob):
        data = cached.read_bytes()
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        return None if blob == oid else f"has git blob id {oid}, the hub says {blob}"
    return None


def _remove_stale_files(out_dir: Path, keep: set[str]) -> None:
    """Remove ``out_dir``'s record and the snapshot files (:data:`SNAPSHOT_PATTERNS`) that
    ``keep`` lacks: a former revision's shards. (Snakemake removes the record, the rule's
    output, before the job: the files it listed cannot be told from it.)"""
    (out_dir / RECORD_FILENAME).unlink(missing_ok=True)
    if not out_dir.is_dir():
        return
    for path in out_dir.rglob("*"):
        name = path.relative_to(out_dir).as_posix()
        if path.is_file() and name not in keep and _snapshot_file(name):
            path.unlink()


def _snapshot_file(name: str) -> bool:
    """Whether a repo file of path ``name`` is one a snapshot fetches (huggingface_hub's
    matching: fnmatch, whose ``*`` also matches ``/``)."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in SNAPSHOT_PATTERNS)


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

    endpoint = endpoint or huggingface_hub.constants.ENDPOINT
    where = f"models.{model} ({timm_id})"
    url = huggingface_hub.hf_hub_url(
        source.repo_id, source.filename, revision=source.revision, endpoint=endpoint
    )
    with _hub_errors(
        where, model, source.repo_id, source.revision, endpoint, url, filename=source.filename
    ):
        return Path(
            huggingface_hub.hf_hub_download(
                source.repo_id,
                source.filename,
                revision=source.revision,
                endpoint=endpoint,
                cache_dir=cache_dir,
            )
        )


def _copy_hashing(source: Path, target: Path) -> tuple[str, int]:
    """Copy ``source`` to ``target`` atomically; return the copy's sha256 and size."""
    from vitplasticity.utils.io import atomic_path

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


def read_snapshot_record(folder: str | Path) -> dict[str, Any] | None:
    """The weights stage's record of a transformers snapshot in ``folder`` (None when there is
    none, or the record is a timm file's)."""
    path = Path(folder) / RECORD_FILENAME
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if isinstance(record.get("files"), list) else None
