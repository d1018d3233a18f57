"""Reading members out of tar and zip archives without extracting them to disk, and one clear
error for an input file that cannot be parsed.

The sources parse what they need straight from the downloaded archive (a 2.9 GB
CIFAR-10-C tar holds 19 corruptions; one dataset needs one ``.npy``). Every file a dataset is
read from is an :class:`InputFile`: its path and the remedy that fits where it came from (a
download is deleted and fetched again; the user's own file is never downloaded, so it must be
replaced). Parsing inside ``InputFile.reading`` turns whatever a damaged file raises (a
truncated archive, an HTML page saved under the expected name, a missing member, an image the
decoder rejects) into one :class:`DamagedFileError` naming the file, the member and the remedy.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import os
import pickle
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

from vitplasticity.data.download import Progress, download_remedy
from vitplasticity.utils.io import content_hint

K = TypeVar("K")


class ArchiveError(RuntimeError):
    """An archive that cannot be read (truncated, corrupted, or not the expected format)."""


class DamagedFileError(ArchiveError):
    """An input file that cannot be parsed; the message names it, the member and the remedy."""


class FormatError(ValueError):
    """Bytes that are not in the expected format, found by a parser of this package; the
    message says what is wrong, ``InputFile.reading`` adds where and the remedy."""


# What parsing bytes that are not what they should be raises: truncated or corrupted streams
# and foreign formats (tarfile, zipfile, zlib, lzma, pickle, numpy, PIL), and the lookups into
# a parsed structure that lacks an entry. Programming errors (TypeError, AttributeError,
# NameError) are deliberately not among them.
PARSE_ERRORS: tuple[type[Exception], ...] = (
    EOFError,
    OSError,
    ValueError,
    LookupError,
    tarfile.TarError,
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    pickle.UnpicklingError,
)


def local_remedy(key: str) -> str:
    """What to do about a damaged file that the config key ``key`` points at."""
    return f"this is your local file from config {key}: replace it; it is never downloaded"


@dataclass(frozen=True)
class InputFile:
    """A file a dataset is read from, and what to do when it turns out to be damaged."""

    path: Path
    remedy: str
    # What to do when the file reads whole but is laid out otherwise than the official
    # release (re-packed, arrays transposed): for a download, fetching it again brings the
    # same bytes, so "delete and rerun" would not help. None: ``remedy``.
    layout_remedy: str | None = None

    @classmethod
    def downloaded(cls, path: str | os.PathLike[str]) -> InputFile:
        """A file of the downloads folder: deleting it makes the next run fetch it again."""
        path = Path(path)
        layout = (
            f"downloading it again brings the same bytes (they passed their checksum): get "
            f"the official {path.name} (or repack it in the official layout), then delete "
            f"{path} and rerun"
        )
        return cls(path, download_remedy(path), layout)

    @classmethod
    def local(cls, path: str | os.PathLike[str], key: str) -> InputFile:
        """The user's own file, named by config key ``key`` (never downloaded)."""
        return cls(Path(path), local_remedy(key))

    def damaged(self, problem: str, member: str | None = None) -> DamagedFileError:
        """The error for this file (or its ``member``): where, what is wrong, the remedy."""
        where = str(self.path) if member is None else f"{self.path}, member {member}"
        return DamagedFileError(f"{where}: {problem}; {self.remedy}")

    def misshapen(self, problem: str, member: str | None = None) -> DamagedFileError:
        """The error for a file that reads whole but is not laid out as the official release
        (its :attr:`layout_remedy`): where, what is wrong, what to do."""
        where = str(self.path) if member is None else f"{self.path}, member {member}"
        return DamagedFileError(f"{where}: {problem}; {self.layout_remedy or self.remedy}")

    def check_images(self, images: Sequence[bytes], members: Sequence[str]) -> None:
        """Raise :class:`DamagedFileError` naming the first of this archive's ``members``
        (``images``: their bytes) that does not decode as an image."""
        bad = first_undecodable(images)
        if bad is not None:
            raise self.damaged(f"not a decodable image ({bad[1]})", members[bad[0]])

    @contextlib.contextmanager
    def reading(self, kind: str, member: str | None = None) -> Iterator[None]:
        """Parse this file (or its ``member``) as a ``kind``; failures become one clear error.

        An :class:`ArchiveError` raised inside (a missing member, a wrong shape) gets the
        remedy appended; a low-level parse error (:data:`PARSE_ERRORS`) becomes "not a
        readable <kind>" with its cause, and a hint when the file is empty or an HTML page.
        A :class:`DamagedFileError` from a nested ``reading`` passes unchanged.

        Raises:
            DamagedFileError: naming the file, the member and the remedy.
        """
        try:
            yield
        except DamagedFileError:
            raise
        except ArchiveError as error:
            raise DamagedFileError(f"{error}; {self.remedy}") from error
        except PARSE_ERRORS as error:
            hint = content_hint(self.path) if member is None else None
            problem = f"not a readable {kind}" + (f": it is {hint}" if hint else "")
            raise self.damaged(f"{problem} ({_cause(error)})", member) from error


def _cause(error: BaseException) -> str:
    """What a parse error says: our own FormatError's message, else ``Type: message``."""
    return str(error) if isinstance(error, FormatError) else f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def archive_errors(path: str | os.PathLike[str], member: str | None = None) -> Iterator[None]:
    """Turn the many ways a damaged archive fails into one ArchiveError naming it (and the
    member being read); the caller's ``InputFile.reading`` adds the remedy."""
    try:
        yield
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError) as error:
        where = str(path) if member is None else f"{path}, member {member}"
        hint = content_hint(path)
        problem = f"not an archive: it is {hint}" if hint else "corrupted or truncated archive"
        raise ArchiveError(f"{where}: {problem} ({_cause(error)})") from error


def read_mat(data: bytes) -> dict[str, Any]:
    """The variables of a MATLAB ``.mat`` file (``scipy.io.loadmat``, squeezed).

    Raises:
        FormatError: the bytes are not a readable ``.mat`` file (scipy raises MatReadError,
            IndexError and others on foreign bytes; one type for ``InputFile.reading``).
    """
    from scipy.io import loadmat

    try:
        return loadmat(io.BytesIO(data), squeeze_me=True)
    except Exception as error:  # scipy has no one error type for bytes it cannot parse
        raise FormatError(f"{type(error).__name__}: {error}") from error


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
                    with archive_errors(path, member.name):
                        data = handle.read()
                    yield member.name, data
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


def jpg_members(path: str | os.PathLike[str]) -> dict[str, str]:
    """A tar's ``.jpg`` members by file name (their folder dropped)."""
    return {n.rsplit("/", 1)[-1]: n for n in tar_names(path) if n.endswith(".jpg")}


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
                        with archive_errors(path, member.name):
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


def read_tar_suffixes(
    path: str | os.PathLike[str], suffixes: Mapping[K, str]
) -> tuple[dict[K, str], dict[str, bytes]]:
    """The tar members ending with each of ``suffixes`` (:func:`find_member`): each key's
    member name, and the members' bytes by name (one pass over a compressed tar).

    Raises:
        ArchiveError: the archive is damaged, or a suffix matches none or several members.
    """
    names = tar_names(path)
    wanted = {key: find_member(names, suffix, path) for key, suffix in suffixes.items()}
    return wanted, read_tar_members(path, set(wanted.values()))


@contextlib.contextmanager
def open_zip(path: str | os.PathLike[str]) -> Iterator[zipfile.ZipFile]:
    """Open a zip archive; damage (also while reading members) raises ArchiveError."""
    with archive_errors(path), zipfile.ZipFile(path) as archive:
        yield archive


_DECODE_CHUNK = 256  # images per task of the decode check
# torchvision prefixes its decode errors with the C++ function and source line.
_TORCHVISION_PREFIX = re.compile(r"^\w+, \S+:\d+, ")


def first_undecodable(images: Sequence[bytes]) -> tuple[int, str] | None:
    """The first image that the training decoder rejects: its index and the reason.

    Images are stored as they are (no re-encoding), so this is the one chance to name the
    file a bad image came from; later stages only see a row of the prepared store. The
    decoder is the one training uses (:func:`vitplasticity.data.decode.decode`, which
    also rejects formats it cannot read, such as BMP and TIFF). Threads, since torchvision's
    decoder releases the GIL.
    """
    from vitplasticity.data.decode import decode

    def first_bad(start: int) -> tuple[int, str] | None:
        for index in range(start, min(start + _DECODE_CHUNK, len(images))):
            if not images[index]:
                return index, "the image is empty (0 bytes)"
            try:
                decode(images[index])
            except (RuntimeError, ValueError) as error:  # torchvision's failures on bad bytes
                return index, _TORCHVISION_PREFIX.sub("", str(error).strip())
        return None

    workers = min(8, len(os.sched_getaffinity(0)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for result in pool.map(first_bad, range(0, len(images), _DECODE_CHUNK)):
            if result is not None:
                pool.shutdown(cancel_futures=True)  # the rest cannot change the answer
                return result
    return None
