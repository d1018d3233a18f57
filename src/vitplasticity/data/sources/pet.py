"""Oxford-IIIT Pet from ``images.tar.gz`` + ``annotations.tar.gz``.

``annotations/trainval.txt`` (3,680 images) is the pool, re-split into train/val by the run
seed; ``annotations/test.txt`` (3,669) the test split. Lines read ``<image id> <class id>
<species> <breed id>`` with 1-based class ids; class names come from the image ids
(``american_bulldog_12`` -> ``American Bulldog``, as torchvision names them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitplasticity.data.archives import (
    FormatError,
    InputFile,
    jpg_members,
    read_tar_members,
    read_tar_suffixes,
)
from vitplasticity.data.sources.common import (
    PreparedSplits,
    make_split,
    resolve_files,
    write_prepared,
)

LISTS: dict[str, str] = {"pool": "trainval.txt", "test": "test.txt"}


def parse_list(data: bytes) -> list[tuple[str, int]]:
    """``(image id, 0-based label)`` per line of an annotation list (``#`` lines skipped).

    Raises:
        FormatError: a line of another shape, naming the line.
        UnicodeDecodeError: bytes that are not text.
    """
    entries = []
    for number, line in enumerate(data.decode().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2 or not parts[1].isdigit() or int(parts[1]) < 1:
            raise FormatError(f"line {number}: expected '<image id> <class id> ...', got {line!r}")
        entries.append((parts[0], int(parts[1]) - 1))
    return entries


def _first_line_naming(
    image_ids: list[str], list_members: dict[str, str], texts: dict[str, bytes]
) -> tuple[str, int]:
    """The list member and 1-based line number where ``image_ids[0]`` is listed first."""
    return next(
        (member, number)
        for member in list_members.values()
        for number, line in enumerate(texts[member].decode().splitlines(), start=1)
        if line.split()[:1] == [image_ids[0]]
    )


def class_name(image_id: str) -> str:
    """The breed name of an image id: ``american_bulldog_12`` -> ``American Bulldog``."""
    return " ".join(part.title() for part in image_id.rsplit("_", 1)[0].split("_"))


def prepare(
    name: str,
    spec: dict[str, Any],
    out_dir: Path,
    downloads: Path,
    *,
    files: dict | None = None,
    expected: dict[str, int] | None = None,
) -> dict[str, int]:
    """Prepare Oxford-IIIT Pet into ``out_dir`` (pool = trainval, test); return split sizes.

    Raises:
        DamagedFileError: an archive or a list cannot be parsed, a listed image is missing or
            does not decode; naming the file, the member and the remedy.
    """
    paths = resolve_files(name, spec, Path(downloads), files)
    images_tar, annotations_tar = paths["images.tar.gz"], paths["annotations.tar.gz"]
    lists = _read_lists(annotations_tar)
    names: dict[int, str] = {}
    for split_entries in lists.entries.values():
        for image_id, label in split_entries:
            names.setdefault(label, class_name(image_id))
    if sorted(names) != list(range(len(names))):
        raise annotations_tar.damaged(f"class ids are not 1..{len(names)}")
    by_name, members = _read_images(images_tar, lists)
    splits = {
        split: make_split(
            [members[by_name[f"{image_id}.jpg"]] for image_id, _ in split_entries],
            [label for _, label in split_entries],
            [f"images/{image_id}.jpg" for image_id, _ in split_entries],
        )
        for split, split_entries in lists.entries.items()
    }
    prepared = PreparedSplits(
        splits=splits,
        class_names=[names[k] for k in range(len(names))],
        details={"encoding": "original", "official_lists": LISTS},
    )
    return write_prepared(name, spec, out_dir, prepared, paths, expected)


@dataclass
class _Lists:
    """The official annotation lists read out of the annotations archive."""

    archive: InputFile
    members: dict[str, str]  # split -> its list's member name
    texts: dict[str, bytes]  # member name -> its bytes
    entries: dict[str, list[tuple[str, int]]]  # split -> (image id, 0-based label) per line


def _read_lists(annotations_tar: InputFile) -> _Lists:
    """Each split's annotation list, parsed.

    Raises:
        DamagedFileError: the archive or a list cannot be parsed.
    """
    with annotations_tar.reading("tar.gz archive"):
        suffixes = {split: f"annotations/{f}" for split, f in LISTS.items()}
        list_members, texts = read_tar_suffixes(annotations_tar.path, suffixes)
    entries = {}
    for split, member in list_members.items():
        with annotations_tar.reading("annotation list (text)", member):
            entries[split] = parse_list(texts[member])
    return _Lists(annotations_tar, list_members, texts, entries)


def _read_images(images_tar: InputFile, lists: _Lists) -> tuple[dict[str, str], dict[str, bytes]]:
    """The listed images: the archive's .jpg members by file name, and the listed ones' bytes.

    Raises:
        DamagedFileError: a listed image is missing (blaming the list line naming it) or does
            not decode.
    """
    needed = {image_id for entries in lists.entries.values() for image_id, _ in entries}
    with images_tar.reading("tar.gz archive"):
        by_name = jpg_members(images_tar.path)
        missing = sorted(i for i in needed if f"{i}.jpg" not in by_name)
    if missing:
        # Both archives passed their checksums and read whole: the odd one out is the list
        # line naming an image that does not exist (fetching either again brings the same).
        member, number = _first_line_naming(missing, lists.members, lists.texts)
        raise lists.archive.misshapen(
            f"line {number} names image {missing[0]!r}, which {images_tar.path.name} does not "
            f"hold ({len(missing)} listed image(s) missing in all)",
            member,
        )
    with images_tar.reading("tar.gz archive"):
        members = read_tar_members(images_tar.path, {by_name[f"{i}.jpg"] for i in needed})
    images_tar.check_images(list(members.values()), list(members))
    return by_name, members
