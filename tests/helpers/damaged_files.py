"""Damaging intact files the ways they arrive damaged (truncated, an HTML error page saved under
the expected name, an archive packed again without a member or with one replaced), and the one
error line a damaged file must end in: the tests of the dataset sources and of every stage's
inputs (tests/commands/test_damaged_*.py) share them."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from tests.helpers.fixtures_data import jpeg, tar_bytes

HTML = (
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>"
    b"<body><h1>Not Found</h1></body></html>\n"
)
HTML_HINT = "it is an HTML page"


def local_remedy(key: str) -> str:
    """The remedy of a damaged file the user gave under config ``key``."""
    return f"this is your local file from config {key}: replace it; it is never downloaded"


def half(data: bytes) -> bytes:
    """The first half of ``data``: a truncated file."""
    return data[: len(data) // 2]


def html(_: bytes) -> bytes:
    """An HTML error page in place of any file."""
    return HTML


TRUNCATED_JPEG = half(jpeg(3, size=32))


def tar_members(data: bytes) -> dict[str, bytes]:
    """The files of the tar ``data`` by member name."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def retar(data: bytes, mode: str = "w:gz", drop: str = "", **replace: bytes) -> bytes:
    """The tar ``data`` again, without members ending in ``drop`` and with some replaced
    (keyword: the member's last path part, dots as underscores)."""
    members = {}
    for name, content in tar_members(data).items():
        if drop and name.endswith(drop):
            continue
        key = name.rsplit("/", 1)[-1].replace(".", "_").replace("-", "_")
        members[name] = replace.get(key, content)
    return tar_bytes(members, mode)


def assert_message(
    message: str, path: Path, remedy: str, *, member: str | None = None, says: str = ""
) -> None:
    """One line naming the file (and member), what is wrong, and exactly one remedy."""
    assert "\n" not in message, message
    where = f"{path}, member {member}:" if member else f"{path}:"
    assert where in message, message
    assert message.endswith(remedy), message
    assert message.count("rerun") + message.count("replace it") == 1, message
    assert says in message, message
