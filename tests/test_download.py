"""The downloader against a local HTTP server: resume, retries, checksums, atomicity; the
registry and the ``download`` CLI."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fixtures_data import md5_of, running_server
from vitplasticity.cli import main
from vitplasticity.data.download import ChecksumError, DownloadError, download
from vitplasticity.data.sources import registry

PAYLOAD = os.urandom(3 * (1 << 20) + 12345)  # > 1 read chunk, so drops land mid-body
MD5 = hashlib.md5(PAYLOAD).hexdigest()


@pytest.fixture
def http_server():
    with running_server() as server:
        yield server


def fetch(server, tmp_path, **kwargs):
    url = server.add("data/archive.bin", PAYLOAD)
    kwargs.setdefault("md5", MD5)
    return download(url, tmp_path / "archive.bin", backoff=0.01, **kwargs)


def test_download_writes_verified_file_and_no_part(http_server, tmp_path):
    path = fetch(http_server, tmp_path)
    assert path.read_bytes() == PAYLOAD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archive.bin"]


def test_verified_file_is_not_fetched_again(http_server, tmp_path):
    fetch(http_server, tmp_path)
    fetch(http_server, tmp_path)
    assert len(http_server.requests) == 1


def test_http_500_is_retried(http_server, tmp_path):
    http_server.fault("data/archive.bin", "500", "500")
    assert fetch(http_server, tmp_path).read_bytes() == PAYLOAD
    assert len(http_server.requests) == 3


def test_dropped_connection_resumes_with_range(http_server, tmp_path):
    http_server.fault("data/archive.bin", "drop")
    assert fetch(http_server, tmp_path).read_bytes() == PAYLOAD
    (_, first_range), (_, second_range) = http_server.requests
    assert first_range is None
    offset = int(second_range.removeprefix("bytes=").rstrip("-"))
    assert 0 < offset < len(PAYLOAD)


def test_interrupted_download_resumes_from_part_file(http_server, tmp_path):
    # A killed job leaves <dest>.part: the next run asks only for the rest.
    (tmp_path / "archive.bin.part").write_bytes(PAYLOAD[:1000])
    assert fetch(http_server, tmp_path).read_bytes() == PAYLOAD
    assert http_server.requests == [("/data/archive.bin", "bytes=1000-")]


def test_server_ignoring_range_restarts_cleanly(http_server, tmp_path):
    (tmp_path / "archive.bin.part").write_bytes(PAYLOAD[:1000])
    http_server.fault("data/archive.bin", "no_range")
    assert fetch(http_server, tmp_path).read_bytes() == PAYLOAD


def test_complete_part_file_is_finished_without_body(http_server, tmp_path):
    (tmp_path / "archive.bin.part").write_bytes(PAYLOAD)
    assert fetch(http_server, tmp_path).read_bytes() == PAYLOAD
    assert http_server.requests == [("/data/archive.bin", f"bytes={len(PAYLOAD)}-")]


def test_truncated_download_fails_checksum_names_url_and_deletes(http_server, tmp_path):
    http_server.fault("data/archive.bin", "truncate")
    with pytest.raises(ChecksumError) as error:
        fetch(http_server, tmp_path)
    actual = md5_of(PAYLOAD[: len(PAYLOAD) // 2])
    message = str(error.value)
    assert http_server.url("data/archive.bin") in message
    assert MD5 in message and actual in message
    assert list(tmp_path.iterdir()) == []
    # The next run (the fault is gone) succeeds.
    assert fetch(http_server, tmp_path).read_bytes() == PAYLOAD


def test_corrupted_existing_file_is_replaced(http_server, tmp_path):
    (tmp_path / "archive.bin").write_bytes(b"corrupted" + PAYLOAD[9:])
    assert fetch(http_server, tmp_path).read_bytes() == PAYLOAD


def test_not_found_is_permanent(http_server, tmp_path):
    with pytest.raises(DownloadError, match="404") as error:
        download(http_server.url("missing.bin"), tmp_path / "x", md5=None, backoff=0.01)
    assert http_server.url("missing.bin") in str(error.value)
    assert len(http_server.requests) == 1


def test_retries_run_out(http_server, tmp_path):
    http_server.fault("data/archive.bin", *["500"] * 4)
    with pytest.raises(DownloadError, match="giving up after 3"):
        fetch(http_server, tmp_path, retries=2)


def test_unknown_md5_downloads_and_warns(http_server, tmp_path, caplog):
    path = fetch(http_server, tmp_path, md5=None)
    assert path.read_bytes() == PAYLOAD
    assert MD5 in caplog.text


def test_cli_download(http_server, tmp_path):
    url = http_server.add("mirror/setid.mat", PAYLOAD)
    out = tmp_path / "downloads" / "setid.mat"
    args = ["download", "--file", "setid.mat", "--url", url, "--out", str(out)]
    # The registry's md5 (of the real setid.mat) rejects these bytes; an explicit one accepts.
    assert main(args) == 2
    assert not out.exists()
    assert main([*args, "--md5", MD5]) == 0
    assert out.read_bytes() == PAYLOAD
    assert main(["download", "--file", "nope.zip", "--out", str(out)]) == 2


# --- the registry ----------------------------------------------------------------------


def test_registry_entries_are_complete():
    for name, entry in registry.FILES.items():
        assert entry.filename == name
        assert entry.url.startswith(("http://", "https://"))
        assert entry.md5 is not None and len(entry.md5) == 32, name
        int(entry.md5, 16)
    # PROTOCOL.md's md5s.
    assert registry.FILES["cifar-10-python.tar.gz"].md5 == "c58f30108f718f92721af3b95e74349a"
    assert registry.FILES["CIFAR-10-C.tar"].md5 == "56bf5dcef84df0e2308c6dcbcbbd8499"
    assert registry.FILES["sketch.zip"].md5 == "658d8009644040ff7ce30bb2e820850f"


def test_source_files_per_source():
    assert registry.source_files("domainnet", {"domain": "sketch"}) == ["sketch.zip"]
    assert registry.source_files("domainnet", {"domain": "sketch", "split": "official"}) == [
        "sketch.zip",
        "sketch_train.txt",
        "sketch_test.txt",
    ]
    with pytest.raises(ValueError, match="domain"):
        registry.source_files("domainnet", {"domain": "photos"})


def test_download_inputs_and_overrides(tmp_path):
    (tmp_path / "imagelabels.mat").write_bytes(b"")
    datasets = {
        "flowers": {"source": "flowers102", "archive": str(tmp_path)},
        "pets": {"source": "pet", "url": "https://mirror.example/pets/"},
        "c1": {"source": "cifar10c", "corruption": "snow", "url": "https://m.example/c.tar"},
        "c2": {"source": "cifar10c", "corruption": "contrast"},
        "demo": {"source": "synthetic"},
    }
    assert registry.download_inputs(datasets, "flowers", "dl") == [
        str(tmp_path / f) for f in ("102flowers.tgz", "imagelabels.mat", "setid.mat")
    ]
    assert registry.download_inputs(datasets, "pets", "dl") == [
        "dl/images.tar.gz",
        "dl/annotations.tar.gz",
    ]
    assert registry.download_inputs(datasets, "demo", "dl") == []
    assert (
        registry.download_url(datasets, "annotations.tar.gz")
        == "https://mirror.example/pets/annotations.tar.gz"
    )
    assert registry.download_url(datasets, "CIFAR-10-C.tar") == "https://m.example/c.tar"
    assert registry.download_url(datasets, "setid.mat") == registry.FILES["setid.mat"].url
    datasets["c2"]["url"] = "https://other.example/c.tar"
    with pytest.raises(ValueError, match=r"conflicting url overrides for CIFAR-10-C\.tar"):
        registry.download_url(datasets, "CIFAR-10-C.tar")
    with pytest.raises(ValueError, match=r"datasets\.x\.archive"):
        registry.local_archives("x", {"source": "pet", "archive": {"setid.mat": "a"}})


def test_registry_imports_without_numpy_or_torch():
    code = (
        "import sys; import vitplasticity.data.sources as s; "
        "assert s.FILES; print('numpy' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_missing_local_url_fails_at_once(tmp_path):
    with pytest.raises(DownloadError, match="No such file"):
        download((tmp_path / "absent.tar").as_uri(), tmp_path / "x.tar", md5=None, backoff=5.0)


@pytest.mark.slow
def test_workflow_dry_run_wires_downloads(tmp_path):
    """A dry run (no network) of every dataset: one local download job per registry file
    needed, none for a dataset whose archive is on disk, mirror URLs reach the command."""
    repo = Path(__file__).resolve().parents[1]
    datasets = list(yaml.safe_load((repo / "config.yaml").read_text())["datasets"])
    archive = tmp_path / "my-cifar10.tar.gz"
    archive.write_bytes(b"")
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        f"paths: {{resources: {tmp_path / 'res'}, results: {tmp_path / 'out'}}}\n"
        f"datasets:\n  cifar10: {{archive: {archive}}}\n"
        "  pet: {url: 'https://mirror.example/pets/'}\n"
    )
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [
            str(bindir / "snakemake"),
            "--snakefile",
            str(repo / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(repo / "config.yaml"),
            str(overlay),
            "-n",
            "-p",
            "--nolock",
            *(str(tmp_path / "res" / "datasets" / name) for name in datasets),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    commands = re.findall(r"vitplasticity download --file (\S+) --url (\S+)", out)
    downloaded = {name.strip("'") for name, _ in commands}
    assert downloaded == {
        "cifar-100-python.tar.gz",
        "CIFAR-10-C.tar",  # one download shared by the five corruptions
        "clipart.zip",
        "sketch.zip",
        "102flowers.tgz",
        "imagelabels.mat",
        "setid.mat",
        "images.tar.gz",
        "annotations.tar.gz",
    }
    urls = {name.strip("'"): url.strip("'") for name, url in commands}
    assert urls["images.tar.gz"] == "https://mirror.example/pets/images.tar.gz"
    assert urls["clipart.zip"] == registry.FILES["clipart.zip"].url
    assert f"input: {archive}" in out
