"""Damaged input files end in one clear error: the file, the member inside an archive, what is
wrong, and the remedy that fits where the file came from (a download is deleted and fetched
again; a local ``archive:``/``root:`` file or the ImageNet copy must be replaced). Every case
builds the real format and then damages it: truncated, an HTML page saved under the expected
name, a missing member, a member of the wrong format, an image the training decoder rejects.
Nothing may be left half-written."""

from __future__ import annotations

import io
import json
import logging
import pickle
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers.fixtures_data import (
    Built,
    cifar10c_archive,
    cifar_archive,
    domainnet_archive,
    flowers_archive,
    imagenet_val,
    jpeg,
    md5_of,
    pet_archive,
    registry_override,
    running_server,
    tar_bytes,
    write_hf,
    write_official,
    write_val_folder,
)
from tests.helpers.report_inputs import write_grid
from vitplasticity import cli
from vitplasticity.data.archives import DamagedFileError
from vitplasticity.data.download import ChecksumError
from vitplasticity.data.imagenet import imagenet_reference
from vitplasticity.data.prepare import prepare_dataset
from vitplasticity.data.sources import SOURCES
from vitplasticity.data.sources.registry import RemoteFile, source_files

HTML = (
    b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>"
    b"<body><h1>Not Found</h1></body></html>\n"
)
HTML_HINT = "it is an HTML page"
IMAGENET_REMEDY = (
    "this is your local file from config paths.imagenet (or VITPLASTICITY_IMAGENET): "
    "replace it; it is never downloaded"
)


def local_remedy(key: str) -> str:
    return f"this is your local file from config {key}: replace it; it is never downloaded"


def download_remedy(path: Path) -> str:
    return f"delete {path} and rerun: it will be downloaded again"


# --- building damaged files ---------------------------------------------------------------


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def tar_members(data: bytes) -> dict[str, bytes]:
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


def encoded(fmt: str, size: int = 12) -> bytes:
    buffer = io.BytesIO()
    rgb = np.random.default_rng(7).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(buffer, fmt)
    return buffer.getvalue()


TRUNCATED_JPEG = half(jpeg(3, size=32))


def rezip(data: bytes, prefix: str = "", **replace: bytes) -> bytes:
    """The zip ``data`` again, ``prefix`` cut from its member names (a re-packed copy), with
    some members replaced (keyword: the member's last path part)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(buffer, "w") as target:
        for name in source.namelist():
            content = replace.get(name.rsplit("/", 1)[-1], source.read(name))
            target.writestr(name.removeprefix(prefix), content)
    return buffer.getvalue()


# --- the one error line ---------------------------------------------------------------------


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


def html(_: bytes) -> bytes:
    return HTML


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


@pytest.fixture(scope="module")
def pet(intact) -> dict[str, bytes]:
    return intact["pet"]


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


def test_cli_prepare_prints_one_line_and_exits_2(tmp_path):
    root = image_tree(tmp_path / "tree", {"cat/001.jpg": HTML})
    out = tmp_path / "store" / "pets"
    spec = json.dumps({"source": "image_folder", "root": str(root)})
    command = ["prepare", "--dataset", "pets", "--spec", spec, "--out", str(out)]
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
    assert str(root / "cat" / "001.jpg") in errors[0]
    assert errors[0].endswith(local_remedy("datasets.pets.root"))
    assert not out.exists() and list(out.parent.iterdir()) == []


# --- ImageNet val -------------------------------------------------------------------------
#
# One row per damaged file of the user's ImageNet val copy: how it is damaged (the builder
# writes a val set in one layout and damages it; it returns the path to read, the file and
# member the error names, and what it says). These read the set in-process: the CLI refuses
# a val set of other than 50,000 images by its count before it decodes any image.

DEVKIT = "ILSVRC2012_devkit_t12.tar.gz"
GROUND_TRUTH = "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt"


@dataclass(frozen=True)
class Read:
    """What reading a damaged val set must report."""

    path: Path  # what the reference set is read from
    culprit: Path
    says: str
    member: str | None = None


def truncated_hf_tar(val, tmp_path: Path) -> Read:
    path = write_hf(val, tmp_path)
    path.write_bytes(half(path.read_bytes()))
    return Read(path, path, "corrupted or truncated archive")


def html_page_as_hf_tar(val, tmp_path: Path) -> Read:
    path = tmp_path / "val_images.tar.gz"
    path.write_bytes(HTML)
    return Read(tmp_path, path, HTML_HINT)


def truncated_official_tar(val, tmp_path: Path) -> Read:
    path = write_official(val, tmp_path)
    path.write_bytes(half(path.read_bytes()))
    return Read(path, path, "corrupted or truncated archive")


def damaged_devkit(val, tmp_path: Path, damage: Callable[[bytes], bytes]) -> tuple[Path, Path]:
    path = write_official(val, tmp_path)
    devkit = tmp_path / DEVKIT
    devkit.write_bytes(damage(devkit.read_bytes()))
    return path, devkit


def html_page_as_devkit(val, tmp_path: Path) -> Read:
    return Read(*damaged_devkit(val, tmp_path, html), HTML_HINT)


def devkit_without_ground_truth(val, tmp_path: Path) -> Read:
    path, devkit = damaged_devkit(val, tmp_path, lambda d: retar(d, drop="ground_truth.txt"))
    return Read(
        path,
        devkit,
        "expected one member 'data/ILSVRC2012_validation_ground_truth.txt', found 0",
    )


def devkit_meta_not_a_mat_file(val, tmp_path: Path) -> Read:
    path, devkit = damaged_devkit(
        val, tmp_path, lambda d: retar(d, meta_mat=b"MATLAB 5.0" + bytes(40))
    )
    member = "ILSVRC2012_devkit_t12/data/meta.mat"
    return Read(path, devkit, "not a readable MATLAB .mat file", member)


def devkit_ground_truth_too_short(val, tmp_path: Path) -> Read:
    def shorten(data: bytes) -> bytes:
        short = b"\n".join(tar_members(data)[GROUND_TRUTH].split()[:-1])
        return retar(data, ILSVRC2012_validation_ground_truth_txt=short)

    path, devkit = damaged_devkit(val, tmp_path, shorten)
    says = f"its ground truth has 5 labels, none for ILSVRC2012_val_00000006.JPEG of {path}"
    return Read(path, devkit, says)


def undecodable_image_in_a_folder(val, tmp_path: Path) -> Read:
    root = write_val_folder(val, tmp_path)
    name = sorted(val.images)[0]
    bad = root / "val" / val.labels[name] / name
    bad.write_bytes(HTML)
    return Read(root, bad, "not a decodable image (Unsupported")


def undecodable_image_in_the_hf_tar(val, tmp_path: Path) -> Read:
    path = write_hf(val, tmp_path)
    member = next(n for n in tar_members(path.read_bytes()) if "_00000004_" in n)
    path.write_bytes(retar(path.read_bytes(), **{member.replace(".", "_"): TRUNCATED_JPEG}))
    return Read(path, path, "not a decodable image (Image is incomplete or truncated)", member)


IMAGENET_DAMAGES = [
    truncated_hf_tar,
    html_page_as_hf_tar,
    truncated_official_tar,
    html_page_as_devkit,
    devkit_without_ground_truth,
    devkit_meta_not_a_mat_file,
    devkit_ground_truth_too_short,
    undecodable_image_in_a_folder,
    undecodable_image_in_the_hf_tar,
]


@pytest.fixture(scope="module")
def val():
    return imagenet_val(n_classes=3, per_class=2)


@pytest.mark.parametrize("build", IMAGENET_DAMAGES, ids=[b.__name__ for b in IMAGENET_DAMAGES])
def test_imagenet_reference_names_the_damaged_file(build, val, tmp_path):
    case = build(val, tmp_path)
    with pytest.raises(DamagedFileError) as error:
        imagenet_reference(case.path, n_images=6, expected=None)
    assert_message(
        str(error.value), case.culprit, IMAGENET_REMEDY, member=case.member, says=case.says
    )


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


# --- checksums and the CLI on a source ----------------------------------------------------


def test_downloaded_html_page_fails_its_checksum_and_says_so(flowers, tmp_path):
    # A server answering with an error page: the checksum catches it before any parsing.
    with running_server() as server:
        files = registry_override(server, Built(flowers, {}))
        server.files["/files/setid.mat"] = HTML
        with pytest.raises(ChecksumError) as error:
            SOURCES["flowers102"].prepare(
                "f", {"source": "flowers102"}, tmp_path / "out", tmp_path / "dl", files=files
            )
    message = str(error.value)
    assert files["setid.mat"].url in message
    assert "the server sent an HTML page" in message
    assert "the downloaded file was deleted: rerun to download it again" in message
    assert not (tmp_path / "dl" / "setid.mat").exists() and not (tmp_path / "out").exists()


def test_local_file_with_another_checksum_names_both_remedies(flowers, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, data in flowers.items():
        (folder / name).write_bytes(HTML if name == "setid.mat" else data)
    files = {n: RemoteFile(n, "http://127.0.0.1:9/never", md5_of(d)) for n, d in flowers.items()}
    spec = {"source": "flowers102", "archive": str(folder)}
    with pytest.raises(ChecksumError) as error:
        SOURCES["flowers102"].prepare("f", spec, tmp_path / "out", tmp_path / "dl", files=files)
    message = str(error.value)
    assert f"datasets.f.archive: checksum mismatch for {folder / 'setid.mat'}" in message
    assert local_remedy("datasets.f.archive") in message
    assert "give their digest under datasets.f.checksums" in message
    assert (folder / "setid.mat").read_bytes() == HTML  # the user's file is never touched


def test_cli_prepare_html_page_saved_as_setid(flowers, tmp_path):
    # The issue's case: an HTML page saved as the local setid.mat, accepted by its checksum
    # override, ends in one line naming the file and the remedy, through the CLI.
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
    out = tmp_path / "store" / "flowers"
    command = ["prepare", "--dataset", "flowers", "--spec", json.dumps(spec), "--out", str(out)]
    command += ["--downloads", str(tmp_path / "downloads")]
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
    assert f"{folder / 'setid.mat'}: not a readable MATLAB .mat file: {HTML_HINT}" in errors[0]
    assert errors[0].endswith(local_remedy("datasets.flowers.archive"))
    assert not out.exists() and not (tmp_path / "downloads").exists()


# --- every file a stage reads, through the CLI --------------------------------------------
#
# One row per damaged file: how to damage it (the row's builder writes the inputs and damages
# one), which command reads it, and the words its one error line must hold. Each runs
# ``vitplasticity`` in-process: exit status 2, exactly one ERROR line naming the file (and
# member) with the remedy at its end, no exception escaping (no traceback), no output written.


@dataclass(frozen=True)
class CliCase:
    """A command run on one damaged input, and what its error line must say."""

    argv: list[str]
    culprit: Path | str  # the file (or URL, or config key) the error names
    says: str  # what is wrong
    remedy: str  # how the line ends
    outputs: Path  # the folder the command writes into: must stay empty
    member: str | None = None


@dataclass(frozen=True)
class Inputs:
    """What the builders start from: a prepared store, the tiny model, a file server."""

    store: Path
    model_spec: str
    server: Any
    pet: dict[str, bytes]


def store_copy(inputs: Inputs, tmp_path: Path) -> Path:
    copy = tmp_path / "store" / "demo"
    shutil.copytree(inputs.store, copy)
    return copy


def store_remedy(store: Path) -> str:
    return f"delete the folder {store} and rerun: the workflow prepares it again"


def finetune_argv(inputs: Inputs, store: Path, out: Path) -> list[str]:
    return [
        "finetune", "--experiment", "sgd", "--model", "tiny", "--dataset", "demo",
        "--model-spec", inputs.model_spec, "--dataset-dir", str(store),
        "--configuration", "mha", "--lr", "0.05", "--seed", "0", "--out-dir", str(out),
        "--steps", "2", "--val-every", "1", "--batch-size", "8", "--micro-batch-size", "4",
        "--precision", "fp32", "--device", "cpu", "--num-workers", "0",
    ]  # fmt: skip


def corrupt_column(path: Path, column: str) -> None:
    """Flip 8 bytes in the middle of ``column``'s compressed chunk in Parquet file ``path``
    (the snappy stream: pyarrow then reads "Corrupt snappy compressed data")."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns)
                 if meta.column(i).path_in_schema == column)  # fmt: skip
    start = (
        chunk.dictionary_page_offset or chunk.data_page_offset
    ) + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[start : start + 8] = bytes(b ^ 0xFF for b in data[start : start + 8])
    path.write_bytes(bytes(data))


def store_parquet_corrupted(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    corrupt_column(store / "pool.parquet", "label")
    out = tmp_path / "out"
    argv = ["reference", "--source", "dataset", "--dataset-dir", str(store), "--split", "pool"]
    argv += ["--n-images", "8", "--out", str(out / "reference.parquet")]
    return CliCase(
        argv,
        store / "pool.parquet",
        "not a readable Parquet file (OSError: Corrupt snappy compressed data.)",
        store_remedy(store),
        out,
    )


def rewrite_meta(store: Path, **changes: Any) -> None:
    meta = json.loads((store / "meta.json").read_text())
    (store / "meta.json").write_text(json.dumps({**meta, **changes}))


def store_meta_not_json(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    (store / "meta.json").write_text('{"num_classes": 4,')
    out = tmp_path / "out"
    return CliCase(
        finetune_argv(inputs, store, out / "run"),
        store / "meta.json",
        "not valid JSON (Expecting property name enclosed in double quotes: line 1 column 19",
        store_remedy(store),
        out,
    )


def store_meta_fewer_classes_than_labels(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    rewrite_meta(store, num_classes=2, class_names=["a", "b"])
    out = tmp_path / "out"
    return CliCase(
        finetune_argv(inputs, store, out / "run"),
        store / "meta.json",
        "num_classes 2, but pool.parquet has labels from 0 to 3 (a label must lie in 0..1)",
        store_remedy(store),
        out,
    )


def store_meta_num_classes_edited(inputs: Inputs, tmp_path: Path) -> CliCase:
    store = store_copy(inputs, tmp_path)
    rewrite_meta(store, num_classes=10)  # the store's 4 class names stay
    out = tmp_path / "out"
    return CliCase(
        finetune_argv(inputs, store, out / "run"),
        store / "meta.json",
        "num_classes 10 but 4 class_names",
        store_remedy(store),
        out,
    )


def reference_truncated(inputs: Inputs, tmp_path: Path) -> CliCase:
    reference = tmp_path / "reference.parquet"
    shutil.copy(inputs.store / "test.parquet", reference)
    reference.write_bytes(half(reference.read_bytes()))
    out = tmp_path / "out"
    argv = [
        "plasticity", "--model", "tiny", "--model-spec", inputs.model_spec,
        "--reference", str(reference), "--dataset-dir", str(inputs.store), "--n-pairs", "4",
        "--batch-size", "4", "--device", "cpu",
        "--out", str(out / "pairs.parquet"), "--summary", str(out / "summary.parquet"),
    ]  # fmt: skip
    return CliCase(
        argv,
        reference,
        "a truncated Parquet file (its footer is missing)",
        f"delete {reference} and rerun: the workflow builds the reference set again",
        out,
    )


def grid(tmp_path: Path) -> tuple[list[Path], Path, Path]:
    """Run summaries, and the runs and selected tables aggregated from them."""
    summaries = write_grid(tmp_path / "runs", datasets=("a", "b"), lrs=(0.01,), seeds=(0,))
    tables = tmp_path / "tables"
    runs, selected = tables / "runs.parquet", tables / "selected.parquet"
    argv = ["aggregate", "--experiment", "sgd", "--summaries", *map(str, summaries)]
    assert cli.main([*argv, "--runs-out", str(runs), "--selected-out", str(selected)]) == 0
    return summaries, runs, selected


def results_truncated(inputs: Inputs, tmp_path: Path) -> CliCase:
    _, runs, _ = grid(tmp_path)
    runs.write_bytes(runs.read_bytes()[:-100])
    out = tmp_path / "out"
    return CliCase(
        ["concat", "--inputs", str(runs), "--out", str(out / "all.parquet")],
        runs,
        "a truncated Parquet file (its footer is missing)",
        f"give runs tables (aggregate --runs-out); if the workflow wrote {runs}, delete it "
        "and rerun",
        out,
    )


def concat_of_a_text_file(inputs: Inputs, tmp_path: Path) -> CliCase:
    readme = tmp_path / "README.md"
    readme.write_text("# vitplasticity\n" * 20)
    out = tmp_path / "out"
    return CliCase(
        ["concat", "--inputs", str(readme), "--out", str(out / "all.parquet")],
        readme,
        "not a Parquet file (it starts with b'# vitplasticity\\n')",
        f"give runs tables (aggregate --runs-out); if the workflow wrote {readme}, delete it "
        "and rerun",
        out,
    )


def wilcoxon_table_of_a_selected_table(inputs: Inputs, tmp_path: Path) -> CliCase:
    _, _, selected = grid(tmp_path)
    out = tmp_path / "out"
    return CliCase(
        ["table", "--kind", "wilcoxon", "--inputs", str(selected), "--out", str(out / "w.tex")],
        selected,
        "not a comparison table (stats --out) (no column(s) reference, component, alternative",
        "give a comparison table (stats --out)",
        out,
    )


def summary_with_a_string_seed(inputs: Inputs, tmp_path: Path) -> CliCase:
    summaries = write_grid(tmp_path / "runs", datasets=("a", "b"), lrs=(0.01,), seeds=(0,))
    bad = summaries[3]
    bad.write_text(json.dumps({**json.loads(bad.read_text()), "seed": "zero"}))
    out = tmp_path / "out"
    argv = ["aggregate", "--experiment", "sgd", "--summaries", *map(str, summaries)]
    argv += ["--runs-out", str(out / "runs.parquet"), "--selected-out", str(out / "s.parquet")]
    return CliCase(
        argv,
        bad,
        'seed is "zero", not an integer',
        "it is written by the finetune job: delete it and rerun that run",
        out,
    )


def summary_not_json(inputs: Inputs, tmp_path: Path) -> CliCase:
    summaries = write_grid(tmp_path / "runs", datasets=("a",), lrs=(0.01,), seeds=(0,))
    summaries[0].write_bytes(half(summaries[0].read_bytes()))
    out = tmp_path / "out"
    argv = ["aggregate", "--experiment", "sgd", "--summaries", *map(str, summaries)]
    argv += ["--runs-out", str(out / "runs.parquet"), "--selected-out", str(out / "s.parquet")]
    return CliCase(
        argv,
        summaries[0],
        "not valid JSON",
        "it is written by the finetune job: delete it and rerun that run",
        out,
    )


def finetune_out_dir_is_a_file(inputs: Inputs, tmp_path: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    return CliCase(
        finetune_argv(inputs, inputs.store, a_file),
        a_file,
        "a file, not a folder",
        "give a folder (it is created)",
        out,
    )


def config_checksum_wrong(inputs: Inputs, tmp_path: Path) -> CliCase:
    # The user's own digest is the wrong one: the error says it came from their config.
    data = inputs.pet["images.tar.gz"]
    inputs.server.files["/mirror/images.tar.gz"] = data
    out = tmp_path / "out"
    wrong = "md5:" + "0" * 32
    argv = [
        "download",
        "--file",
        "images.tar.gz",
        "--url",
        inputs.server.url("/mirror/images.tar.gz"),
    ]
    argv += ["--checksum", wrong, "--retries", "0", "--out", str(out / "images.tar.gz")]
    return CliCase(
        argv,
        inputs.server.url("/mirror/images.tar.gz"),
        f"checksum mismatch for {inputs.server.url('/mirror/images.tar.gz')}: expected md5 "
        f"{'0' * 32}, got {md5_of(data)}; the expected digest is yours, from --checksum (in "
        "the workflow: a datasets.<name>.checksums.images.tar.gz entry of your config)",
        "if the server's bytes are right, correct that digest; the downloaded file was deleted",
        out,
    )


def local_config_checksum_wrong(inputs: Inputs, tmp_path: Path) -> CliCase:
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, data in inputs.pet.items():
        (folder / name).write_bytes(data)
    checksums = {name: f"md5:{md5_of(data)}" for name, data in inputs.pet.items()}
    checksums["images.tar.gz"] = "md5:" + "0" * 32  # a typo in the user's digest
    spec = {"source": "pet", "archive": str(folder), "checksums": checksums}
    out = tmp_path / "out"
    argv = ["prepare", "--dataset", "pets", "--spec", json.dumps(spec)]
    argv += ["--out", str(out / "pets"), "--downloads", str(tmp_path / "downloads")]
    return CliCase(
        argv,
        "datasets.pets.archive",
        f"checksum mismatch for {folder / 'images.tar.gz'}: expected md5 {'0' * 32} "
        "(images.tar.gz, from your config datasets.pets.checksums.images.tar.gz)",
        "(or, if these bytes are right, correct that digest)",
        out,
    )


CLI_CASES = [
    store_parquet_corrupted,
    store_meta_not_json,
    store_meta_fewer_classes_than_labels,
    store_meta_num_classes_edited,
    reference_truncated,
    results_truncated,
    concat_of_a_text_file,
    wilcoxon_table_of_a_selected_table,
    summary_with_a_string_seed,
    summary_not_json,
    finetune_out_dir_is_a_file,
    config_checksum_wrong,
    local_config_checksum_wrong,
]


@pytest.fixture
def inputs(demo_dataset, tiny_spec, pet):
    spec = {"timm_id": tiny_spec.timm_id, "weights": "random", "kwargs": tiny_spec.kwargs}
    with running_server() as server:
        yield Inputs(demo_dataset, json.dumps(spec), server, pet)


@pytest.mark.parametrize("build", CLI_CASES, ids=[case.__name__ for case in CLI_CASES])
def test_cli_names_the_damaged_file(build, inputs, tmp_path, caplog):
    case = build(inputs, tmp_path)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        status = cli.main(case.argv)  # an exception escaping here is a traceback
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert status == 2 and len(errors) == 1, caplog.text
    message = errors[0].getMessage()
    assert "\n" not in message and errors[0].exc_info is None, message
    where = f"{case.culprit}, member {case.member}:" if case.member else f"{case.culprit}:"
    assert message.startswith(where) or f" {where}" in message, message
    assert case.says in message, message
    assert message.endswith(case.remedy), message
    leftovers = list(case.outputs.rglob("*")) if case.outputs.exists() else []
    assert leftovers == [], f"half-written outputs: {leftovers}"
