"""What every real source does the same way: find or fetch its verified files, split with
the reference code's fixed seed, check the split sizes, and write the prepared store."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.archives import InputFile, local_remedy
from vitplasticity.data.download import ChecksumError, download, file_digest
from vitplasticity.data.sources.registry import (
    FILES,
    KNOWN_COUNTS,
    Checksum,
    RemoteFile,
    file_checksum,
    local_archives,
    remote_file,
    source_files,
)
from vitplasticity.data.store import PreparedDatasetWriter, Split, fixed_split

log = logging.getLogger(__name__)

PAPER_SPLIT_SEED = 42


def resolve_files(
    name: str,
    spec: Mapping[str, Any],
    downloads: Path,
    files: Mapping[str, RemoteFile] | None = None,
) -> dict[str, InputFile]:
    """Every file the dataset needs, verified, by registry file name: its local path, and
    the remedy should it turn out damaged (delete a download; replace a local file).

    A file under the entry's ``archive`` key is used in place (verified, never downloaded);
    every other file is taken from ``downloads`` (verified) or downloaded there. A file is
    verified against the entry's ``checksums`` item when it has one, else the registry's md5.

    Args:
        name: the dataset's config key (named in errors).
        spec: its config entry.
        downloads: the download cache folder.
        files: registry entries replacing the built-in ones (tests, private mirrors).

    Raises:
        FileNotFoundError: an ``archive`` path that does not exist, naming the key.
        ChecksumError: a file with the wrong digest, naming the key or URL.
    """
    registry = {**FILES, **(files or {})}
    local = local_archives(name, spec)
    resolved: dict[str, InputFile] = {}
    for filename in source_files(spec["source"], spec):
        entry = registry[filename]
        expected = file_checksum(name, spec, filename, entry)
        # A digest from the entry's own checksums is the user's: a mismatch may be their typo.
        yours = filename in (spec.get("checksums") or {})
        origin = f"datasets.{name}.checksums.{filename}" if yours else None
        if filename in local:
            resolved[filename] = _verified_local(name, filename, local[filename], expected, origin)
        else:
            url = remote_file(name, spec, filename).url if spec.get("url") else entry.url
            path = download(url, downloads / filename, checksum=expected, checksum_origin=origin)
            resolved[filename] = InputFile.downloaded(path)
    return resolved


def _verified_local(
    name: str, filename: str, path: Path, expected: Checksum | None, origin: str | None
) -> InputFile:
    """The user's own file for ``filename`` (config ``datasets.<name>.archive``), checked to
    exist and, when a digest is known, to match it (``origin``: the config key giving it, or
    None for the registry's).

    Raises:
        FileNotFoundError: the file does not exist, naming the key.
        ChecksumError: the wrong digest, naming the key and how to fix it.
    """
    if not path.is_file():
        raise FileNotFoundError(
            f"datasets.{name}.archive: {path} does not exist (expected {filename})"
        )
    actual = file_digest(path, expected.algorithm if expected else "md5")
    if expected is not None and actual != expected.hexdigest:
        if origin:
            where, other = f"from your config {origin}", "correct that digest"
        else:
            where = "the registry's"
            other = f"give their digest under datasets.{name}.checksums"
        raise ChecksumError(
            f"datasets.{name}.archive: checksum mismatch for {path}: "
            f"expected {expected.algorithm} {expected.hexdigest} ({filename}, {where}), "
            f"got {actual}; {local_remedy(f'datasets.{name}.archive')} (or, if "
            f"these bytes are right, {other})"
        )
    return InputFile.local(path, f"datasets.{name}.archive")


def paper_fixed_split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference code's fixed seed-42 80/20 (pool, test) split (see store.fixed_split)."""
    return fixed_split(n, PAPER_SPLIT_SEED, 0.2)


def expected_counts(source: str, expected: Mapping[str, int] | None) -> dict[str, int]:
    """The split sizes (and ``num_classes``) to check: the caller's, else the registry's."""
    return dict(expected if expected is not None else KNOWN_COUNTS.get(source, {}))


def check_counts(
    name: str, source: str, counts: Mapping[str, int], num_classes: int, expected: Mapping[str, int]
) -> None:
    """Compare the parsed split sizes and class count against the expected ones.

    Raises:
        ValueError: naming the dataset, every differing count, and what was expected.
    """
    found = {**counts, "num_classes": num_classes}
    wrong = {
        key: (found.get(key), value) for key, value in expected.items() if found.get(key) != value
    }
    log.info("%s (%s): %s (expected %s)", name, source, found, dict(expected) or "not recorded")
    if wrong:
        details = ", ".join(f"{key}: {got} instead of {want}" for key, (got, want) in wrong.items())
        raise ValueError(
            f"datasets.{name}: the {source} files give {details}; the archive is incomplete "
            "or not the release the registry describes"
        )


@dataclass(frozen=True)
class PreparedSplits:
    """Parsed splits and class names, ready to be checked and written."""

    splits: dict[str, Split]
    class_names: list[str]
    details: dict[str, Any]


def write_prepared(
    name: str,
    spec: Mapping[str, Any],
    out_dir: Path,
    prepared: PreparedSplits,
    paths: Mapping[str, InputFile],
    expected: Mapping[str, int] | None,
) -> dict[str, int]:
    """Check the counts, then write the splits and meta.json atomically; return split sizes."""
    source = spec["source"]
    counts = {split: len(data) for split, data in prepared.splits.items()}
    wanted = expected_counts(source, expected)
    check_counts(name, source, counts, len(prepared.class_names), wanted)
    with PreparedDatasetWriter(out_dir) as writer:
        for split, data in prepared.splits.items():
            writer.add_split(split, data.images, data.labels.tolist(), data.files)
        writer.finish(
            {
                "name": name,
                "source": source,
                "num_classes": len(prepared.class_names),
                "class_names": prepared.class_names,
                "expected_counts": wanted,
                "files": {filename: str(file.path) for filename, file in paths.items()},
                "spec": dict(spec),
                **prepared.details,
            }
        )
        return dict(writer.counts)


def make_split(images: Sequence[bytes], labels: Sequence[int], files: Sequence[str]) -> Split:
    """A Split from parallel sequences."""
    return Split(list(images), np.asarray(labels, dtype=np.int64), list(files))
