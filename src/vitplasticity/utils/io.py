"""Reading and writing the files the stages exchange.

Writing is atomic: a killed job never leaves a file that looks complete, and a write that
fails (a full disk, a read-only folder) raises one :class:`WriteError` naming the file.
Reading goes through :func:`read_parquet`, :func:`read_parquet_table`, :func:`read_json` and
:func:`read_parquet_metadata`, a stage's result table through :func:`read_result_table`
(its :class:`TableKind`: columns, their types, rows): a damaged or foreign file raises one
:class:`UnreadableFileError` naming the file, what is wrong and the remedy, the way the data
sources report a damaged download (:class:`vitplasticity.data.archives.InputFile`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa


class UnreadableFileError(ValueError):
    """A file a stage reads that is damaged or not what it should be; the message names the
    file, what is wrong and the remedy."""


class WriteError(OSError):
    """An output that could not be written (no space left, no permission); nothing of it is
    left behind. ``str()`` is one line naming the file and the system's reason."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


# The bytes every Parquet file starts and ends with.
_PARQUET_MAGIC = b"PAR1"


def content_hint(path: str | os.PathLike[str]) -> str | None:
    """What a file that is not in its expected format holds, when that is recognisable: empty,
    or an HTML page (what web servers send for errors and logins); None otherwise."""
    path = Path(path)
    if not path.is_file():
        return None
    with path.open("rb") as handle:
        head = handle.read(512)
    if not head:
        return "an empty file"
    if head.lstrip().lower().startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "an HTML page (a web server's error or login page?)"
    return None


def rerun_remedy(path: str | os.PathLike[str]) -> str:
    """What to do about a damaged file the workflow wrote itself."""
    return f"delete {path} and rerun: the workflow writes it again"


def unreadable(
    path: str | os.PathLike[str], problem: str, remedy: str | None = None
) -> UnreadableFileError:
    """The error for ``path``: where, what is wrong, and the remedy (default: rerun)."""
    return UnreadableFileError(f"{path}: {problem}; {remedy or rerun_remedy(path)}")


def _require_file(path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found")
    if not path.is_file():
        raise unreadable(path, "not a file", "give the path of a file, not of a folder")


def _cause(error: BaseException) -> str:
    """The first line of what a reader raised, with its type (polars' messages run long)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _parquet_problem(path: Path, error: BaseException) -> str:
    """What is wrong with a Parquet file that failed to read: not Parquet at all (an HTML
    page, another format), cut short (its footer gone), or damaged inside (the reader's
    message)."""
    hint = content_hint(path)
    if hint:
        return f"not a Parquet file: it is {hint}"
    with path.open("rb") as handle:
        head = handle.read(16)
        handle.seek(max(path.stat().st_size - 4, 0))
        tail = handle.read(4)
    if not head.startswith(_PARQUET_MAGIC):
        return f"not a Parquet file (it starts with {head!r})"
    if tail != _PARQUET_MAGIC:
        return "a truncated Parquet file (its footer is missing)"
    return f"not a readable Parquet file ({_cause(error)})"


def read_parquet_table(
    path: str | os.PathLike[str],
    columns: list[str] | None = None,
    remedy: str | None = None,
) -> pa.Table:
    """The Parquet file ``path`` as an Arrow table (only ``columns``, when given).

    Raises:
        FileNotFoundError: naming the missing file.
        UnreadableFileError: when the file is damaged (truncated, corrupted pages, not
            Parquet) or lacks one of ``columns``, naming the file and ``remedy``.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    _require_file(path)
    try:
        present = pq.read_schema(path).names
        missing = [c for c in columns or () if c not in present]
        if missing:
            raise unreadable(path, f"no column(s) {', '.join(missing)}", remedy)
        return pq.read_table(path, columns=columns)
    except UnreadableFileError:
        raise
    except (OSError, ValueError) as error:  # ArrowInvalid is a ValueError, ArrowIOError OSError
        raise unreadable(path, _parquet_problem(path, error), remedy) from error


def read_parquet(
    path: str | os.PathLike[str],
    columns: list[str] | None = None,
    remedy: str | None = None,
) -> pl.DataFrame:
    """The Parquet file ``path`` as a polars frame (only ``columns``, when given).

    Raises:
        FileNotFoundError: naming the missing file.
        UnreadableFileError: as :func:`read_parquet_table`.
    """
    import polars as pl  # here, not at the top: the data stages import this module

    path = Path(path)
    _require_file(path)
    try:
        frame = pl.read_parquet(path)
    except (OSError, ValueError, pl.exceptions.PolarsError) as error:
        raise unreadable(path, _parquet_problem(path, error), remedy) from error
    missing = [c for c in columns or () if c not in frame.columns]
    if missing:
        raise unreadable(path, f"no column(s) {', '.join(missing)}", remedy)
    return frame.select(columns) if columns else frame


@dataclass(frozen=True)
class TableKind:
    """A kind of result table, as the module that writes it declares it: what it is, with the
    command that writes it (``"a plasticity summary (plasticity --summary)"``), the polars
    type of each of its columns, and whether a readable one has rows (a result has)."""

    name: str
    schema: Mapping[str, Any]
    needs_rows: bool = True


def _type_fits(found: Any, expected: Any) -> bool:
    """Whether a column of type ``found`` holds what one of type ``expected`` should: the same
    type, any integer for an integer, any number for a float, or all nulls."""
    import polars as pl

    if found == pl.Null or found == expected:
        return True
    if expected.is_integer():
        return found.is_integer()
    if expected.is_float():
        return found.is_numeric()
    return False


def _wrong_types(frame: pl.DataFrame, kind: TableKind) -> list[str]:
    return [
        f"column {name} is {frame.schema[name]}, not {expected}"
        for name, expected in kind.schema.items()
        if name in frame.columns and not _type_fits(frame.schema[name], expected)
    ]


def read_result_table(
    path: str | os.PathLike[str],
    kind: TableKind,
    columns: Sequence[str] = (),
    remedy: str | None = None,
) -> pl.DataFrame:
    """The result table ``path`` of ``kind``: it must have ``columns``, every column of the
    kind's schema it has must be of its type, and it must have rows where the kind needs them.

    Raises:
        FileNotFoundError: naming the missing file.
        UnreadableFileError: naming the file, what is wrong (damaged, a column missing or of
            another type, no rows) and what it should be (the kind, with the command that
            writes it); the remedy is to give that kind of table where a column is missing (a
            table of another kind), else ``remedy`` (default: rerun).
    """
    frame = read_parquet(path, remedy=remedy)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        problem = f"not {kind.name} (no column(s) {', '.join(missing)})"
        raise unreadable(path, problem, f"give {kind.name}")
    wrong = _wrong_types(frame, kind)
    if wrong:
        raise unreadable(path, f"not {kind.name} ({'; '.join(wrong)})", remedy)
    if kind.needs_rows and frame.height == 0:
        raise unreadable(path, f"no rows: {kind.name} has one per result", remedy)
    return frame


def read_json(path: str | os.PathLike[str], remedy: str | None = None) -> Any:
    """The JSON file ``path``, parsed.

    Raises:
        FileNotFoundError: naming the missing file.
        UnreadableFileError: when it is not JSON (or not UTF-8), naming the file, the line
            and ``remedy``.
    """
    path = Path(path)
    _require_file(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        hint = content_hint(path)
        problem = "not valid JSON" + (f": it is {hint}" if hint else f" ({error})")
        raise unreadable(path, problem, remedy) from error


def _umask() -> int:
    """The process's file-creation mask (reading it means setting it, so set it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only on success.

    The temporary file lives in the same directory so that the final ``os.replace`` is an
    atomic rename on POSIX file systems. On any exception the temporary file is removed.

    Raises:
        WriteError: when the folder cannot be made or written, or the write fails for lack
            of space or permission (any ``OSError`` without a file name of its own, as a full
            disk gives), naming ``path`` and the system's reason.
    """
    target = Path(path)
    with naming_write_errors(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        # mkstemp creates the file 0600; a result must get the mode any new file gets (the
        # umask's), or collaborators on a shared cluster file system cannot read it.
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
    tmp = Path(tmp_name)
    try:
        with naming_write_errors(target, tmp):
            yield tmp
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


_TEMPORARY = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")
"""The names :func:`atomic_path` gives its temporary files (``.<name>.<8 random>.tmp``)."""


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files :func:`atomic_path` left in ``folder`` when a process was
    killed mid-write (SIGKILL runs no clean-up), and return them. Only for a folder no other
    process is writing into (e.g. a run folder whose lock the caller holds).
    """
    stale = [p for p in Path(folder).iterdir() if p.is_file() and _TEMPORARY.match(p.name)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


@contextlib.contextmanager
def naming_write_errors(target: Path, tmp: Path | None = None) -> Iterator[None]:
    """Turn an OSError about writing ``target`` (through its temporary file ``tmp``) into a
    :class:`WriteError` naming it: one about ``tmp``, ``target`` or a folder above it, or one
    without a file name (a full disk's ENOSPC and EFBIG come so: "disk full"). Errors about
    other files pass unchanged. For writers that make their own temporary files (a prepared
    dataset's folder); :func:`atomic_path` uses it for its own."""
    try:
        yield
    except WriteError:
        raise
    except OSError as error:
        ours = {str(tmp), str(target), *map(str, target.parents)}
        if error.filename is not None and str(error.filename) not in ours:
            raise
        reason = _system_reason(error)
        if error.filename is not None and str(error.filename) != str(tmp):
            reason = f"{reason} ({error.filename})"
        raise WriteError(error.errno, reason, str(target)) from error


def _system_reason(error: OSError) -> str:
    """The system's words for ``error`` ("No space left on device"); pyarrow's OSErrors
    carry no errno attribute but name it in their message ("[errno 28] ...")."""
    found = re.search(r"\[errno (\d+)\]", str(error), re.IGNORECASE)
    number = error.errno or (int(found.group(1)) if found else None)
    if number in _DISK_FULL:
        return f"disk full ({os.strerror(number)}): free space, or write elsewhere"
    return os.strerror(number) if number else error.strerror or str(error)


# What a full disk (or quota, or file-size limit) makes a write fail with.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    """Write ``payload`` as indented, key-sorted JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def write_parquet(
    path: str | os.PathLike[str], frame: pl.DataFrame, metadata: dict[str, Any] | None = None
) -> None:
    """Write ``frame`` to Parquet atomically, with ``metadata`` JSON-encoded in the footer.

    Each metadata value is stored under its key as a JSON string, so that
    :func:`read_parquet_metadata` gives back the original structure.
    """
    import pyarrow.parquet as pq

    table = frame.to_arrow()
    if metadata:
        encoded = {k: json.dumps(v, sort_keys=True, default=str) for k, v in metadata.items()}
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **encoded})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_parquet_metadata(
    path: str | os.PathLike[str], remedy: str | None = None
) -> dict[str, Any]:
    """Read the JSON metadata that :func:`write_parquet` stored in a Parquet footer.

    Raises:
        FileNotFoundError: naming the missing file.
        UnreadableFileError: when the footer cannot be read, naming the file and ``remedy``.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    _require_file(path)
    try:
        raw = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as error:
        raise unreadable(path, _parquet_problem(path, error), remedy) from error
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.decode()
        if name.startswith("ARROW:") or name == "pandas":
            continue
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value.decode()
    return out


# -- output paths checked before a command computes -------------------------------------------
# A run that measures or trains for minutes must not end on an output it cannot write. Nothing
# is created: the folder that would hold a file (or the nearest one above it that exists) is
# probed with a file no one else sees.


def _refused(target: Path, number: int, where: Path, flag: str) -> WriteError:
    """``cannot write <target>: <reason> (<where>, from <flag>)``, as a failed write says."""
    return WriteError(number, f"{os.strerror(number)} ({where}, from {flag})", str(target))


def check_writable(target: str | os.PathLike[str], flag: str, *, folder: bool = False) -> None:
    """Raise unless the file ``target`` (with ``folder``: the folder ``target`` and files in
    it) could be written now: nothing of the other kind is in its place, and the folder it goes
    in exists and takes a new file, or the nearest folder above that exists takes one (the
    missing folders are made when writing).

    Args:
        target: the output file, or with ``folder`` the output folder.
        flag: the flag (or config key) that named it, for the message.
        folder: ``target`` is a folder that the command fills.

    Raises:
        WriteError: ``cannot write <target>: <the system's reason> (<the folder>, from
            <flag>)``: a folder given for a file (or a file for a folder), a file where a
            folder must be, or a folder that refuses new files (read-only, no permission).
    """
    target = Path(target)
    if target.exists() and target.is_dir() != folder:
        number = errno.EISDIR if target.is_dir() else errno.ENOTDIR
        raise _refused(target, number, target, flag)
    start = target if folder else target.parent
    existing = next((p for p in (start, *start.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise _refused(target, errno.ENOTDIR, existing, flag)
    try:
        # On Linux an O_TMPFILE file: it never has a name in the folder.
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise _refused(target, error.errno or errno.EACCES, existing, flag) from error
