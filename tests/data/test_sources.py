"""Every real source, end to end against a local HTTP server: download, verify, parse, split
and write the prepared store; compared with what the test archives hold."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from tests.helpers.fixtures_data import (
    cifar10c_archive,
    cifar_archive,
    domainnet_archive,
    flowers_archive,
    md5_of,
    pet_archive,
    registry_override,
    running_server,
)
from vitplasticity.data import download as download_module
from vitplasticity.data.archives import ArchiveError
from vitplasticity.data.download import ChecksumError
from vitplasticity.data.sources import SOURCES
from vitplasticity.data.sources.registry import RemoteFile
from vitplasticity.data.store import read_meta, read_split, split_pool


@pytest.fixture
def http_server():
    with running_server() as server:
        yield server


def legacy_seed42_split(n: int) -> tuple[list[int], list[int]]:
    """The reference code's deterministic_split, written out: np.random.seed(42), permutation."""
    state = np.random.get_state()
    np.random.seed(42)
    order = np.random.permutation(range(n))
    np.random.set_state(state)
    n_train = int(0.8 * n)
    return sorted(order[:n_train].tolist()), sorted(order[n_train:].tolist())


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def prepare(source, tmp_path, server, built, spec=None, expected=None):
    files = registry_override(server, built)
    out = tmp_path / "store" / source
    counts = SOURCES[source].prepare(
        f"test-{source}",
        {"source": source, **(spec or {})},
        out,
        tmp_path / "downloads",
        files=files,
        expected=expected,
    )
    return out, counts


@pytest.mark.parametrize("kind", ["cifar10", "cifar100"])
def test_cifar(kind, tmp_path, http_server):
    built = cifar_archive(kind)
    n_train = 30 if kind == "cifar10" else 6
    out, counts = prepare(kind, tmp_path, http_server, built, expected={"pool": n_train, "test": 6})
    assert counts == {"pool": n_train, "test": 6}
    meta = read_meta(out)
    assert meta["class_names"] == built.truth["class_names"]
    assert meta["num_classes"] == (10 if kind == "cifar10" else 100)
    for split in ("pool", "test"):
        data = read_split(out, split)
        truth = built.truth[split]
        assert data.files == [f for _, _, f in truth]
        assert data.labels.tolist() == [label for _, label, _ in truth]
        for png, (array, _, _) in zip(data.images, truth, strict=True):
            np.testing.assert_array_equal(decode(png), array)  # lossless, channels-last
    # The downloaded archive stays in the cache for the next run.
    assert (tmp_path / "downloads" / next(iter(built.blobs))).is_file()


def test_real_counts_are_checked_by_default(tmp_path, http_server):
    built = cifar_archive("cifar10")
    with pytest.raises(ValueError, match=r"datasets\.test-cifar10: .*pool: 30 instead of 50000"):
        prepare("cifar10", tmp_path, http_server, built)
    assert not (tmp_path / "store" / "cifar10").exists()


@pytest.mark.parametrize("severity", [5, 2])
def test_cifar10c(severity, tmp_path, http_server):
    built = cifar10c_archive(n_per_severity=20)
    spec = {"corruption": "motion_blur", "severity": severity}
    out, counts = prepare("cifar10c", tmp_path, http_server, built, spec, {"pool": 16, "test": 4})
    assert counts == {"pool": 16, "test": 4}
    rows = np.arange((severity - 1) * 20, severity * 20)
    pool_idx, test_idx = legacy_seed42_split(20)
    for split, idx in (("pool", pool_idx), ("test", test_idx)):
        data = read_split(out, split)
        chosen = rows[idx]
        assert data.files == [f"motion_blur.npy[{r}]" for r in chosen]
        assert data.labels.tolist() == built.truth["labels"][chosen].tolist()
        for png, row in zip(data.images, chosen, strict=True):
            np.testing.assert_array_equal(decode(png), built.truth["motion_blur"][row])
    meta = read_meta(out)
    assert meta["severity"] == severity and meta["class_names"][0] == "airplane"


def test_cifar10c_rejects_unknown_corruption(tmp_path, http_server):
    with pytest.raises(ValueError, match=r"datasets\.test-cifar10c\.corruption"):
        prepare("cifar10c", tmp_path, http_server, cifar10c_archive(), {"corruption": "rain"})
    assert http_server.requests == []  # rejected before any download


def test_domainnet_random_split(tmp_path, http_server):
    built = domainnet_archive()
    out, counts = prepare(
        "domainnet", tmp_path, http_server, built, {"domain": "clipart"}, {"num_classes": 3}
    )
    ordered = sorted(built.truth["images"])  # ImageFolder order: class, then file name
    pool_idx, test_idx = legacy_seed42_split(len(ordered))
    assert counts == {"pool": len(pool_idx), "test": len(test_idx)}
    classes = read_meta(out)["class_names"]
    assert classes == ["cls_a", "cls_b", "cls_c"]
    for split, idx in (("pool", pool_idx), ("test", test_idx)):
        data = read_split(out, split)
        assert data.files == [ordered[i] for i in idx]
        assert data.images == [built.truth["images"][ordered[i]] for i in idx]  # original JPEG
        assert [classes[k] for k in data.labels] == [ordered[i].split("/")[1] for i in idx]
    # The split lists were not needed, so not downloaded.
    assert not (tmp_path / "downloads" / "clipart_train.txt").exists()


def test_domainnet_official_split(tmp_path, http_server):
    built = domainnet_archive("sketch")
    spec = {"domain": "sketch", "split": "official"}
    out, _ = prepare("domainnet", tmp_path, http_server, built, spec, {"num_classes": 3})
    assert read_split(out, "pool").files == built.truth["train"]
    assert read_split(out, "test").files == built.truth["test"]


def test_flowers102(tmp_path, http_server):
    built = flowers_archive()
    out, counts = prepare(
        "flowers102", tmp_path, http_server, built, expected={"pool": 5, "val": 4, "test": 9}
    )
    assert counts == {"pool": 5, "val": 4, "test": 9}
    for split, key in (("pool", "trnid"), ("val", "valid"), ("test", "tstid")):
        ids = built.truth["setid"][key].tolist()
        data = read_split(out, split)
        assert data.files == [f"jpg/image_{i:05d}.jpg" for i in ids]
        assert data.labels.tolist() == [int(built.truth["labels"][i - 1]) - 1 for i in ids]
        assert data.images == [built.truth["images"][i] for i in ids]
    meta = read_meta(out)
    assert meta["class_names"] == ["pink primrose", "hard-leaved pocket orchid", "canterbury bells"]


def test_pet(tmp_path, http_server):
    built = pet_archive()
    out, counts = prepare("pet", tmp_path, http_server, built, expected={"pool": 9, "test": 6})
    assert counts == {"pool": 9, "test": 6}
    assert read_meta(out)["class_names"] == ["Abyssinian", "American Bulldog", "Great Pyrenees"]
    for split, rows in (("pool", "trainval"), ("test", "test")):
        data = read_split(out, split)
        entries = built.truth["rows"][rows]
        assert data.files == [f"images/{i}.jpg" for i, _ in entries]
        assert data.labels.tolist() == [c - 1 for _, c in entries]
        assert data.images == [built.truth["images"][i] for i, _ in entries]


def test_prepared_pool_feeds_the_run_seed_split(tmp_path, http_server):
    # The store is the one loading path: the finetuning stage splits the pool by run seed.
    out, _ = prepare("pet", tmp_path, http_server, pet_archive(), expected={"pool": 9, "test": 6})
    pool = read_split(out, "pool")
    train, val = split_pool(len(pool), seed=3407)
    assert sorted([*train, *val]) == list(range(len(pool)))
    assert len(val) == round(0.2 * len(pool))


def test_download_faults_during_prepare(tmp_path, http_server, monkeypatch):
    monkeypatch.setattr(download_module, "RETRY_BACKOFF_S", 0.01)  # keep the test fast
    built = pet_archive()
    files = registry_override(http_server, built)
    http_server.fault("files/images.tar.gz", "500", "drop")
    SOURCES["pet"].prepare(
        "pets",
        {"source": "pet"},
        tmp_path / "pet",
        tmp_path / "dl",
        files=files,
        expected={"pool": 9, "test": 6},
    )
    ranges = [r for path, r in http_server.requests if path == "/files/images.tar.gz"]
    assert ranges[:2] == [None, None] and ranges[2].startswith("bytes=")
    assert read_split(tmp_path / "pet", "test").images[0] == built.truth["images"]["Abyssinian_4"]


def test_corrupted_download_is_rejected_and_deleted(tmp_path, http_server):
    built = pet_archive()
    files = registry_override(http_server, built)
    good = built.blobs["images.tar.gz"]
    http_server.files["/files/images.tar.gz"] = good[:100] + bytes([good[100] ^ 0xFF]) + good[101:]
    with pytest.raises(ChecksumError, match=files["images.tar.gz"].md5) as error:
        SOURCES["pet"].prepare(
            "pets", {"source": "pet"}, tmp_path / "p", tmp_path / "dl", files=files
        )
    assert files["images.tar.gz"].url in str(error.value)
    assert not (tmp_path / "dl" / "images.tar.gz").exists()
    assert not (tmp_path / "p").exists()


def test_local_archive_folder_and_mirror_url(tmp_path, http_server):
    built = flowers_archive()
    local = tmp_path / "mine"
    local.mkdir()
    for name, data in built.blobs.items():
        (local / name).write_bytes(data)
    files = {
        n: RemoteFile(n, "http://127.0.0.1:9/never", md5_of(d)) for n, d in built.blobs.items()
    }
    expected = {"pool": 5, "val": 4, "test": 9}
    spec = {"source": "flowers102", "archive": str(local)}
    SOURCES["flowers102"].prepare(
        "f", spec, tmp_path / "a", tmp_path / "dl", files=files, expected=expected
    )
    assert not (tmp_path / "dl").exists()  # nothing downloaded
    # A mirror folder URL: every file is fetched from it by its registry name.
    for name, data in built.blobs.items():
        http_server.add(f"mirror/{name}", data)
    spec = {"source": "flowers102", "url": http_server.url("mirror/")}
    SOURCES["flowers102"].prepare(
        "f", spec, tmp_path / "b", tmp_path / "dl", files=files, expected=expected
    )
    assert sorted(p for p, _ in http_server.requests) == sorted(f"/mirror/{n}" for n in built.blobs)
    assert read_split(tmp_path / "a", "test").images == read_split(tmp_path / "b", "test").images


def test_local_archive_errors_name_the_key(tmp_path):
    built = cifar_archive("cifar10")
    data = built.blobs["cifar-10-python.tar.gz"]
    files = {"cifar-10-python.tar.gz": RemoteFile("cifar-10-python.tar.gz", "x", md5_of(data))}
    spec = {"source": "cifar10", "archive": str(tmp_path / "absent.tar.gz")}
    with pytest.raises(FileNotFoundError, match=r"datasets\.c10\.archive: .*absent\.tar\.gz"):
        SOURCES["cifar10"].prepare("c10", spec, tmp_path / "o", tmp_path / "dl", files=files)
    wrong = tmp_path / "wrong.tar.gz"
    wrong.write_bytes(data + b"junk")
    spec["archive"] = str(wrong)
    with pytest.raises(ChecksumError, match=r"datasets\.c10\.archive: checksum mismatch"):
        SOURCES["cifar10"].prepare("c10", spec, tmp_path / "o", tmp_path / "dl", files=files)
    assert wrong.exists()  # the user's own file is never deleted


def test_corrupted_archive_with_matching_checksum(tmp_path):
    # A damaged archive whose md5 is what the registry says (e.g. a bad private mirror).
    data = cifar_archive("cifar10").blobs["cifar-10-python.tar.gz"]
    broken = data[: len(data) // 2]
    path = tmp_path / "cifar-10-python.tar.gz"
    path.write_bytes(broken)
    files = {path.name: RemoteFile(path.name, "x", md5_of(broken))}
    spec = {"source": "cifar10", "archive": str(path)}
    with pytest.raises(ArchiveError, match="corrupted or truncated archive") as error:
        SOURCES["cifar10"].prepare("c10", spec, tmp_path / "o", tmp_path / "dl", files=files)
    assert str(path) in str(error.value)


def test_meta_records_counts_and_files(tmp_path, http_server):
    out, _ = prepare("pet", tmp_path, http_server, pet_archive(), expected={"pool": 9, "test": 6})
    meta = json.loads((out / "meta.json").read_text())
    assert meta["splits"] == {"pool": 9, "test": 6}
    assert meta["expected_counts"] == {"pool": 9, "test": 6}
    assert meta["source"] == "pet" and meta["num_classes"] == 3
    assert set(meta["files"]) == {"images.tar.gz", "annotations.tar.gz"}
