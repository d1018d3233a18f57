"""Output paths checked when a command starts: a run that measures or trains for minutes must
not end on an output it cannot write. Nothing is created: the folder that would hold a file
(or the nearest one above it that exists) is probed with a file no one else sees.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from vitplasticity.utils.io import WriteError


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
