"""Oxford Flowers-102 from ``102flowers.tgz`` + ``imagelabels.mat`` + ``setid.mat``.

The official splits are kept as they are (train 1,020 / val 1,020 / test 6,149): ``pool`` is
the train split and is not re-split, ``val`` the official validation split. Order within a
split is that of ``setid.mat`` (as torchvision reads it); images keep their JPEG bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitplasticity.data.archives import (
    FormatError,
    InputFile,
    jpg_members,
    read_mat,
    read_tar_members,
)
from vitplasticity.data.sources.common import (
    PreparedSplits,
    make_split,
    resolve_files,
    write_prepared,
)

# setid.mat key of each prepared split.
SPLIT_KEYS: dict[str, str] = {"pool": "trnid", "val": "valid", "test": "tstid"}
# The 102 category names in label order (the dataset ships only numbers; names as in
# torchvision.datasets.Flowers102.classes).
FLOWERS102_CLASSES: tuple[str, ...] = (
    "pink primrose",
    "hard-leaved pocket orchid",
    "canterbury bells",
    "sweet pea",
    "english marigold",
    "tiger lily",
    "moon orchid",
    "bird of paradise",
    "monkshood",
    "globe thistle",
    "snapdragon",
    "colt's foot",
    "king protea",
    "spear thistle",
    "yellow iris",
    "globe-flower",
    "purple coneflower",
    "peruvian lily",
    "balloon flower",
    "giant white arum lily",
    "fire lily",
    "pincushion flower",
    "fritillary",
    "red ginger",
    "grape hyacinth",
    "corn poppy",
    "prince of wales feathers",
    "stemless gentian",
    "artichoke",
    "sweet william",
    "carnation",
    "garden phlox",
    "love in the mist",
    "mexican aster",
    "alpine sea holly",
    "ruby-lipped cattleya",
    "cape flower",
    "great masterwort",
    "siam tulip",
    "lenten rose",
    "barbeton daisy",
    "daffodil",
    "sword lily",
    "poinsettia",
    "bolero deep blue",
    "wallflower",
    "marigold",
    "buttercup",
    "oxeye daisy",
    "common dandelion",
    "petunia",
    "wild pansy",
    "primula",
    "sunflower",
    "pelargonium",
    "bishop of llandaff",
    "gaura",
    "geranium",
    "orange dahlia",
    "pink-yellow dahlia?",
    "cautleya spicata",
    "japanese anemone",
    "black-eyed susan",
    "silverbush",
    "californian poppy",
    "osteospermum",
    "spring crocus",
    "bearded iris",
    "windflower",
    "tree poppy",
    "gazania",
    "azalea",
    "water lily",
    "rose",
    "thorn apple",
    "morning glory",
    "passion flower",
    "lotus",
    "toad lily",
    "anthurium",
    "frangipani",
    "clematis",
    "hibiscus",
    "columbine",
    "desert-rose",
    "tree mallow",
    "magnolia",
    "cyclamen",
    "watercress",
    "canna lily",
    "hippeastrum",
    "bee balm",
    "ball moss",
    "foxglove",
    "bougainvillea",
    "camellia",
    "mallow",
    "mexican petunia",
    "bromelia",
    "blanket flower",
    "trumpet creeper",
    "blackberry lily",
)


def load_mat(file: InputFile, key: str) -> np.ndarray:
    """One non-empty 1-D integer array of a MATLAB file.

    Raises:
        DamagedFileError: the file is unreadable or lacks ``key``, naming both and the remedy.
    """
    with file.reading("MATLAB .mat file"):
        content = read_mat(file.path.read_bytes())
        if key not in content:
            raise FormatError(f"no variable {key!r} (has {sorted(content)})")
        values = np.atleast_1d(np.asarray(content[key])).astype(np.int64)
        if values.size == 0:
            raise FormatError(f"variable {key!r} is empty")
        return values


def image_member(image_id: int) -> str:
    """The file name of 1-based image ``image_id`` inside the tgz's ``jpg/`` folder."""
    return f"image_{image_id:05d}.jpg"


def prepare(
    name: str,
    spec: dict[str, Any],
    out_dir: Path,
    downloads: Path,
    *,
    files: dict | None = None,
    expected: dict[str, int] | None = None,
) -> dict[str, int]:
    """Prepare Flowers-102 into ``out_dir`` (pool = train, val, test); return split sizes.

    Raises:
        DamagedFileError: a file (or a member of the tgz) cannot be parsed, an image is
            missing or does not decode, naming the file, the member and the remedy.
    """
    paths = resolve_files(name, spec, Path(downloads), files)
    archive, label_file, setid_file = (
        paths[n] for n in ("102flowers.tgz", "imagelabels.mat", "setid.mat")
    )
    labels, ids = _labels_and_splits(label_file, setid_file)
    num_classes = int(labels.max()) + 1
    if num_classes > len(FLOWERS102_CLASSES):
        raise label_file.damaged(f"{num_classes} classes, more than 102")
    everything = np.concatenate(list(ids.values()))
    with archive.reading("tar.gz archive"):
        by_name = jpg_members(archive.path)
        wanted = {int(i): by_name.get(image_member(int(i))) for i in everything}
        missing = [image_member(i) for i, member in wanted.items() if member is None]
        if missing:
            raise archive.damaged(f"{len(missing)} image(s) missing, e.g. {missing[:3]}")
        members = read_tar_members(archive.path, {m for m in wanted.values() if m is not None})
    archive.check_images(list(members.values()), list(members))
    splits = {
        split: make_split(
            [members[wanted[int(i)]] for i in split_ids],
            [int(labels[i - 1]) for i in split_ids],
            [f"jpg/{image_member(int(i))}" for i in split_ids],
        )
        for split, split_ids in ids.items()
    }
    prepared = PreparedSplits(
        splits=splits,
        class_names=list(FLOWERS102_CLASSES[:num_classes]),
        details={"encoding": "original", "official_splits": SPLIT_KEYS},
    )
    return write_prepared(name, spec, out_dir, prepared, paths, expected)


def _labels_and_splits(
    label_file: InputFile, setid_file: InputFile
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The 0-based label of every image, and each split's 1-based image ids, checked to fit.

    Raises:
        DamagedFileError: a .mat cannot be read, or an id falls outside the labels.
    """
    labels = load_mat(label_file, "labels") - 1  # 1-based in the .mat
    ids = {split: load_mat(setid_file, key) for split, key in SPLIT_KEYS.items()}
    everything = np.concatenate(list(ids.values()))
    if everything.min() < 1 or everything.max() > len(labels):
        raise setid_file.damaged(
            f"image ids {everything.min()}..{everything.max()} do not fit the {len(labels)} "
            f"labels of {label_file.path}"
        )
    return labels, ids
