"""One process per run folder: a lock file in the folder, locked while a process writes there
(:func:`hold_folder`).

As with the GPU slots (:mod:`vitplasticity.utils.gpu_slots`), the kernel releases the lock
when its process ends, however it ends: a killed job leaves no lock behind, only a stale file
that the next holder takes over. Unlike the slots' ``flock``, the lock is a POSIX record lock
(``lockf``), which forked children do not inherit: a killed run's data-loader workers, which
outlive it for a while, hold nothing. Such locks do not conflict within one process, so the
process also keeps the set of folders it holds. The file holds its holder's pid and host, so that a process
refused the folder can name who has it (an orphaned job of a killed Snakemake, say).

Import-light (no torch).
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = "training.lock"

_HELD: set[Path] = set()  # the folders this process holds


class FolderBusy(RuntimeError):
    """Another process holds the folder's lock.

    Attributes:
        folder: the locked folder.
        holder: what the holder wrote in the lock file ("pid 123 on host node1").
    """

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(
            f"{folder} is being written by {holder or 'another process'} (lock "
            f"{folder / LOCK_NAME}); not touching it. Let that process finish, or stop it, "
            "then rerun"
        )
        self.folder = folder
        self.holder = holder


def _locked_descriptor(path: Path) -> int | None:
    """A descriptor holding the lock of the file at ``path`` (created if missing), or None
    when another process holds it. Retries when the file it locked was removed or replaced
    meanwhile (its holder removes it on release), so that two processes never hold two files
    of one name."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EACCES, errno.EAGAIN):
                return None
            raise
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _holder(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@contextmanager
def hold_folder(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Hold ``folder``'s lock (creating the folder) for the block; the lock file is removed
    when the block ends normally or by an exception, and released by the kernel if the process
    dies in it. The folders it created are removed again when the block leaves them empty (a
    run refused before it wrote anything leaves nothing behind).

    Raises:
        FolderBusy: naming the holder's pid and host, when another process holds the lock.
    """
    folder = Path(folder)
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # deepest first
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    held = folder.resolve()
    if held in _HELD:  # checked first: closing another descriptor of the file would unlock it
        raise FolderBusy(folder, _holder(path))
    fd = _locked_descriptor(path)
    if fd is None:
        raise FolderBusy(folder, _holder(path))
    _HELD.add(held)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode())
        yield folder
    finally:
        # Removed while still locked: a process that opened the old file retries (above).
        path.unlink(missing_ok=True)
        _HELD.discard(held)
        os.close(fd)
        _remove_if_empty(created)


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; stop at the first that is not."""
    for made in folders:
        try:
            made.rmdir()
        except OSError:  # not empty (the run wrote into it, or another process locked it)
            return
