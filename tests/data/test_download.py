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

from tests.helpers.fixtures_data import cifar10c_archive, cifar_archive, md5_of, running_server
from tests.helpers.repo import REPO
from vitplasticity.cli import main
from vitplasticity.data.download import ChecksumError, DownloadError, download
from vitplasticity.data.sources import SOURCES, registry

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
    # docs/protocol.md's md5s.
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
    repo = REPO
    datasets = list(yaml.safe_load((repo / "config/config.yaml").read_text())["datasets"])
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
            str(repo / "workflow/Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(repo / "config/config.yaml"),
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


# --- per-file checksum overrides (datasets.<name>.checksums) -----------------------------------

SHA256 = hashlib.sha256(PAYLOAD).hexdigest()


def test_download_verifies_a_sha256_and_resumes_with_it(http_server, tmp_path):
    (tmp_path / "archive.bin.part").write_bytes(PAYLOAD[:1000])
    path = fetch(http_server, tmp_path, md5=None, checksum=f"sha256:{SHA256}")
    assert path.read_bytes() == PAYLOAD
    assert http_server.requests == [("/data/archive.bin", "bytes=1000-")]
    fetch(http_server, tmp_path, md5=None, checksum=f"sha256:{SHA256.upper()}")
    assert len(http_server.requests) == 1  # the kept file verifies: no second request


def test_wrong_sha256_names_both_digests_and_deletes(http_server, tmp_path):
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as error:
        fetch(http_server, tmp_path, checksum=f"sha256:{wrong}")  # replaces the right md5
    assert f"expected sha256 {wrong}, got {SHA256}" in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_checksum_override_reaches_the_download_job(http_server, tmp_path):
    """A mirror with other bytes than the registry's: the registry's md5 rejects them, the
    dataset's checksums entry (resolved as the download rule resolves it) accepts them."""
    http_server.add("mirror/setid.mat", PAYLOAD)
    datasets = {
        "flowers": {
            "source": "flowers102",
            "url": http_server.url("mirror/"),
            "checksums": {"setid.mat": f"sha256:{SHA256}"},
        },
        "flowers-again": {"source": "flowers102"},  # shares the download, no override
    }
    checksum = registry.download_checksum(datasets, "setid.mat")
    assert checksum == registry.Checksum("sha256", SHA256)
    assert registry.download_checksum(datasets, "imagelabels.mat") == registry.Checksum(
        "md5", registry.FILES["imagelabels.mat"].md5
    )
    url = registry.download_url(datasets, "setid.mat")
    assert url == http_server.url("mirror/setid.mat")
    out = tmp_path / "downloads" / "setid.mat"
    args = ["download", "--file", "setid.mat", "--url", url, "--out", str(out)]
    assert main(args) == 2 and not out.exists()  # the registry's md5
    assert main([*args, "--checksum", str(checksum)]) == 0
    assert out.read_bytes() == PAYLOAD
    # The prepare job of the dataset sharing the file verifies what the download job did.
    shared = registry.with_download_checksums(datasets, "flowers-again")
    assert shared["checksums"] == {"setid.mat": f"sha256:{SHA256}"}
    assert "checksums" not in registry.with_download_checksums({"f": {"source": "pet"}}, "f")


def test_shared_download_prepares_every_dataset_from_the_mirror(http_server, tmp_path):
    """Two CIFAR-10-C corruptions share one download; the mirror's bytes differ from the
    registry's and only one entry gives their checksum: both prepare from the one download."""
    data = cifar10c_archive(n_per_severity=20).blobs["CIFAR-10-C.tar"]
    http_server.add("m/CIFAR-10-C.tar", data)
    sha = hashlib.sha256(data).hexdigest()
    datasets = {
        "snow": {
            "source": "cifar10c",
            "corruption": "snow",
            "url": http_server.url("m/CIFAR-10-C.tar"),
            "checksums": {"CIFAR-10-C.tar": f"sha256:{sha}"},
        },
        "blur": {"source": "cifar10c", "corruption": "motion_blur"},
    }
    downloads = tmp_path / "downloads"
    download(
        registry.download_url(datasets, "CIFAR-10-C.tar"),
        downloads / "CIFAR-10-C.tar",
        checksum=registry.download_checksum(datasets, "CIFAR-10-C.tar"),
    )
    for name in datasets:
        spec = registry.with_download_checksums(datasets, name)
        counts = SOURCES["cifar10c"].prepare(
            name, spec, tmp_path / name, downloads, expected={"pool": 16, "test": 4}
        )
        assert counts == {"pool": 16, "test": 4}
    assert len(http_server.requests) == 1


def test_checksum_override_accepts_a_local_archive(tmp_path):
    data = cifar_archive("cifar10").blobs["cifar-10-python.tar.gz"]
    path = tmp_path / "my-cifar10.tar.gz"
    path.write_bytes(data)  # not the registry's bytes (a re-packed copy)
    spec = {"source": "cifar10", "archive": str(path)}

    def prepare(out: str) -> dict:
        return SOURCES["cifar10"].prepare(
            "c10", spec, tmp_path / out, tmp_path / "dl", expected={"pool": 30, "test": 6}
        )

    with pytest.raises(ChecksumError, match=registry.FILES["cifar-10-python.tar.gz"].md5):
        prepare("a")
    spec["checksums"] = {"cifar-10-python.tar.gz": "sha256:" + "0" * 64}
    with pytest.raises(ChecksumError) as error:
        prepare("b")
    sha = hashlib.sha256(data).hexdigest()
    assert f"datasets.c10.archive: checksum mismatch for {path}" in str(error.value)
    # The wrong digest is the user's: the error says so, and to correct it.
    origin = "from your config datasets.c10.checksums.cifar-10-python.tar.gz"
    assert f"expected sha256 {'0' * 64} (cifar-10-python.tar.gz, {origin}), got {sha}" in str(
        error.value
    )
    assert str(error.value).endswith("(or, if these bytes are right, correct that digest)")
    spec["checksums"] = {"cifar-10-python.tar.gz": f"sha256:{sha}"}
    assert prepare("c") == {"pool": 30, "test": 6}
    assert path.read_bytes() == data and not (tmp_path / "dl").exists()


def test_overrides_are_checked_where_the_registry_reads_them():
    spec = {"source": "pet", "url": "https://mirror.example/pets"}
    with pytest.raises(ValueError, match=r"datasets\.p\.url: .* needs 2 files .* end it with '/'"):
        registry.remote_file("p", spec, "images.tar.gz")
    single = {"source": "cifar10", "url": "https://mirror.example/c10.tgz"}
    assert registry.remote_file("c", single, "cifar-10-python.tar.gz").url == single["url"]
    bad = {"source": "pet", "checksums": {"images.tar.gz": "md5:123"}}
    with pytest.raises(ValueError, match=r"datasets\.p\.checksums\.images\.tar\.gz: .*32 hex"):
        registry.file_checksum("p", bad, "images.tar.gz")
    with pytest.raises(ValueError, match=r"'setid\.mat' is not a file of this pet entry"):
        registry.file_checksum(
            "p", {"source": "pet", "checksums": {"setid.mat": "md5:" + "0" * 32}}, "images.tar.gz"
        )
    assert registry.Checksum.parse(" SHA256:" + "AB" * 32) == registry.Checksum("sha256", "ab" * 32)


def test_an_md5_and_a_sha256_of_the_same_file_do_not_conflict(http_server, tmp_path):
    """One entry gives the mirror file's md5, another its sha256: both identify the same
    bytes, so both datasets prepare from one download (verified against the sha256); two
    different digests of one algorithm still conflict."""
    data = cifar10c_archive(n_per_severity=20).blobs["CIFAR-10-C.tar"]
    http_server.add("m/CIFAR-10-C.tar", data)
    sha = f"sha256:{hashlib.sha256(data).hexdigest()}"
    md5 = f"md5:{hashlib.md5(data).hexdigest()}"
    url = http_server.url("m/CIFAR-10-C.tar")
    datasets = {
        "snow": {"source": "cifar10c", "corruption": "snow", "url": url,
                 "checksums": {"CIFAR-10-C.tar": md5}},
        "blur": {"source": "cifar10c", "corruption": "motion_blur", "url": url,
                 "checksums": {"CIFAR-10-C.tar": sha}},
    }  # fmt: skip
    assert registry.shared_download_problems(datasets) == []
    assert str(registry.download_checksum(datasets, "CIFAR-10-C.tar")) == sha
    downloads = tmp_path / "downloads"
    download(
        url,
        downloads / "CIFAR-10-C.tar",
        checksum=registry.download_checksum(datasets, "CIFAR-10-C.tar"),
    )
    for name in datasets:
        spec = registry.with_download_checksums(datasets, name)
        counts = SOURCES["cifar10c"].prepare(
            name, spec, tmp_path / name, downloads, expected={"pool": 16, "test": 4}
        )
        assert counts == {"pool": 16, "test": 4}
    assert len(http_server.requests) == 1

    datasets["blur"]["checksums"] = {"CIFAR-10-C.tar": "MD5:" + md5[4:].upper()}  # same md5
    assert registry.shared_download_problems(datasets) == []
    datasets["blur"]["checksums"] = {"CIFAR-10-C.tar": "md5:" + "0" * 32}
    (problem,) = registry.shared_download_problems(datasets)
    assert "conflicting checksums overrides for CIFAR-10-C.tar" in problem


def test_a_wrong_digest_of_the_users_keeps_the_file_already_there(http_server, tmp_path):
    """A file already downloaded (verified by another dataset's digest) that the user's own
    digest rejects is kept and the error names that digest's config key: no new fetch."""
    data = b"the mirror's bytes" * 100
    url = http_server.add("m/setid.mat", data)
    dest = tmp_path / "setid.mat"
    dest.write_bytes(data)
    with pytest.raises(ChecksumError) as error:
        download(
            url,
            dest,
            checksum="md5:" + "0" * 32,
            checksum_origin="datasets.f.checksums.setid.mat",
        )
    message = str(error.value)
    assert f"checksum mismatch for {url} ({dest})" in message
    assert message.endswith(
        "the expected digest is yours, from datasets.f.checksums.setid.mat: correct it, or "
        f"delete {dest} and rerun to download the file again"
    )
    assert dest.read_bytes() == data and http_server.requests == []
