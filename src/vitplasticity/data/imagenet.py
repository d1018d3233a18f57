"""The ImageNet-1k val images of the plasticity reference set, from any of three layouts.

Accepted (``paths.imagenet``, or the environment variable ``VITPLASTICITY_IMAGENET``):

- a folder ``val/<wnid>/*.JPEG`` (the folder holding ``val/``, or ``val/`` itself);
- the official ``ILSVRC2012_img_val.tar`` (flat ``ILSVRC2012_val_<8 digits>.JPEG``) with
  ``ILSVRC2012_devkit_t12.tar.gz`` beside it (its ground truth gives each image's wnid);
- the HF-hosted ``val_images.tar.gz`` (``ILSVRC2012_val_<8 digits>_<wnid>.JPEG``).

A folder holding one of the archives works too. Every layout is reduced to the same index
``(wnid, ILSVRC2012_val_<n>.JPEG)``, so the selection and the manifest (``file`` =
``<wnid>/<file name>``) do not depend on the layout. The paper's selection sorts by (wnid,
file name) and takes the first ``n_images`` (12,800 = all 50 images of the first 256 classes).
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitplasticity.data.archives import (
    FormatError,
    InputFile,
    find_member,
    first_undecodable,
    read_mat,
    read_tar_members,
    tar_names,
)
from vitplasticity.data.download import Progress
from vitplasticity.data.imagenet_layouts import IMAGENET_ENV, IMAGENET_LAYOUTS

log = logging.getLogger(__name__)

VAL_TAR = "ILSVRC2012_img_val.tar"
DEVKIT_NAMES = ("ILSVRC2012_devkit_t12.tar.gz", "ILSVRC2012_devkit_t12.tar")
HF_TAR = "val_images.tar.gz"
# ImageNet-1k val: 50 images of each of 1,000 classes.
VAL_CLASSES, VAL_IMAGES = 1000, 50000
_WNID = re.compile(r"^n\d{8}$")
_OFFICIAL = re.compile(r"(?:^|/)(ILSVRC2012_val_(\d{8}))\.JPEG$", re.IGNORECASE)
_HF = re.compile(r"(?:^|/)(ILSVRC2012_val_\d{8})_(n\d{8})\.JPEG$", re.IGNORECASE)
_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
# Where the files come from, named in the remedy of a damaged one (never downloaded).
IMAGENET_KEY = f"paths.imagenet (or {IMAGENET_ENV})"
_SYNSET_FIELDS = frozenset({"ILSVRC2012_ID", "WNID", "num_children"})  # of the devkit's meta.mat


@dataclass(frozen=True)
class ValImage:
    """One val image: its class, canonical file name, and where to read it in the layout."""

    wnid: str
    name: str  # ILSVRC2012_val_00000001.JPEG, whatever the layout calls it
    locator: str  # a path (folder layout) or a tar member name

    @property
    def manifest_name(self) -> str:
        return f"{self.wnid}/{self.name}"


# The names an archive layout's file may have (the official tar, the Hugging Face tar.gz).
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")


def layout_error(path: str | os.PathLike[str], problem: str) -> ValueError:
    """The error for a path that is not an accepted layout: the key, the problem, the layouts."""
    layouts = "\n".join(f"  - {layout}" for layout in IMAGENET_LAYOUTS)
    return ValueError(
        f"paths.imagenet (or {IMAGENET_ENV}) = {str(path)!r}: {problem}.\n"
        f"Accepted layouts:\n{layouts}"
    )


def index_val(path: str | os.PathLike[str]) -> tuple[str, list[ValImage]]:
    """Detect the layout at ``path`` and index its images; return (layout, images).

    Raises:
        ValueError: ``path`` is missing or not an accepted layout (naming the key and layouts).
        DamagedFileError: ``path`` is a tar that cannot be read (truncated, an HTML page),
            naming it and the remedy.
    """
    path = Path(os.path.expanduser(str(path)))
    if not path.exists():
        raise layout_error(path, "does not exist")
    if path.is_dir():
        for archive in (VAL_TAR, HF_TAR):
            if (path / archive).is_file():
                return index_val(path / archive)
        return "folder", _index_folder(path)
    if not path.name.endswith(_TAR_SUFFIXES):
        raise layout_error(path, "not a val folder or a tar archive")
    # A tar in the place of the val set is one of the archive layouts: one that cannot be
    # read is damaged (named with the remedy), not another layout.
    with InputFile.local(path, IMAGENET_KEY).reading("tar archive"):
        names = tar_names(path)
    hf = [(m, _HF.search(m)) for m in names]
    if any(match for _, match in hf):
        return "hf", [
            ValImage(match.group(2), f"{match.group(1)}.JPEG", member)
            for member, match in hf
            if match
        ]
    official = [(m, _OFFICIAL.search(m)) for m in names]
    if any(match for _, match in official):
        return "official", _index_official(path, official)
    raise layout_error(path, "a tar without ILSVRC2012_val_* images")


def _index_folder(path: Path) -> list[ValImage]:
    """The images of a val folder tree (``path/val/<wnid>/`` or ``path/<wnid>/``).

    Raises:
        ValueError: no wnid folders, naming the key and layouts.
    """
    root = path / "val" if (path / "val").is_dir() else path
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and _WNID.match(p.name))
    if not classes:
        raise layout_error(path, "no val/<wnid>/ folders (wnid: n + 8 digits) and no archive")
    return [
        ValImage(wnid, f.name, str(f))
        for wnid in classes
        for f in sorted((root / wnid).iterdir())
        if f.suffix.lower() in _IMAGE_SUFFIXES
    ]


def _index_official(path: Path, official: list[tuple[str, re.Match | None]]) -> list[ValImage]:
    """The images of the official val tar (``official``: each member and its name match),
    labelled by the devkit beside it.

    Raises:
        DamagedFileError: the devkit cannot be read, or has no label for an image.
    """
    devkit, wnid_of = _devkit_labels(path)
    images = []
    for member, match in official:
        if match:
            number = int(match.group(2))
            if number not in wnid_of:
                raise devkit.damaged(
                    f"its ground truth has {len(wnid_of)} labels, none for {member} of {path}"
                )
            images.append(ValImage(wnid_of[number], f"{match.group(1)}.JPEG", member))
    return images


def _devkit_labels(val_tar: Path) -> tuple[InputFile, dict[int, str]]:
    """The devkit beside the official val tar, and its map from val image number (1-based)
    to wnid.

    Raises:
        ValueError: no devkit beside the tar (naming the key and the layouts).
        DamagedFileError: the devkit (or its meta.mat or ground truth) cannot be parsed.
    """
    path = next((val_tar.parent / n for n in DEVKIT_NAMES if (val_tar.parent / n).is_file()), None)
    if path is None:
        raise layout_error(val_tar, f"the official val tar needs {DEVKIT_NAMES[0]} beside it")
    devkit = InputFile.local(path, IMAGENET_KEY)
    with devkit.reading("devkit tar archive"):
        names = tar_names(path)
        meta_name = find_member(names, "data/meta.mat", path)
        truth_name = find_member(names, "data/ILSVRC2012_validation_ground_truth.txt", path)
        members = read_tar_members(path, {meta_name, truth_name})
    with devkit.reading("MATLAB .mat file", meta_name):
        synsets = np.atleast_1d(read_mat(members[meta_name])["synsets"])
        if not set(synsets.dtype.names or ()) >= _SYNSET_FIELDS:
            raise FormatError(f"'synsets' lacks the fields {sorted(_SYNSET_FIELDS)}")
        # The 1,000 leaf synsets (no children) are the classes; ILSVRC2012_ID numbers them.
        id_to_wnid = {
            int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets if int(s["num_children"]) == 0
        }
    with devkit.reading("ground truth list (text)", truth_name):
        truth = [int(v) for v in members[truth_name].decode().split()]
        unknown = sorted(set(truth) - id_to_wnid.keys())
        if unknown:
            raise FormatError(f"class ids {unknown[:3]} are not among the classes of {meta_name}")
    return devkit, {number: id_to_wnid[class_id] for number, class_id in enumerate(truth, start=1)}


def select_images(
    images: list[ValImage], n_images: int, selection: str, seed: int
) -> list[ValImage]:
    """Choose ``n_images`` images, returned sorted by (wnid, file name).

    ``paper``: the first ``n_images`` in (wnid, file name) order. ``stratified``: an equal
    share of every class (the remainder to classes drawn by ``seed``), images drawn by
    ``seed`` within each class.

    Raises:
        ValueError: too few images (naming how many there are), or an unknown selection.
    """
    ordered = sorted(images, key=lambda im: (im.wnid, im.name))
    if n_images > len(ordered):
        raise ValueError(
            f"reference.n_images = {n_images}, but the ImageNet val set has {len(ordered)} images"
        )
    if selection == "paper":
        return ordered[:n_images]
    if selection != "stratified":
        raise ValueError(f"reference.selection: {selection!r} is not 'paper' or 'stratified'")
    by_class: dict[str, list[ValImage]] = defaultdict(list)
    for image in ordered:
        by_class[image.wnid].append(image)
    classes = sorted(by_class)
    rng = np.random.default_rng(seed)
    quota = dict.fromkeys(classes, n_images // len(classes))
    for k in rng.choice(len(classes), size=n_images % len(classes), replace=False):
        quota[classes[k]] += 1
    chosen: list[ValImage] = []
    for wnid in classes:
        members = by_class[wnid]
        if quota[wnid] > len(members):
            raise ValueError(
                f"reference.n_images = {n_images}: class {wnid} has only {len(members)} images "
                f"for its stratified share of {quota[wnid]}"
            )
        picks = rng.choice(len(members), size=quota[wnid], replace=False)
        chosen.extend(members[i] for i in picks)
    return sorted(chosen, key=lambda im: (im.wnid, im.name))


def imagenet_reference(
    path: str | os.PathLike[str],
    *,
    n_images: int,
    selection: str = "paper",
    seed: int = 0,
    expected: tuple[int, int] | None = (VAL_CLASSES, VAL_IMAGES),
) -> tuple[list[bytes], list[int], list[str]]:
    """The reference images chosen from the ImageNet val set at ``path``.

    Args:
        path: a val folder tree, the official val tar (devkit beside it), or val_images.tar.gz.
        n_images: how many images (the paper: 12,800).
        selection: ``paper`` (sorted by wnid then file name, the first ``n_images``) or
            ``stratified`` (seeded, every class).
        seed: the seed of the stratified selection.
        expected: (classes, images) the val set must have (the full ImageNet-1k val: 1,000
            and 50,000, so that "the first 256 classes" means what it does in the paper);
            None skips the check.

    Returns:
        The encoded images (original JPEG bytes), their labels (index of the wnid among the
        sorted wnids of the val set) and the manifest ``<wnid>/ILSVRC2012_val_<n>.JPEG``.

    Raises:
        ValueError: a path that is not an accepted layout, or counts that differ from
            ``expected``.
        DamagedFileError: an archive, devkit file or chosen image that cannot be parsed or
            decoded, naming the file, the member and the remedy (replace it).
    """
    layout, images = index_val(path)
    wnids = sorted({image.wnid for image in images})
    log.info(
        "ImageNet val at %s (%s): %d images, %d classes", path, layout, len(images), len(wnids)
    )
    if expected is not None and (len(wnids), len(images)) != tuple(expected):
        raise ValueError(
            f"paths.imagenet = {str(path)!r} ({layout} layout) holds {len(images)} images of "
            f"{len(wnids)} classes; ImageNet-1k val has {expected[1]} of {expected[0]}"
        )
    chosen = select_images(images, n_images, selection, seed)
    data = _read_chosen(path, layout, chosen)
    label_of = {wnid: k for k, wnid in enumerate(wnids)}
    return data, [label_of[im.wnid] for im in chosen], [im.manifest_name for im in chosen]


def _read_chosen(path: str | os.PathLike[str], layout: str, chosen: list[ValImage]) -> list[bytes]:
    """The bytes of the ``chosen`` images of the val set at ``path``, checked to decode.

    Raises:
        DamagedFileError: an image or the archive cannot be read, or an image does not
            decode; naming the file (or the archive and member) and the remedy.
    """
    if layout == "folder":
        progress = Progress(f"read {path}", len(chosen), unit="img")
        data = []
        for image in chosen:
            with InputFile.local(image.locator, IMAGENET_KEY).reading("image file"):
                data.append(Path(image.locator).read_bytes())
            progress.update(1)
        progress.close()
    else:
        archive = InputFile.local(path_of_archive(path, layout), IMAGENET_KEY)
        with archive.reading("tar archive"):
            members = read_tar_members(archive.path, {im.locator for im in chosen})
        data = [members[image.locator] for image in chosen]
    bad = first_undecodable(data)
    if bad is not None:
        index, reason = bad
        problem = f"not a decodable image ({reason})"
        if layout == "folder":
            raise InputFile.local(chosen[index].locator, IMAGENET_KEY).damaged(problem)
        raise archive.damaged(problem, chosen[index].locator)
    return data


def path_of_archive(path: str | os.PathLike[str], layout: str) -> Path:
    """The archive file behind ``path`` (itself, or the archive inside a folder)."""
    path = Path(os.path.expanduser(str(path)))
    if path.is_dir():
        return path / (VAL_TAR if layout == "official" else HF_TAR)
    return path
