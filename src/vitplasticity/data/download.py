"""Checksum-verified, atomic, resumable downloads (stdlib ``urllib``, no torch).

A download streams into ``<dest>.part``; an interrupted transfer resumes from the bytes it
has with an HTTP range request, transient failures (connection drops, 5xx, timeouts) are
retried with exponential backoff, and only a file whose checksum matches (the registry's
md5, or a dataset's ``checksums`` override: md5 or sha256) is renamed into place. So a file
at ``dest`` is always complete and verified.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from vitplasticity.data.sources.registry import Checksum
from vitplasticity.utils.io import content_hint

log = logging.getLogger(__name__)

CHUNK = 1 << 20  # 1 MiB reads: large enough to be fast, small enough for steady progress
USER_AGENT = "vitplasticity-downloader/1"
# HTTP statuses worth retrying: the server or a proxy may recover (others are permanent).
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
RETRY_BACKOFF_S = 2.0  # the first retry's delay; doubled per retry, capped at 60 s


class ChecksumError(RuntimeError):
    """A file whose digest is not the expected one."""


class DownloadError(RuntimeError):
    """A download that failed for good (permanent HTTP error or retries exhausted)."""


class _Incomplete(Exception):
    """The body ended before its announced length (truncated transfer): resume it."""


class Progress:
    """Progress of a long stream (bytes, or items with ``unit``): a tqdm bar on a terminal,
    else a log line every 10 s (batch jobs write logs, not terminals)."""

    def __init__(self, label: str, total: int | None, initial: int = 0, unit: str = "B") -> None:
        self.label, self.total, self.done, self.unit = label, total, initial, unit
        self._bar = None
        self._last_log = time.monotonic()
        self._start = time.monotonic()
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, initial=initial, desc=label, unit=unit, unit_scale=True, leave=False
            )

    def update(self, n: int) -> None:
        """Count ``n`` more bytes."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last_log >= 10.0:
            self._last_log = now
            scale, unit = (1e6, "MB") if self.unit == "B" else (1.0, self.unit)
            rate = self.done / max(now - self._start, 1e-9) / scale
            share = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
            log.info(
                "%s: %.1f %s%s, %.1f %s/s", self.label, self.done / scale, unit, share, rate, unit
            )

    def close(self) -> None:
        """End the bar (a no-op for log lines)."""
        if self._bar is not None:
            self._bar.close()


def file_digest(
    path: str | os.PathLike[str], algorithm: str = "md5", *, label: str | None = None
) -> str:
    """The ``algorithm`` (md5, sha256) hex digest of a file, streamed in chunks (with progress
    for large files)."""
    path = Path(path)
    digest = hashlib.new(algorithm, usedforsecurity=False)
    progress = Progress(label or f"{algorithm} {path.name}", path.stat().st_size)
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK):
                digest.update(chunk)
                progress.update(len(chunk))
    finally:
        progress.close()
    return digest.hexdigest()


def download_remedy(path: str | os.PathLike[str]) -> str:
    """What to do about a damaged file of the downloads folder."""
    return f"delete {path} and rerun: it will be downloaded again"


def expected_checksum(md5: str | None, checksum: str | Checksum | None) -> Checksum | None:
    """The digest to verify: ``checksum`` (``"md5:<hex>"`` or ``"sha256:<hex>"``) when given,
    else ``md5`` (bare hex), else None (not verified).

    Raises:
        ValueError: a malformed ``checksum`` or ``md5``.
    """
    if isinstance(checksum, Checksum):
        return checksum
    if checksum:
        return Checksum.parse(checksum)
    return Checksum.parse(f"md5:{md5}") if md5 else None


def verify_checksum(path: str | os.PathLike[str], expected: Checksum | None, *, origin: str) -> str:
    """Check ``path`` against ``expected``; return the actual digest (of its algorithm).

    Args:
        path: the file.
        expected: the expected digest; None skips the comparison (the md5 is logged).
        origin: where the file came from (a URL or a config key), named in the error.

    Raises:
        ChecksumError: naming ``origin``, the file, the expected and the actual digest.
    """
    actual = file_digest(path, expected.algorithm if expected else "md5")
    if expected is None:
        log.warning("%s: no known checksum for %s; its md5 is %s", origin, path, actual)
    elif actual != expected.hexdigest:
        raise ChecksumError(
            f"checksum mismatch for {origin} ({path}): expected {expected.algorithm} "
            f"{expected.hexdigest}, got {actual}"
        )
    return actual


def download(
    url: str,
    dest: str | os.PathLike[str],
    *,
    md5: str | None = None,
    checksum: str | Checksum | None = None,
    checksum_origin: str | None = None,
    retries: int = 5,
    backoff: float | None = None,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``dest`` (returned): resumable, retried, checksum-verified, atomic.

    An existing ``dest`` with the right digest is kept (no network). Otherwise the body streams
    into ``<dest>.part``; a dropped or truncated transfer resumes from the bytes already
    there (HTTP ``Range``), transient failures are retried up to ``retries`` times with
    backoff ``backoff * 2**k`` seconds, and the verified file is renamed into place.

    Args:
        url: the file's URL (``http(s)://`` or ``file://``).
        dest: the final path.
        md5: the expected md5 (None: not checked, a warning names the actual one).
        checksum: the expected digest as ``"md5:<hex>"`` or ``"sha256:<hex>"``; replaces
            ``md5`` when given (a mirror whose bytes differ from the registry's).
        checksum_origin: where ``checksum`` came from when it is the user's (a config key):
            then a mismatch says to check that digest, not to add one, and a file already at
            ``dest`` that does not match it is kept, not fetched again.
        retries: how many failed attempts are retried.
        backoff: the first retry's delay in seconds (doubled each retry, capped at 60 s);
            default ``RETRY_BACKOFF_S``.
        timeout: socket timeout of each request in seconds.

    Raises:
        ChecksumError: the finished file's digest differs; the file is deleted and the
            error names the URL, the expected and the actual digest.
        DownloadError: a permanent HTTP error, or the retries ran out.
        ValueError: a malformed ``checksum`` or ``md5``.
    """
    dest = Path(dest)
    expected = expected_checksum(md5, checksum)
    algorithm = expected.algorithm if expected else "md5"
    if _verified_already(dest, expected, url, checksum_origin):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    digest = _fetch_retrying(url, part, timeout, algorithm, retries, backoff)
    _check_download(url, part, digest, expected, checksum_origin)
    os.replace(part, dest)
    log.info("%s: downloaded to %s (%s %s)", url, dest, algorithm, digest)
    return dest


def _verified_already(
    dest: Path, expected: Checksum | None, url: str, checksum_origin: str | None
) -> bool:
    """Whether a file at ``dest`` is kept: True when it matches ``expected`` (or nothing is
    expected); a mismatching one is deleted (False, to be downloaded again), unless the
    expected digest is the user's (``checksum_origin``).

    Raises:
        ChecksumError: a file at ``dest`` does not match the user's digest; it is kept.
    """
    if not dest.is_file():
        return False
    try:
        verify_checksum(dest, expected, origin=url)
        log.info("%s: already downloaded and verified", dest)
        return True
    except ChecksumError as error:
        if checksum_origin:
            # The user's own digest disagrees with the file already there (which another
            # job may have verified with another digest): the typo is likelier than the
            # file, which is kept.
            raise ChecksumError(
                f"{error}; the expected digest is yours, from {checksum_origin}: correct "
                f"it, or delete {dest} and rerun to download the file again"
            ) from error
        log.warning("%s; downloading it again", error)
        dest.unlink()
        return False


def _fetch_retrying(
    url: str, part: Path, timeout: float, algorithm: str, retries: int, backoff: float | None
) -> str:
    """:func:`_fetch_into` until it succeeds, retrying a transient failure up to ``retries``
    times after ``backoff * 2**k`` seconds (capped at 60 s); the ``algorithm`` digest of the
    whole ``part``.

    Raises:
        DownloadError: a permanent HTTP error, or the retries ran out (``part`` is kept).
    """
    failures = 0
    while True:
        try:
            return _fetch_into(url, part, timeout, algorithm)
        except DownloadError:
            raise
        except (_Incomplete, OSError, http.client.HTTPException) as error:
            failures += 1
            if failures > retries:
                kept = f"; {part} is kept, rerun to resume" if part.is_file() else ""
                raise DownloadError(
                    f"{url}: giving up after {failures} failed attempts (last: {error}){kept}"
                ) from error
            first = RETRY_BACKOFF_S if backoff is None else backoff
            delay = min(first * 2 ** (failures - 1), 60.0)
            log.warning("%s: %s; retry %d/%d in %.1f s", url, error, failures, retries, delay)
            time.sleep(delay)


def _check_download(
    url: str, part: Path, digest: str, expected: Checksum | None, checksum_origin: str | None
) -> None:
    """Check the downloaded ``part``'s ``digest`` against ``expected`` (None: log its md5).

    Raises:
        ChecksumError: the digests differ; ``part`` is deleted and the error says what the
            server sent and what to do (correct the user's digest when ``checksum_origin``).
    """
    if expected is None:
        log.warning("%s: no known checksum; downloaded file has md5 %s", url, digest)
        return
    if digest == expected.hexdigest:
        return
    hint = content_hint(part)
    part.unlink(missing_ok=True)
    if checksum_origin:
        advice = (
            f"the expected digest is yours, from {checksum_origin}: if the server's bytes "
            "are right, correct that digest; the downloaded file was deleted"
        )
    else:
        advice = (
            "the downloaded file was deleted: rerun to download it again; if the mismatch "
            "repeats, the URL serves other bytes (a mirror's own release: give their "
            "digest under datasets.<name>.checksums)"
        )
    raise ChecksumError(
        f"checksum mismatch for {url}: expected {expected.algorithm} {expected.hexdigest}, "
        f"got {digest}" + (f"; the server sent {hint}" if hint else "") + f"; {advice}"
    )


def _fetch_into(url: str, part: Path, timeout: float, algorithm: str) -> str:
    """One attempt: append the rest of ``url`` to ``part``; return the ``algorithm`` digest of
    the whole file.

    Raises:
        _Incomplete: the body ended early (retry resumes).
        DownloadError: a permanent HTTP error.
        OSError / HTTPException: transient network failures (retried by the caller).
    """
    offset = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        return _after_http_error(error, url, part, offset, algorithm)
    except urllib.error.URLError as error:
        raise _unreachable(url, error) from error
    with response:
        return _write_body(response, url, part, offset, algorithm)


def _after_http_error(
    error: urllib.error.HTTPError, url: str, part: Path, offset: int, algorithm: str
) -> str:
    """The digest of ``part`` when a 416 says it is complete already; else raise.

    Raises:
        _Incomplete: a retryable status, or a part longer than the file (deleted: restart).
        DownloadError: a permanent HTTP error.
    """
    if error.code == 416 and offset:
        # Nothing left to send: the part may be complete already, or longer than the file.
        total = _content_range_total(error.headers.get("Content-Range"))
        if total == offset:
            return _hash_existing(part, algorithm).hexdigest()
        part.unlink()
        raise _Incomplete(f"range {offset}- not satisfiable; restarting") from error
    if error.code in RETRY_STATUSES:
        raise _Incomplete(f"HTTP {error.code} {error.reason}") from error
    raise DownloadError(f"{url}: HTTP {error.code} {error.reason}") from error


def _unreachable(url: str, error: urllib.error.URLError) -> Exception:
    """The error to raise for a URL that could not be opened: an OSError (retried) for a
    network failure, a DownloadError for a local file or anything else."""
    if isinstance(error.reason, FileNotFoundError | PermissionError | IsADirectoryError):
        return DownloadError(f"{url}: {error.reason}")  # a local file: permanent
    if isinstance(error.reason, OSError | socket.timeout):
        return OSError(f"cannot reach {url}: {error.reason}")
    return DownloadError(f"{url}: {error.reason}")


def _write_body(
    response: http.client.HTTPResponse, url: str, part: Path, offset: int, algorithm: str
) -> str:
    """Append the response body to ``part`` (from scratch when the server ignored the range
    request); return the digest of the whole file.

    Raises:
        _Incomplete: the body ended before its Content-Length.
    """
    status = getattr(response, "status", 200)
    length = response.headers.get("Content-Length")
    if offset and status == 206:
        digest = _hash_existing(part, algorithm)
        mode = "ab"
        total = _content_range_total(response.headers.get("Content-Range"))
    else:
        if offset:
            log.info("%s: server ignored the range request; starting over", url)
        offset, digest, mode = 0, hashlib.new(algorithm, usedforsecurity=False), "wb"
        total = int(length) if length is not None else None
    expected_body = int(length) if length is not None else None
    received = 0
    progress = Progress(f"download {part.name[: -len('.part')]}", total, initial=offset)
    try:
        with part.open(mode) as handle:
            for chunk in _read_chunks(response):
                handle.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                progress.update(len(chunk))
    finally:
        progress.close()
    if expected_body is not None and received < expected_body:
        raise _Incomplete(
            f"transfer ended after {offset + received} of {offset + expected_body} bytes"
        )
    return digest.hexdigest()


def _read_chunks(response: http.client.HTTPResponse) -> Iterator[bytes]:
    """The response body in chunks; an early close surfaces as ``_Incomplete``."""
    while True:
        try:
            chunk = response.read(CHUNK)
        except http.client.IncompleteRead as error:
            if error.partial:
                yield error.partial
            raise _Incomplete("connection closed mid-body") from error
        if not chunk:
            return
        yield chunk


def _hash_existing(path: Path, algorithm: str) -> hashlib._Hash:
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest


def _content_range_total(header: str | None) -> int | None:
    """The total size in a ``Content-Range: bytes a-b/total`` (or ``bytes */total``) header."""
    match = re.search(r"/(\d+)\s*$", header or "")
    return int(match.group(1)) if match else None
