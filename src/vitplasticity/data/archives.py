"""Reading members out of tar and zip archives without extracting them to disk.

The sources parse what they need straight from the downloaded archive (a 2.9 GB
CIFAR-10-C tar holds 19 corruptions; one dataset needs one ``.npy``). A damaged archive
raises :class:`ArchiveError` naming the file, never a bare ``tarfile``/``zlib`` traceback.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from vitplasticity.data.download import Progress


class ArchiveError(RuntimeError):
    """An archive that cannot be read (truncated, corrupted, or not the expected format)."""


@contextlib.contextmanager
def archive_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn the many ways a damaged archive fails into one ArchiveError naming it."""
    try:
        yield
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError) as error:
        raise ArchiveError(
            f"{path}: corrupted or truncated archive ({type(error).__name__}: {error}); "
            "delete it and rerun to fetch it again"
        ) from error


def _is_compressed_tar(path: Path) -> bool:
    with path.open("rb") as handle:
        magic = handle.read(3)
    return magic[:2] == b"\x1f\x8b" or magic == b"BZh" or magic[:2] == b"\xfd7"


class _CountingReader:
    """A file wrapper that reports the bytes read to a Progress (for streamed archives)."""

    def __init__(self, handle: BinaryIO, progress: Progress) -> None:
        self._handle, self._progress = handle, progress

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self._progress.update(len(data))
        return data


def iter_tar(
    path: str | os.PathLike[str], want: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member name, bytes)`` of the regular files of a tar (any compression).

    One sequential pass (``want`` filters names before their bytes are read), with progress
    over the archive's bytes.

    Raises:
        ArchiveError: the archive is damaged.
    """
    path = Path(path)
    progress = Progress(f"read {path.name}", path.stat().st_size)
    try:
        with (
            archive_errors(path),
            path.open("rb") as raw,
            tarfile.open(fileobj=_CountingReader(raw, progress), mode="r|*") as tar,
        ):
            for member in tar:
                if member.isfile() and (want is None or want(member.name)):
                    handle = tar.extractfile(member)
                    assert handle is not None
                    yield member.name, handle.read()
    finally:
        progress.close()


def tar_names(path: str | os.PathLike[str]) -> list[str]:
    """The names of a tar's regular files, in archive order.

    An uncompressed tar is indexed by seeking over member headers (fast even at 6 GB); a
    compressed one needs a full decompressing pass.
    """
    path = Path(path)
    with archive_errors(path):
        if not _is_compressed_tar(path):
            with tarfile.open(path, mode="r:") as tar:
                return [m.name for m in tar.getmembers() if m.isfile()]
        names: list[str] = []
        progress = Progress(f"index {path.name}", path.stat().st_size)
        try:
            with (
                path.open("rb") as raw,
                tarfile.open(fileobj=_CountingReader(raw, progress), mode="r|*") as tar,
            ):
                names = [m.name for m in tar if m.isfile()]
        finally:
            progress.close()
        return names


def read_tar_members(path: str | os.PathLike[str], names: set[str]) -> dict[str, bytes]:
    """The bytes of the tar members in ``names``.

    Raises:
        ArchiveError: the archive is damaged, or a requested member is missing (named).
    """
    path = Path(path)
    found: dict[str, bytes] = {}
    with archive_errors(path):
        if not _is_compressed_tar(path):
            # Random access: seek straight to each wanted member.
            with tarfile.open(path, mode="r:") as tar:
                for member in tar.getmembers():
                    if member.name in names and member.isfile():
                        handle = tar.extractfile(member)
                        assert handle is not None
                        found[member.name] = handle.read()
        else:
            found = dict(iter_tar(path, lambda name: name in names))
    missing = sorted(names - found.keys())
    if missing:
        raise ArchiveError(
            f"{path}: {len(missing)} expected member(s) missing, e.g. {missing[:3]}; "
            "is it the right archive?"
        )
    return found


def find_member(names: list[str], suffix: str, archive: str | os.PathLike[str]) -> str:
    """The one name in ``names`` ending with ``suffix`` (tolerates a leading folder).

    Raises:
        ArchiveError: none or several match, naming the archive and the suffix.
    """
    hits = [n for n in names if n == suffix or n.endswith("/" + suffix)]
    if len(hits) != 1:
        raise ArchiveError(
            f"{archive}: expected one member '{suffix}', found {len(hits)} "
            f"({hits[:3] or 'none'}); is it the right archive?"
        )
    return hits[0]


@contextlib.contextmanager
def open_zip(path: str | os.PathLike[str]) -> Iterator[zipfile.ZipFile]:
    """Open a zip archive; damage (also while reading members) raises ArchiveError."""
    with archive_errors(path), zipfile.ZipFile(path) as archive:
        yield archive
