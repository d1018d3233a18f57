"""A stand-in for the Hugging Face hub: a local HTTP server on 127.0.0.1.

It speaks the protocol huggingface_hub's ``hf_hub_download`` uses:
``HEAD {endpoint}/{repo}/resolve/{revision}/{file}`` answered like an LFS file (302 with
X-Repo-Commit, X-Linked-Etag = the sha256, X-Linked-Size, Location on another host:
``localhost``, the "CDN"), then ``GET`` of that location, or for a small git file (not
.safetensors / .bin) like the hub does: 200 with ETag = its git blob id; errors as 404/403
with the hub's X-Error-Code. For ``snapshot_download`` it also answers the API calls
``GET /api/models/{repo}/revision/{revision}`` (the commit) and
``GET /api/models/{repo}/tree/{commit}`` (every file with its size, blob id and LFS sha256).
Every repo is at one commit, :data:`COMMIT`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (the hub's ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def is_lfs(filename: str) -> bool:
    """Whether the stand-in hub stores ``filename`` in LFS (weights, as the hub's
    .gitattributes do), else as a git file."""
    return filename.endswith((".safetensors", ".bin"))


class FakeHub:
    """A hub endpoint on 127.0.0.1 serving ``repos`` ({repo_id: {filename: bytes}}).

    Every request is logged in ``requests`` as (method, path). Each response closes its
    connection, so that :meth:`stop` leaves no kept-alive connection that still answers.
    """

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: tuple[str, ...] = ()) -> None:
        self.repos = repos
        self.gated = set(gated)
        self.requests: list[tuple[str, str]] = []
        self.blobs = {
            hashlib.sha256(data).hexdigest(): data for f in repos.values() for data in f.values()
        }
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(handler.path.split("?")[0])
        self.requests.append((handler.command, path))

        def send(status: int, headers: dict[str, str], payload: bytes = b"") -> None:
            handler.send_response(status)
            for key, value in {**headers, "Connection": "close"}.items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            if body:
                handler.wfile.write(payload)
            handler.close_connection = True

        if path.startswith("/blobs/"):  # the "CDN"
            data = self.blobs.get(path.removeprefix("/blobs/"))
            if data is None:
                return send(404, {})
            return send(200, {"ETag": f'"{path.removeprefix("/blobs/")}"'}, data)
        api = path.startswith("/api/models/")
        parts = path.removeprefix("/api/models").strip("/").split("/")
        if api and len(parts) >= 4 and parts[2] in ("revision", "tree"):
            repo, revision, filename = "/".join(parts[:2]), parts[3], ""
        elif not api and len(parts) >= 5 and parts[2] == "resolve":
            repo, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        else:
            return send(404, {})
        if repo in self.gated:
            return send(403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "restricted"})
        if repo not in self.repos:
            return send(404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "not found"})
        if revision not in ("main", COMMIT):
            return send(404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "bad rev"})
        if api:
            return send(200, {"Content-Type": "application/json"}, self.api_answer(repo, parts[2]))
        data = self.repos[repo].get(filename)
        if data is None:
            return send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT})
        if not is_lfs(filename):  # a git file: served here, its ETag the blob id
            return send(200, {"X-Repo-Commit": COMMIT, "ETag": f'"{git_blob_id(data)}"'}, data)
        sha256 = hashlib.sha256(data).hexdigest()
        return send(
            302,
            {
                "X-Repo-Commit": COMMIT,
                "X-Linked-Etag": f'"{sha256}"',
                "X-Linked-Size": str(len(data)),
                "ETag": '"git-pointer"',
                "Location": f"http://localhost:{self.port}/blobs/{sha256}",
            },
        )

    def api_answer(self, repo: str, call: str) -> bytes:
        """The JSON of ``repo_info`` (``revision``) or of ``list_repo_tree`` (``tree``)."""
        files = self.repos[repo]
        if call == "revision":
            siblings = [{"rfilename": name} for name in files]
            return json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode()
        tree = []
        for name, data in files.items():
            entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
            if is_lfs(name):
                lfs = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data)}
                entry["lfs"] = {**lfs, "pointerSize": 134}
            tree.append(entry)
        return json.dumps(tree).encode()

    def file_requests(self) -> list[tuple[str, str]]:
        """The requests for weights: resolve and blob URLs. (huggingface_hub 2.x may also GET
        /api/agent-harnesses, best-effort telemetry that a 404 leaves alone.)"""
        return [r for r in self.requests if "/resolve/" in r[1] or r[1].startswith("/blobs/")]

    def downloads(self) -> list[tuple[str, str]]:
        """The requests that transferred a file body (GET of a blob)."""
        return [r for r in self.file_requests() if r[0] == "GET" and r[1].startswith("/blobs/")]


def hub_env(hub_url: str, hf_home: Path) -> dict[str, str]:
    """The environment of a subprocess that uses the fake hub through HF_ENDPOINT and HF_HOME."""
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))} | {
        "HF_ENDPOINT": hub_url,
        "HF_HOME": str(hf_home),
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    return env
