"""Damaged dataset files end in one clear error from ``vitplasticity prepare``: the file, the
member inside an archive, what is wrong, and the remedy that fits where the file came from (a
download is deleted and fetched again; a local ``archive:``/``root:`` file must be replaced).
Every case builds the real format and then damages it: truncated, an HTML page saved under the
expected name, a missing member, a member of the wrong format, an image the training decoder
rejects. Nothing may be left half-written, by an error or by SIGTERM."""

from __future__ import annotations

import io
import json
import logging
import pickle
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers.damaged_files import (
    HTML,
    HTML_HINT,
    TRUNCATED_JPEG,
    assert_message,
    half,
    html,
    local_remedy,
    retar,
    tar_members,
)
from tests.helpers.fixtures_data import (
    Built,
    cifar10c_archive,
    cifar_archive,
    domainnet_archive,
    flowers_archive,
    jpeg,
    md5_of,
    pet_archive,
    registry_override,
    running_server,
)
from vitplasticity import cli
from vitplasticity.data.archives import DamagedFileError
from vitplasticity.data.download import ChecksumError
from vitplasticity.data.prepare import prepare_dataset
from vitplasticity.data.sources import SOURCES
from vitplasticity.data.sources.registry import RemoteFile, source_files


def download_remedy(path: Path) -> str:
    return f"delete {path} and rerun: it will be downloaded again"


# --- damaging archives ----------------------------------------------------------------------


def encoded(fmt: str, size: int = 12) -> bytes:
    buffer = io.BytesIO()
    rgb = np.random.default_rng(7).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(buffer, fmt)
    return buffer.getvalue()


def rezip(data: bytes, prefix: str = "", **replace: bytes) -> bytes:
    """The zip ``data`` again, ``prefix`` cut from its member names (a re-packed copy), with
    some members replaced (keyword: the member's last path part)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(buffer, "w") as target:
        for name in source.namelist():
            content = replace.get(name.rsplit("/", 1)[-1], source.read(name))
            target.writestr(name.removeprefix(prefix), content)
    return buffer.getvalue()


# --- the dataset sources, through ``vitplasticity prepare`` -----------------------------
#
# One row per damaged file: which source, how its intact files are damaged, whether they
# are the user's local files (config ``archive:``, a folder) or fetched from a mirror URL
# (config ``url:``) into the downloads folder, and what the one error line says. The files'
# checksums are given (config ``checksums:``), so every file reaches its parser.

CIFAR = "cifar-10-python.tar.gz"
C10C = "CIFAR-10-C.tar"


@dataclass(frozen=True)
class Damage:
    """A source prepared from damaged files, and what the error line must say."""

    source: str
    damage: Callable[[dict[str, bytes]], dict[str, bytes]]  # intact files -> the user's
    culprit: str  # the file name the error names
    says: str
    member: str | None = None
    fetched: bool = False  # from a mirror into the downloads folder (else a local archive)
    layout: bool = False  # fetching again brings the same bytes: the remedy says so
    spec: dict[str, Any] = field(default_factory=dict)


def changed(name: str, how: Callable[[bytes], bytes]) -> Callable[[dict], dict]:
    """Replace file ``name`` by ``how`` of its intact bytes."""
    return lambda blobs: {**blobs, name: how(blobs[name])}


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def flip_member_byte(data: bytes, member: str) -> bytes:
    """Flip one byte inside a zip member's stored data (its CRC then fails)."""
    damaged = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo(member)
    # The member's bytes start after its 30-byte local header, name and extra field.
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    damaged[start + 20] ^= 0xFF
    return bytes(damaged)


def mat_without_valid(_: bytes) -> bytes:
    from scipy.io import savemat

    buffer = io.BytesIO()
    savemat(buffer, {"trnid": np.arange(1, 4)})
    return buffer.getvalue()


CLIPART_MISSING = "clipart/cls_a/clipart_009_000009.jpg"
SNOW = {"corruption": "snow", "severity": 2}
CLIPART = {"domain": "clipart"}
OFFICIAL = {"domain": "clipart", "split": "official"}
DAMAGES: dict[str, Damage] = {
    "cifar-truncated-local": Damage(
        "cifar10", changed(CIFAR, half), CIFAR, "corrupted or truncated"
    ),
    "cifar-truncated-downloaded": Damage(
        "cifar10", changed(CIFAR, half), CIFAR, "corrupted or truncated", fetched=True
    ),
    "cifar-html-page": Damage("cifar10", changed(CIFAR, html), CIFAR, HTML_HINT),
    "cifar-missing-member": Damage(
        "cifar10",
        changed(CIFAR, lambda d: retar(d, drop="test_batch")),
        CIFAR,
        "expected one member 'test_batch'",
        fetched=True,
    ),
    "cifar-truncated-pickle": Damage(
        "cifar10",
        changed(
            CIFAR,
            lambda d: retar(
                d, data_batch_2=half(tar_members(d)["cifar-10-batches-py/data_batch_2"])
            ),
        ),
        CIFAR,
        "not a readable CIFAR batch pickle (UnpicklingError: pickle data was truncated)",
        member="cifar-10-batches-py/data_batch_2",
    ),
    "cifar-pickle-of-another-structure": Damage(
        "cifar10",
        changed(CIFAR, lambda d: retar(d, batches_meta=pickle.dumps([1, 2, 3]))),
        CIFAR,
        "not a readable CIFAR meta pickle (no key b'label_names')",
        member="cifar-10-batches-py/batches.meta",
    ),
    "cifar10c-truncated-tar": Damage(
        "cifar10c",
        changed(C10C, half),
        C10C,
        "corrupted or truncated archive (ReadError: unexpected end of data)",
        spec=SNOW,
    ),
    "cifar10c-html-page": Damage("cifar10c", changed(C10C, html), C10C, HTML_HINT, spec=SNOW),
    "cifar10c-missing-member": Damage(
        "cifar10c",
        changed(C10C, lambda d: retar(d, "w", drop="snow.npy")),
        C10C,
        "expected one member 'snow.npy', found 0",
        spec=SNOW,
    ),
    "cifar10c-member-not-an-npy": Damage(
        "cifar10c",
        changed(C10C, lambda d: retar(d, "w", labels_npy=HTML)),
        C10C,
        "not a readable .npy array (no .npy header; it starts with b'<!DOCTYPE",
        member="CIFAR-10-C/labels.npy",
        spec=SNOW,
    ),
    "cifar10c-arrays-of-the-wrong-shape": Damage(
        "cifar10c",
        changed(C10C, lambda d: retar(d, "w", snow_npy=npy(np.zeros((25, 32, 32), np.uint8)))),
        C10C,
        "CIFAR-10-C/snow.npy has shape (25, 32, 32)",
        spec=SNOW,
    ),
    "cifar10c-channel-first-from-a-mirror": Damage(
        "cifar10c",
        changed(
            C10C,
            lambda d: retar(
                d,
                "w",
                snow_npy=npy(
                    np.ascontiguousarray(
                        np.load(io.BytesIO(tar_members(d)["CIFAR-10-C/snow.npy"])).transpose(
                            0, 3, 1, 2
                        )
                    )
                ),
            ),
        ),
        C10C,
        "CIFAR-10-C/snow.npy has shape (25, 3, 32, 32), channel-first",
        fetched=True,
        layout=True,
        spec=SNOW,
    ),
    "domainnet-truncated-zip": Damage(
        "domainnet",
        changed("clipart.zip", half),
        "clipart.zip",
        "BadZipFile",
        fetched=True,
        spec=CLIPART,
    ),
    "domainnet-html-page": Damage(
        "domainnet", changed("clipart.zip", html), "clipart.zip", HTML_HINT, spec=CLIPART
    ),
    "domainnet-corrupted-member": Damage(
        "domainnet",
        changed(
            "clipart.zip", lambda d: flip_member_byte(d, "clipart/cls_a/clipart_002_000001.jpg")
        ),
        "clipart.zip",
        "Bad CRC-32",
        member="clipart/cls_a/clipart_002_000001.jpg",
        spec=CLIPART,
    ),
    "domainnet-undecodable-image": Damage(
        "domainnet",
        changed("clipart.zip", lambda d: rezip(d, **{"clipart_001_000000.jpg": TRUNCATED_JPEG})),
        "clipart.zip",
        "not a decodable image (Image is incomplete or truncated)",
        member="clipart/cls_b/clipart_001_000000.jpg",
        spec=CLIPART,
    ),
    "domainnet-repacked-zip-from-a-mirror": Damage(
        "domainnet",
        changed("clipart.zip", lambda d: rezip(d, prefix="clipart/")),
        "clipart.zip",
        "no images under 'clipart/<class>/' (its top-level entries: ['cls_a', 'cls_b', 'cls_c'])",
        fetched=True,
        layout=True,
        spec=CLIPART,
    ),
    "domainnet-html-page-as-split-list": Damage(
        "domainnet",
        changed("clipart_train.txt", html),
        "clipart_train.txt",
        "login page?) (line 1: expected '<path> <label>', got '<!DOCTYPE html>')",
        fetched=True,
        spec=OFFICIAL,
    ),
    "domainnet-list-names-a-missing-image": Damage(
        "domainnet",
        changed("clipart_test.txt", lambda d: d + f"{CLIPART_MISSING} 0\n".encode()),
        "clipart_test.txt",
        f"names image '{CLIPART_MISSING}', which clipart.zip does not hold",
        spec=OFFICIAL,
    ),
    "flowers-html-page-as-setid": Damage(
        "flowers102",
        changed("setid.mat", html),
        "setid.mat",
        f"not a readable MATLAB .mat file: {HTML_HINT}",
    ),
    "flowers-truncated-mat-downloaded": Damage(
        "flowers102",
        changed("imagelabels.mat", half),
        "imagelabels.mat",
        "not a readable MATLAB .mat file",
        fetched=True,
    ),
    "flowers-mat-without-the-variable": Damage(
        "flowers102", changed("setid.mat", mat_without_valid), "setid.mat", "no variable 'valid'"
    ),
    "flowers-truncated-tgz": Damage(
        "flowers102",
        changed("102flowers.tgz", half),
        "102flowers.tgz",
        "corrupted or truncated archive",
        fetched=True,
    ),
    "flowers-missing-image": Damage(
        "flowers102",
        changed("102flowers.tgz", lambda d: retar(d, drop="00007.jpg")),
        "102flowers.tgz",
        "1 image(s) missing, e.g. ['image_00007.jpg']",
    ),
    "flowers-undecodable-image": Damage(
        "flowers102",
        changed("102flowers.tgz", lambda d: retar(d, image_00004_jpg=TRUNCATED_JPEG)),
        "102flowers.tgz",
        "not a decodable image",
        member="jpg/image_00004.jpg",
    ),
    "pet-truncated-images": Damage(
        "pet", changed("images.tar.gz", half), "images.tar.gz", "corrupted or truncated archive"
    ),
    "pet-html-page-as-annotations": Damage(
        "pet", changed("annotations.tar.gz", html), "annotations.tar.gz", HTML_HINT, fetched=True
    ),
    "pet-missing-list": Damage(
        "pet",
        changed("annotations.tar.gz", lambda d: retar(d, drop="test.txt")),
        "annotations.tar.gz",
        "expected one member 'annotations/test.txt', found 0",
    ),
    "pet-list-with-a-bad-line": Damage(
        "pet",
        changed("annotations.tar.gz", lambda d: retar(d, trainval_txt=b"Abyssinian_1 one 1 1\n")),
        "annotations.tar.gz",
        "line 1: expected '<image id> <class id> ...'",
        member="annotations/trainval.txt",
    ),
    # The fuzz run's case: an odd line in a list; images.tar.gz is whole.
    "pet-list-names-a-missing-image": Damage(
        "pet",
        changed(
            "annotations.tar.gz",
            lambda d: retar(
                d,
                trainval_txt=tar_members(d)["annotations/trainval.txt"] + b"Abyssinian_999 1 1 1\n",
            ),
        ),
        "annotations.tar.gz",
        "names image 'Abyssinian_999', which images.tar.gz does not hold",
        member="annotations/trainval.txt",
    ),
    # An image missing from a mirror's images.tar.gz: both files pass their checksums, so
    # the list line naming it is blamed, and fetching again is not the remedy.
    "pet-image-missing-from-a-mirror": Damage(
        "pet",
        changed("images.tar.gz", lambda d: retar(d, drop="great_pyrenees_5.jpg")),
        "annotations.tar.gz",
        "names image 'great_pyrenees_5', which images.tar.gz does not hold",
        member="annotations/test.txt",
        fetched=True,
        layout=True,
    ),
    "pet-image-in-a-format-training-cannot-decode": Damage(
        "pet",
        changed("images.tar.gz", lambda d: retar(d, american_bulldog_2_jpg=encoded("BMP"))),
        "images.tar.gz",
        "not a decodable image (Unsupported image file",
        member="images/american_bulldog_2.jpg",
    ),
}


@pytest.fixture(scope="module")
def intact() -> dict[str, dict[str, bytes]]:
    """Each source's files, built in their real formats."""
    return {
        "cifar10": cifar_archive("cifar10", n_per_batch=2).blobs,
        "cifar10c": cifar10c_archive(n_per_severity=5).blobs,
        "domainnet": domainnet_archive("clipart", per_class=(3, 2, 2)).blobs,
        "flowers102": flowers_archive(n_images=12).blobs,
        "pet": pet_archive().blobs,
    }


@pytest.fixture(scope="module")
def flowers(intact) -> dict[str, bytes]:
    return intact["flowers102"]


def same_bytes_remedy(path: Path) -> str:
    return (
        f"downloading it again brings the same bytes (they passed their checksum): get the "
        f"official {path.name} (or repack it in the official layout), then delete {path} and "
        "rerun"
    )


@pytest.mark.parametrize("case", DAMAGES.values(), ids=DAMAGES.keys())
def test_prepare_names_the_damaged_file(case, intact, tmp_path, caplog):
    spec: dict[str, Any] = {"source": case.source, **case.spec}
    needed = source_files(case.source, spec)  # DomainNet's lists only for split: official
    blobs = {n: d for n, d in case.damage(intact[case.source]).items() if n in needed}
    spec["checksums"] = {name: f"md5:{md5_of(data)}" for name, data in blobs.items()}
    downloads = tmp_path / "downloads"
    with running_server() as server:
        if case.fetched:
            for name, data in blobs.items():
                server.add(f"mirror/{name}", data)
            spec["url"] = server.url("mirror/")
            path = downloads / case.culprit
            remedy = same_bytes_remedy(path) if case.layout else download_remedy(path)
        else:
            folder = tmp_path / "mine"
            folder.mkdir()
            for name, data in blobs.items():
                (folder / name).write_bytes(data)
            spec["archive"] = str(folder)
            path, remedy = folder / case.culprit, local_remedy("datasets.mine.archive")
        store = tmp_path / "store"
        argv = ["prepare", "--dataset", "mine", "--spec", json.dumps(spec)]
        argv += ["--out", str(store / "mine"), "--downloads", str(downloads)]
        caplog.clear()
        status = cli.main(argv)  # an exception escaping here is a traceback
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert status == 2 and len(errors) == 1, caplog.text
    assert_message(errors[0].getMessage(), path, remedy, member=case.member, says=case.says)
    assert not store.exists() or list(store.iterdir()) == [], "a failed prepare left files"
    if case.fetched:  # the user is told to delete it; it is not deleted behind their back
        assert path.is_file()
    else:
        assert not downloads.exists(), "a local file must never be downloaded"


# --- ImageFolder --------------------------------------------------------------------------


def image_tree(root: Path, damaged: dict[str, bytes]) -> Path:
    for k, name in enumerate(["cat", "dog"]):
        (root / name).mkdir(parents=True)
        for i in range(4):
            (root / name / f"{i:03d}.jpg").write_bytes(jpeg(10 * k + i))
    for rel, data in damaged.items():
        (root / rel).write_bytes(data)
    return root


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (HTML, "Unsupported image file"),
        (TRUNCATED_JPEG, "Image is incomplete or truncated"),
        (b"", "the image is empty (0 bytes)"),
        (encoded("TIFF"), "Unsupported image file"),
    ],
    ids=["html", "truncated", "empty", "tiff"],
)
def test_image_folder_undecodable_image(data, says, tmp_path):
    root = image_tree(tmp_path / "tree", {"dog/002.jpg": data})
    out = tmp_path / "store" / "pets"
    with pytest.raises(DamagedFileError) as error:
        prepare_dataset("pets", {"source": "image_folder", "root": str(root)}, out)
    assert_message(
        str(error.value),
        root / "dog" / "002.jpg",
        local_remedy("datasets.pets.root"),
        says=f"not a decodable image ({says}",
    )
    assert list((tmp_path / "store").iterdir()) == []  # no output, no temporary folder


# --- checksums ------------------------------------------------------------------------------
#
# One row per file whose bytes are not the ones its checksum names: where the file came from
# decides what the error says (a download is deleted, a local file is never touched).


@dataclass(frozen=True)
class Mismatch:
    """Flowers-102 prepared from ``files`` (the registry) with ``spec``, and what must hold."""

    spec: dict[str, Any]
    files: dict[str, RemoteFile]
    says: tuple[str, ...]  # every one is in the error
    gone: Path | None = None  # a file deleted after it failed its checksum
    kept: tuple[Path, bytes] | None = None  # a file left as it was, with its bytes


def html_page_downloaded(flowers: dict[str, bytes], server: Any, tmp_path: Path) -> Mismatch:
    # A server answering with an error page: the checksum catches it before any parsing.
    files = registry_override(server, Built(flowers, {}))
    server.files["/files/setid.mat"] = HTML
    return Mismatch(
        {"source": "flowers102"},
        files,
        (
            files["setid.mat"].url,
            "the server sent an HTML page",
            "the downloaded file was deleted: rerun to download it again",
        ),
        gone=tmp_path / "dl" / "setid.mat",
    )


def local_file_of_other_bytes(flowers: dict[str, bytes], server: Any, tmp_path: Path) -> Mismatch:
    # Both remedies: replace the file, or give its digest; the URL is never reached.
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, data in flowers.items():
        (folder / name).write_bytes(HTML if name == "setid.mat" else data)
    files = {n: RemoteFile(n, "http://127.0.0.1:9/never", md5_of(d)) for n, d in flowers.items()}
    return Mismatch(
        {"source": "flowers102", "archive": str(folder)},
        files,
        (
            f"datasets.f.archive: checksum mismatch for {folder / 'setid.mat'}",
            local_remedy("datasets.f.archive"),
            "give their digest under datasets.f.checksums",
        ),
        kept=(folder / "setid.mat", HTML),
    )


MISMATCHES = [html_page_downloaded, local_file_of_other_bytes]


@pytest.mark.parametrize("build", MISMATCHES, ids=[build.__name__ for build in MISMATCHES])
def test_checksum_mismatch_says_where_the_file_came_from(build, flowers, tmp_path):
    with running_server() as server:
        case = build(flowers, server, tmp_path)
        with pytest.raises(ChecksumError) as error:
            SOURCES["flowers102"].prepare(
                "f", case.spec, tmp_path / "out", tmp_path / "dl", files=case.files
            )
    message = str(error.value)
    for words in case.says:
        assert words in message, message
    assert not (tmp_path / "out").exists()
    if case.gone is not None:
        assert not case.gone.exists()
    if case.kept is not None:  # the user's file is never touched
        path, data = case.kept
        assert path.read_bytes() == data


# --- the prepare command in its own process -------------------------------------------------
#
# One row per damaged local file: ``vitplasticity prepare`` run as the workflow runs it prints
# one ERROR line (no traceback) and exits 2, and writes nothing.


@dataclass(frozen=True)
class Local:
    """A prepare spec of the user's damaged files, and the one error line's file and words."""

    spec: dict[str, Any]
    key: str  # the config key of the files: datasets.mine.<key>
    culprit: Path
    says: str


def html_page_in_an_image_folder(flowers: dict[str, bytes], tmp_path: Path) -> Local:
    root = image_tree(tmp_path / "tree", {"cat/001.jpg": HTML})
    spec = {"source": "image_folder", "root": str(root)}
    return Local(spec, "root", root / "cat" / "001.jpg", "not a decodable image (Unsupported")


def html_page_saved_as_setid(flowers: dict[str, bytes], tmp_path: Path) -> Local:
    # The case: an HTML page saved as the local setid.mat, accepted by its checksum
    # override.
    folder = tmp_path / "mine"
    folder.mkdir()
    blobs = {**flowers, "setid.mat": HTML}
    for name, data in blobs.items():
        (folder / name).write_bytes(data)
    spec = {
        "source": "flowers102",
        "archive": str(folder),
        "checksums": {name: f"md5:{md5_of(data)}" for name, data in blobs.items()},
    }
    return Local(
        spec, "archive", folder / "setid.mat", f"not a readable MATLAB .mat file: {HTML_HINT}"
    )


LOCALS = [html_page_in_an_image_folder, html_page_saved_as_setid]


@pytest.mark.parametrize("build", LOCALS, ids=[build.__name__ for build in LOCALS])
def test_cli_prepare_prints_one_line_and_exits_2(build, flowers, tmp_path):
    case = build(flowers, tmp_path)
    store, downloads = tmp_path / "store", tmp_path / "downloads"
    command = ["prepare", "--dataset", "mine", "--spec", json.dumps(case.spec)]
    command += ["--out", str(store / "mine"), "--downloads", str(downloads)]
    run = subprocess.run(
        [sys.executable, "-m", "vitplasticity.cli", *command],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, run.stderr
    assert f"{case.culprit}: {case.says}" in errors[0]
    assert errors[0].endswith(local_remedy(f"datasets.mine.{case.key}"))
    assert not store.exists() or list(store.iterdir()) == []
    assert not downloads.exists(), "a local file must never be downloaded"


def test_cli_prepare_killed_by_sigterm_leaves_nothing(tmp_path):
    # SLURM's scancel and a killed Snakemake send SIGTERM: the prepared-store writer's
    # temporary folder must go too, not only on exceptions.
    root = image_tree(tmp_path / "tree", {})
    for image in list(root.glob("*/*.jpg")):  # 400 images: the writer is open for a second
        for copy in range(49):
            (image.parent / f"{image.stem}_{copy}.jpg").write_bytes(image.read_bytes())
    store = tmp_path / "store"
    spec = json.dumps({"source": "image_folder", "root": str(root)})
    command = ["prepare", "--dataset", "pets", "--spec", spec, "--out", str(store / "pets")]
    process = subprocess.Popen(
        [sys.executable, "-m", "vitplasticity.cli", *command], stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    # The writer's temporary folder appears once torch is loaded, before the images are read.
    while not list(store.glob(".pets.*")) and process.poll() is None:
        assert time.monotonic() < deadline, "the writer never started"
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert list(store.iterdir()) == [], "a killed prepare left files behind"
    assert process.returncode == 128 + signal.SIGTERM, stderr
