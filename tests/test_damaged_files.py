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
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.fixtures_data import (
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
from tests.report_inputs import write_grid
from vitplasticity import cli
from vitplasticity.data.archives import DamagedFileError
from vitplasticity.data.download import ChecksumError
from vitplasticity.data.imagenet import imagenet_reference, index_val
from vitplasticity.data.prepare import prepare_dataset
from vitplasticity.data.sources import SOURCES
from vitplasticity.data.sources.registry import RemoteFile

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


# --- running a source on damaged files ----------------------------------------------------


def prepare_local(source: str, tmp_path: Path, blobs: dict[str, bytes], **spec) -> str:
    """Prepare ``source`` from local files (config ``archive:`` = a folder holding them, their
    checksums accepted); return the error message and check that nothing was written."""
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, data in blobs.items():
        (folder / name).write_bytes(data)
    files = {n: RemoteFile(n, "http://127.0.0.1:9/never", md5_of(d)) for n, d in blobs.items()}
    store = tmp_path / "store"
    with pytest.raises(DamagedFileError) as error:
        SOURCES[source].prepare(
            "mine",
            {"source": source, "archive": str(folder), **spec},
            store / "mine",
            tmp_path / "downloads",
            files=files,
        )
    assert not store.exists() or not any(store.iterdir()), "a failed prepare left files behind"
    assert not (tmp_path / "downloads").exists(), "a local file must never be downloaded"
    return str(error.value)


def prepare_downloaded(source: str, tmp_path: Path, blobs: dict[str, bytes], **spec) -> str:
    """Prepare ``source`` from files served over HTTP (their checksums accepted); return the
    error message and check that nothing was written and the download was kept."""
    store = tmp_path / "store"
    with running_server() as server, pytest.raises(DamagedFileError) as error:
        SOURCES[source].prepare(
            "fetched",
            {"source": source, **spec},
            store / "fetched",
            tmp_path / "downloads",
            files=registry_override(server, Built(blobs, {})),
        )
    assert not store.exists() or not any(store.iterdir()), "a failed prepare left files behind"
    return str(error.value)


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


# --- CIFAR --------------------------------------------------------------------------------

CIFAR = "cifar-10-python.tar.gz"


@pytest.fixture(scope="module")
def cifar() -> bytes:
    return cifar_archive("cifar10", n_per_batch=2).blobs[CIFAR]


def test_cifar_truncated_archive_local(cifar, tmp_path):
    message = prepare_local("cifar10", tmp_path, {CIFAR: half(cifar)})
    path = tmp_path / "mine" / CIFAR
    assert_message(
        message, path, local_remedy("datasets.mine.archive"), says="corrupted or truncated"
    )


def test_cifar_truncated_archive_downloaded(cifar, tmp_path):
    message = prepare_downloaded("cifar10", tmp_path, {CIFAR: half(cifar)})
    path = tmp_path / "downloads" / CIFAR
    assert_message(message, path, download_remedy(path), says="corrupted or truncated")
    assert path.is_file()  # the user is told to delete it; it is not deleted behind their back


def test_cifar_html_page_instead_of_archive(tmp_path):
    message = prepare_local("cifar10", tmp_path, {CIFAR: HTML})
    assert_message(
        message, tmp_path / "mine" / CIFAR, local_remedy("datasets.mine.archive"), says=HTML_HINT
    )


def test_cifar_missing_member(cifar, tmp_path):
    message = prepare_downloaded("cifar10", tmp_path, {CIFAR: retar(cifar, drop="test_batch")})
    path = tmp_path / "downloads" / CIFAR
    assert_message(message, path, download_remedy(path), says="expected one member 'test_batch'")


def test_cifar_truncated_pickle(cifar, tmp_path):
    batch = tar_members(cifar)["cifar-10-batches-py/data_batch_2"]
    damaged = retar(cifar, data_batch_2=half(batch))
    message = prepare_local("cifar10", tmp_path, {CIFAR: damaged})
    assert_message(
        message,
        tmp_path / "mine" / CIFAR,
        local_remedy("datasets.mine.archive"),
        member="cifar-10-batches-py/data_batch_2",
        says="not a readable CIFAR batch pickle (UnpicklingError: pickle data was truncated)",
    )


def test_cifar_pickle_of_the_wrong_structure(cifar, tmp_path):
    import pickle

    damaged = retar(cifar, batches_meta=pickle.dumps([1, 2, 3]))
    message = prepare_local("cifar10", tmp_path, {CIFAR: damaged})
    assert_message(
        message,
        tmp_path / "mine" / CIFAR,
        local_remedy("datasets.mine.archive"),
        member="cifar-10-batches-py/batches.meta",
        says="not a readable CIFAR meta pickle (no key b'label_names')",
    )


# --- CIFAR-10-C ---------------------------------------------------------------------------

C10C = "CIFAR-10-C.tar"


@pytest.fixture(scope="module")
def cifar10c() -> bytes:
    return cifar10c_archive(n_per_severity=5).blobs[C10C]


def prepare_c10c(tmp_path: Path, data: bytes) -> str:
    return prepare_local("cifar10c", tmp_path, {C10C: data}, corruption="snow", severity=2)


def test_cifar10c_truncated_tar(cifar10c, tmp_path):
    assert_message(
        prepare_c10c(tmp_path, half(cifar10c)),
        tmp_path / "mine" / C10C,
        local_remedy("datasets.mine.archive"),
        says="corrupted or truncated archive (ReadError: unexpected end of data)",
    )


def test_cifar10c_html_page(tmp_path):
    assert_message(
        prepare_c10c(tmp_path, HTML),
        tmp_path / "mine" / C10C,
        local_remedy("datasets.mine.archive"),
        says=HTML_HINT,
    )


def test_cifar10c_missing_member(cifar10c, tmp_path):
    assert_message(
        prepare_c10c(tmp_path, retar(cifar10c, "w", drop="snow.npy")),
        tmp_path / "mine" / C10C,
        local_remedy("datasets.mine.archive"),
        says="expected one member 'snow.npy', found 0",
    )


def test_cifar10c_member_not_an_npy(cifar10c, tmp_path):
    assert_message(
        prepare_c10c(tmp_path, retar(cifar10c, "w", labels_npy=HTML)),
        tmp_path / "mine" / C10C,
        local_remedy("datasets.mine.archive"),
        member="CIFAR-10-C/labels.npy",
        says="not a readable .npy array (no .npy header; it starts with b'<!DOCTYPE",
    )


def test_cifar10c_arrays_of_the_wrong_shape(cifar10c, tmp_path):
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((25, 32, 32), dtype=np.uint8))
    assert_message(
        prepare_c10c(tmp_path, retar(cifar10c, "w", snow_npy=buffer.getvalue())),
        tmp_path / "mine" / C10C,
        local_remedy("datasets.mine.archive"),
        says="CIFAR-10-C/snow.npy has shape (25, 32, 32)",
    )


# --- DomainNet ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def domainnet() -> dict[str, bytes]:
    return domainnet_archive("clipart", per_class=(3, 2, 2)).blobs


def rezip(data: bytes, **replace: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(buffer, "w") as target:
        for name in source.namelist():
            target.writestr(name, replace.get(name.rsplit("/", 1)[-1], source.read(name)))
    return buffer.getvalue()


def test_domainnet_truncated_zip(domainnet, tmp_path):
    message = prepare_downloaded(
        "domainnet", tmp_path, {"clipart.zip": half(domainnet["clipart.zip"])}, domain="clipart"
    )
    path = tmp_path / "downloads" / "clipart.zip"
    assert_message(message, path, download_remedy(path), says="BadZipFile")


def test_domainnet_html_page(tmp_path):
    message = prepare_local("domainnet", tmp_path, {"clipart.zip": HTML}, domain="clipart")
    assert_message(
        message,
        tmp_path / "mine" / "clipart.zip",
        local_remedy("datasets.mine.archive"),
        says=HTML_HINT,
    )


def test_domainnet_corrupted_member(domainnet, tmp_path):
    data = bytearray(domainnet["clipart.zip"])
    member = "clipart/cls_a/clipart_002_000001.jpg"
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as archive:
        info = archive.getinfo(member)
    # The member's bytes start after its 30-byte local header, name and extra field.
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + 20] ^= 0xFF
    message = prepare_local("domainnet", tmp_path, {"clipart.zip": bytes(data)}, domain="clipart")
    assert_message(
        message,
        tmp_path / "mine" / "clipart.zip",
        local_remedy("datasets.mine.archive"),
        member=member,
        says="Bad CRC-32",
    )


def test_domainnet_undecodable_image(domainnet, tmp_path):
    damaged = rezip(domainnet["clipart.zip"], **{"clipart_001_000000.jpg": TRUNCATED_JPEG})
    message = prepare_local("domainnet", tmp_path, {"clipart.zip": damaged}, domain="clipart")
    assert_message(
        message,
        tmp_path / "mine" / "clipart.zip",
        local_remedy("datasets.mine.archive"),
        member="clipart/cls_b/clipart_001_000000.jpg",
        says="not a decodable image (Image is incomplete or truncated)",
    )


def test_domainnet_html_page_as_split_list(domainnet, tmp_path):
    blobs = {**domainnet, "clipart_train.txt": HTML}
    message = prepare_downloaded("domainnet", tmp_path, blobs, domain="clipart", split="official")
    path = tmp_path / "downloads" / "clipart_train.txt"
    assert_message(message, path, download_remedy(path), says=HTML_HINT)
    assert "line 1: expected '<path> <label>'" in message


def test_domainnet_listed_image_missing(domainnet, tmp_path):
    listing = domainnet["clipart_test.txt"] + b"clipart/cls_a/clipart_009_000009.jpg 0\n"
    blobs = {**domainnet, "clipart_test.txt": listing}
    message = prepare_local("domainnet", tmp_path, blobs, domain="clipart", split="official")
    assert_message(
        message,
        tmp_path / "mine" / "clipart.zip",
        local_remedy("datasets.mine.archive"),
        says="1 image(s) of the official test list missing",
    )


# --- Flowers-102 --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flowers() -> dict[str, bytes]:
    return flowers_archive(n_images=12).blobs


def test_flowers_html_page_as_setid(flowers, tmp_path):
    message = prepare_local("flowers102", tmp_path, {**flowers, "setid.mat": HTML})
    assert_message(
        message,
        tmp_path / "mine" / "setid.mat",
        local_remedy("datasets.mine.archive"),
        says=f"not a readable MATLAB .mat file: {HTML_HINT}",
    )


def test_flowers_truncated_mat_downloaded(flowers, tmp_path):
    blobs = {**flowers, "imagelabels.mat": half(flowers["imagelabels.mat"])}
    message = prepare_downloaded("flowers102", tmp_path, blobs)
    path = tmp_path / "downloads" / "imagelabels.mat"
    assert_message(message, path, download_remedy(path), says="not a readable MATLAB .mat file")


def test_flowers_mat_without_the_variable(flowers, tmp_path):
    from scipy.io import savemat

    buffer = io.BytesIO()
    savemat(buffer, {"trnid": np.arange(1, 4)})
    message = prepare_local("flowers102", tmp_path, {**flowers, "setid.mat": buffer.getvalue()})
    assert_message(
        message,
        tmp_path / "mine" / "setid.mat",
        local_remedy("datasets.mine.archive"),
        says="no variable 'valid'",
    )


def test_flowers_truncated_tgz(flowers, tmp_path):
    blobs = {**flowers, "102flowers.tgz": half(flowers["102flowers.tgz"])}
    message = prepare_downloaded("flowers102", tmp_path, blobs)
    path = tmp_path / "downloads" / "102flowers.tgz"
    assert_message(message, path, download_remedy(path), says="corrupted or truncated archive")


def test_flowers_missing_image(flowers, tmp_path):
    blobs = {**flowers, "102flowers.tgz": retar(flowers["102flowers.tgz"], drop="00007.jpg")}
    message = prepare_local("flowers102", tmp_path, blobs)
    assert_message(
        message,
        tmp_path / "mine" / "102flowers.tgz",
        local_remedy("datasets.mine.archive"),
        says="1 image(s) missing, e.g. ['image_00007.jpg']",
    )


def test_flowers_undecodable_image(flowers, tmp_path):
    damaged = retar(flowers["102flowers.tgz"], image_00004_jpg=TRUNCATED_JPEG)
    message = prepare_local("flowers102", tmp_path, {**flowers, "102flowers.tgz": damaged})
    assert_message(
        message,
        tmp_path / "mine" / "102flowers.tgz",
        local_remedy("datasets.mine.archive"),
        member="jpg/image_00004.jpg",
        says="not a decodable image",
    )


# --- Oxford-IIIT Pet ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pet() -> dict[str, bytes]:
    return pet_archive().blobs


def test_pet_truncated_images(pet, tmp_path):
    blobs = {**pet, "images.tar.gz": half(pet["images.tar.gz"])}
    message = prepare_local("pet", tmp_path, blobs)
    assert_message(
        message,
        tmp_path / "mine" / "images.tar.gz",
        local_remedy("datasets.mine.archive"),
        says="corrupted or truncated archive",
    )


def test_pet_html_page_as_annotations(pet, tmp_path):
    message = prepare_downloaded("pet", tmp_path, {**pet, "annotations.tar.gz": HTML})
    path = tmp_path / "downloads" / "annotations.tar.gz"
    assert_message(message, path, download_remedy(path), says=HTML_HINT)


def test_pet_missing_list(pet, tmp_path):
    blobs = {**pet, "annotations.tar.gz": retar(pet["annotations.tar.gz"], drop="test.txt")}
    message = prepare_local("pet", tmp_path, blobs)
    assert_message(
        message,
        tmp_path / "mine" / "annotations.tar.gz",
        local_remedy("datasets.mine.archive"),
        says="expected one member 'annotations/test.txt', found 0",
    )


def test_pet_list_with_a_bad_line(pet, tmp_path):
    damaged = retar(pet["annotations.tar.gz"], trainval_txt=b"Abyssinian_1 one 1 1\n")
    message = prepare_local("pet", tmp_path, {**pet, "annotations.tar.gz": damaged})
    assert_message(
        message,
        tmp_path / "mine" / "annotations.tar.gz",
        local_remedy("datasets.mine.archive"),
        member="annotations/trainval.txt",
        says="line 1: expected '<image id> <class id> ...'",
    )


def test_pet_listed_image_missing(pet, tmp_path):
    # images.tar.gz lacks a listed image; both files pass their (mirror's) checksums, so
    # the list line naming it is blamed, and fetching again is not the remedy.
    damaged = retar(pet["images.tar.gz"], drop="great_pyrenees_5.jpg")
    message = prepare_downloaded("pet", tmp_path, {**pet, "images.tar.gz": damaged})
    path = tmp_path / "downloads" / "annotations.tar.gz"
    assert_message(
        message,
        path,
        same_bytes_remedy(path),
        member="annotations/test.txt",
        says="names image 'great_pyrenees_5', which images.tar.gz does not hold",
    )


def test_pet_image_in_a_format_training_cannot_decode(pet, tmp_path):
    damaged = retar(pet["images.tar.gz"], american_bulldog_2_jpg=encoded("BMP"))
    message = prepare_local("pet", tmp_path, {**pet, "images.tar.gz": damaged})
    assert_message(
        message,
        tmp_path / "mine" / "images.tar.gz",
        local_remedy("datasets.mine.archive"),
        member="images/american_bulldog_2.jpg",
        says="not a decodable image (Unsupported image file",
    )


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


@pytest.fixture(scope="module")
def val():
    return imagenet_val(n_classes=3, per_class=2)


def reference(path: Path, n: int = 6):
    return imagenet_reference(path, n_images=n, expected=None)


def test_imagenet_truncated_hf_tar(val, tmp_path):
    path = write_hf(val, tmp_path)
    path.write_bytes(half(path.read_bytes()))
    with pytest.raises(ValueError) as error:
        reference(path)
    message = str(error.value)
    assert f"{path}: corrupted or truncated archive" in message
    assert IMAGENET_REMEDY in message


def test_imagenet_html_page_as_hf_tar(tmp_path):
    path = tmp_path / "val_images.tar.gz"
    path.write_bytes(HTML)
    with pytest.raises(ValueError) as error:
        index_val(tmp_path)
    assert HTML_HINT in str(error.value) and IMAGENET_REMEDY in str(error.value)


def test_imagenet_truncated_official_tar(val, tmp_path):
    path = write_official(val, tmp_path)
    path.write_bytes(half(path.read_bytes()))
    with pytest.raises(ValueError) as error:
        reference(path)
    assert f"{path}: corrupted or truncated archive" in str(error.value)
    assert IMAGENET_REMEDY in str(error.value)


def test_imagenet_html_page_as_devkit(val, tmp_path):
    path = write_official(val, tmp_path)
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    devkit.write_bytes(HTML)
    with pytest.raises(DamagedFileError) as error:
        reference(path)
    assert_message(str(error.value), devkit, IMAGENET_REMEDY, says=HTML_HINT)


def test_imagenet_devkit_without_ground_truth(val, tmp_path):
    path = write_official(val, tmp_path)
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    devkit.write_bytes(retar(devkit.read_bytes(), drop="ground_truth.txt"))
    with pytest.raises(DamagedFileError) as error:
        reference(path)
    assert_message(
        str(error.value),
        devkit,
        IMAGENET_REMEDY,
        says="expected one member 'data/ILSVRC2012_validation_ground_truth.txt', found 0",
    )


def test_imagenet_devkit_meta_not_a_mat_file(val, tmp_path):
    path = write_official(val, tmp_path)
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    devkit.write_bytes(retar(devkit.read_bytes(), meta_mat=b"MATLAB 5.0" + bytes(40)))
    with pytest.raises(DamagedFileError) as error:
        reference(path)
    assert_message(
        str(error.value),
        devkit,
        IMAGENET_REMEDY,
        member="ILSVRC2012_devkit_t12/data/meta.mat",
        says="not a readable MATLAB .mat file",
    )


def test_imagenet_devkit_ground_truth_too_short(val, tmp_path):
    path = write_official(val, tmp_path)
    devkit = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    members = tar_members(devkit.read_bytes())
    truth = "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt"
    short = b"\n".join(members[truth].split()[:-1])
    devkit.write_bytes(retar(devkit.read_bytes(), ILSVRC2012_validation_ground_truth_txt=short))
    with pytest.raises(DamagedFileError) as error:
        reference(path)
    assert_message(
        str(error.value),
        devkit,
        IMAGENET_REMEDY,
        says=f"its ground truth has 5 labels, none for ILSVRC2012_val_00000006.JPEG of {path}",
    )


def test_imagenet_undecodable_image_in_a_folder(val, tmp_path):
    root = write_val_folder(val, tmp_path)
    name = sorted(val.images)[0]
    bad = root / "val" / val.labels[name] / name
    bad.write_bytes(HTML)
    with pytest.raises(DamagedFileError) as error:
        reference(root)
    assert_message(
        str(error.value), bad, IMAGENET_REMEDY, says="not a decodable image (Unsupported"
    )


def test_imagenet_undecodable_image_in_the_hf_tar(val, tmp_path):
    path = write_hf(val, tmp_path)
    member = next(n for n in tar_members(path.read_bytes()) if "_00000004_" in n)
    key = member.replace(".", "_")
    path.write_bytes(retar(path.read_bytes(), **{key: TRUNCATED_JPEG}))
    with pytest.raises(DamagedFileError) as error:
        reference(path)
    assert_message(
        str(error.value),
        path,
        IMAGENET_REMEDY,
        member=member,
        says="not a decodable image (Image is incomplete or truncated)",
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


def pet_list_names_a_missing_image(inputs: Inputs, tmp_path: Path) -> CliCase:
    # The fuzz run's case: one odd line in trainval.txt; images.tar.gz is whole.
    annotations = inputs.pet["annotations.tar.gz"]
    members = tar_members(annotations)
    trainval = members["annotations/trainval.txt"] + b"Abyssinian_999 1 1 1\n"
    blobs = {**inputs.pet, "annotations.tar.gz": retar(annotations, trainval_txt=trainval)}
    folder = tmp_path / "mine"
    folder.mkdir()
    for name, data in blobs.items():
        (folder / name).write_bytes(data)
    spec = {
        "source": "pet",
        "archive": str(folder),
        "checksums": {name: f"md5:{md5_of(data)}" for name, data in blobs.items()},
    }
    out = tmp_path / "out"
    argv = ["prepare", "--dataset", "pets", "--spec", json.dumps(spec)]
    argv += ["--out", str(out / "pets"), "--downloads", str(tmp_path / "downloads")]
    lines = trainval.decode().splitlines()
    return CliCase(
        argv,
        folder / "annotations.tar.gz",
        f"line {len(lines)} names image 'Abyssinian_999', which images.tar.gz does not hold",
        local_remedy("datasets.pets.archive"),
        out,
        member="annotations/trainval.txt",
    )


def mirror_spec(inputs: Inputs, source: str, filename: str, data: bytes, **spec: Any) -> dict:
    """A dataset entry fetching ``filename`` from a mirror URL with the user's own digest."""
    inputs.server.files[f"/mirror/{filename}"] = data
    return {
        "source": source,
        "url": inputs.server.url(f"/mirror/{filename}"),
        "checksums": {filename: f"md5:{md5_of(data)}"},
        **spec,
    }


def mirror_argv(tmp_path: Path, spec: dict) -> tuple[list[str], Path]:
    out = tmp_path / "out"
    argv = ["prepare", "--dataset", "mirror", "--spec", json.dumps(spec)]
    argv += ["--out", str(out / "mirror"), "--downloads", str(tmp_path / "downloads")]
    return argv, out


def same_bytes_remedy(path: Path) -> str:
    return (
        f"downloading it again brings the same bytes (they passed their checksum): get the "
        f"official {path.name} (or repack it in the official layout), then delete {path} and "
        "rerun"
    )


def domainnet_repacked(inputs: Inputs, tmp_path: Path) -> CliCase:
    blobs = domainnet_archive("clipart", per_class=(2, 2, 2)).blobs
    buffer = io.BytesIO()  # the same images, one folder level up: no clipart/ prefix
    with (
        zipfile.ZipFile(io.BytesIO(blobs["clipart.zip"])) as source,
        zipfile.ZipFile(buffer, "w") as target,
    ):
        for name in source.namelist():
            target.writestr(name.removeprefix("clipart/"), source.read(name))
    spec = mirror_spec(inputs, "domainnet", "clipart.zip", buffer.getvalue(), domain="clipart")
    argv, out = mirror_argv(tmp_path, spec)
    path = tmp_path / "downloads" / "clipart.zip"
    return CliCase(
        argv,
        path,
        "no images under 'clipart/<class>/' (its top-level entries: ['cls_a', 'cls_b', 'cls_c'])",
        same_bytes_remedy(path),
        out,
    )


def cifar10c_channel_first(inputs: Inputs, tmp_path: Path) -> CliCase:
    tar = cifar10c_archive(n_per_severity=5).blobs[C10C]
    images = np.load(io.BytesIO(tar_members(tar)["CIFAR-10-C/snow.npy"]))
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    damaged = retar(tar, "w", snow_npy=buffer.getvalue())
    spec = mirror_spec(inputs, "cifar10c", C10C, damaged, corruption="snow", severity=2)
    argv, out = mirror_argv(tmp_path, spec)
    path = tmp_path / "downloads" / C10C
    return CliCase(
        argv,
        path,
        "CIFAR-10-C/snow.npy has shape (25, 3, 32, 32), channel-first",
        same_bytes_remedy(path),
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
    pet_list_names_a_missing_image,
    domainnet_repacked,
    cifar10c_channel_first,
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
