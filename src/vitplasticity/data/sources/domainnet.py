"""DomainNet (Peng et al., 2019): one domain's zip of ``<domain>/<class>/<image>.jpg``.

``split: random`` (the reference code) takes the whole domain in ImageFolder order (classes
sorted, files sorted) and splits it 80/20 into pool/test with the reference code's fixed
seed-42 permutation. ``split: official`` uses the published ``<domain>_train.txt`` (pool)
and ``<domain>_test.txt`` (test) lists. Images are stored as their original JPEG bytes.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.archives import FormatError, InputFile, open_zip
from vitplasticity.data.download import Progress
from vitplasticity.data.sources.common import (
    PreparedSplits,
    make_split,
    paper_fixed_split,
    resolve_files,
    write_prepared,
)
from vitplasticity.data.store import Split

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def scan_domain(names: list[str], domain: str) -> tuple[list[str], list[str]]:
    """The image paths ``<domain>/<class>/<file>`` in ImageFolder order, and the class names."""
    images = sorted(
        n
        for n in names
        if n.lower().endswith(IMAGE_SUFFIXES) and n.startswith(f"{domain}/") and n.count("/") == 2
    )
    classes = sorted({n.split("/")[1] for n in images})
    return images, classes


# The official list of each split: <domain>_train.txt is the pool.
LIST_NAMES: dict[str, str] = {"pool": "train", "test": "test"}


def _line_of(file: InputFile, image: str) -> int:
    """The 1-based line of split list ``file`` that names ``image`` first."""
    lines = file.path.read_text().splitlines()
    return next(n for n, line in enumerate(lines, start=1) if line.split()[:1] == [image])


def read_list(file: InputFile) -> list[str]:
    """The image paths of an official split list (lines ``<path> <label>``).

    Raises:
        DamagedFileError: a line of another shape (or bytes that are not text), naming the
            file, the line and the remedy.
    """
    entries = []
    with file.reading("split list (text)"):
        for number, line in enumerate(file.path.read_text().splitlines(), start=1):
            if line.strip():
                parts = line.split()
                if len(parts) != 2 or not parts[1].isdigit():
                    raise FormatError(f"line {number}: expected '<path> <label>', got {line!r}")
                entries.append(parts[0])
    return entries


def prepare(
    name: str,
    spec: dict[str, Any],
    out_dir: Path,
    downloads: Path,
    *,
    files: dict | None = None,
    expected: dict[str, int] | None = None,
) -> dict[str, int]:
    """Prepare one DomainNet domain into ``out_dir``; return split sizes.

    Raises:
        ValueError: an unknown ``split``, naming the key.
        DamagedFileError: the zip or a split list cannot be parsed, the zip lacks the domain
            folder or a listed image, or an image does not decode; naming the file, the
            member and the remedy.
    """
    domain, split_mode = spec.get("domain"), spec.get("split", "random")
    if split_mode not in ("random", "official"):
        raise ValueError(f"datasets.{name}.split: {split_mode!r} is not 'random' or 'official'")
    paths = resolve_files(name, spec, Path(downloads), files)
    archive = paths[f"{domain}.zip"]
    with archive.reading("zip archive"), open_zip(archive.path) as zipped:
        images, classes = scan_domain(zipped.namelist(), domain)
        if not images:
            tops = sorted({n.split("/", 1)[0] for n in zipped.namelist()})
            raise archive.misshapen(
                f"no images under '{domain}/<class>/' (its top-level entries: {tops[:5]}); "
                f"the official {domain}.zip holds {domain}/<class>/<image>: re-packed, or "
                "another domain's zip?"
            )
        if split_mode == "random":
            parts = _random_parts(images)
        else:
            parts = _official_parts(paths, domain, images)
        label_of = {c: k for k, c in enumerate(classes)}
        splits = _read_splits(archive, zipped, parts, label_of)
    prepared = PreparedSplits(
        splits=splits,
        class_names=classes,
        details={
            "domain": domain,
            "split": split_mode,
            "domain_images": len(images),
            "encoding": "original",
        },
    )
    return write_prepared(name, spec, out_dir, prepared, paths, expected)


def _random_parts(images: list[str]) -> dict[str, list[str]]:
    """The reference code's fixed 80/20 pool/test split of the domain's images."""
    pool_idx, test_idx = paper_fixed_split(len(images))
    return {"pool": [images[i] for i in pool_idx], "test": [images[i] for i in test_idx]}


def _official_parts(
    paths: dict[str, InputFile], domain: str, images: list[str]
) -> dict[str, list[str]]:
    """The official train/test lists of ``domain``, each image checked to be in the zip.

    Raises:
        DamagedFileError: a list cannot be read, or names an image the zip does not hold.
    """
    archive = paths[f"{domain}.zip"]
    parts = {
        split: read_list(paths[f"{domain}_{list_name}.txt"])
        for split, list_name in LIST_NAMES.items()
    }
    present = set(images)
    for split, listed in parts.items():
        missing = [p for p in listed if p not in present]
        if missing:
            # Both files passed their checksums: blame the list line naming an image
            # the zip does not hold (fetching either again brings the same bytes).
            listing = paths[f"{domain}_{LIST_NAMES[split]}.txt"]
            raise listing.misshapen(
                f"line {_line_of(listing, missing[0])} names image {missing[0]!r}, "
                f"which {archive.path.name} does not hold ({len(missing)} listed "
                "image(s) missing in all)"
            )
    return parts


def _read_splits(
    archive: InputFile,
    zipped: zipfile.ZipFile,
    parts: dict[str, list[str]],
    label_of: dict[str, int],
) -> dict[str, Split]:
    """Each split's images read out of the zip (checked to decode), labelled by class folder.

    Raises:
        DamagedFileError: a member cannot be read or does not decode.
    """
    total = sum(len(v) for v in parts.values())
    progress = Progress(f"read {archive.path.name}", total, unit="img")
    splits: dict[str, Split] = {}
    for split, chosen in parts.items():
        data = []
        for path in chosen:
            with archive.reading("zip member", path):
                data.append(zipped.read(path))
            progress.update(1)
        archive.check_images(data, chosen)
        labels = np.array([label_of[p.split("/")[1]] for p in chosen], dtype=np.int64)
        splits[split] = make_split(data, labels.tolist(), chosen)
    progress.close()
    return splits
