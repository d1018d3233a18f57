"""The prepared store, the demo's synthetic source and the ImageFolder preparer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitplasticity.cli import main as cli_main
from vitplasticity.data.decode import decode
from vitplasticity.data.imagefolder import prepare_image_folder
from vitplasticity.data.reference import build_reference
from vitplasticity.data.store import (
    PreparedDatasetWriter,
    Split,
    check_labels,
    encode_png,
    fixed_split,
    read_meta,
    read_split,
    split_pool,
)
from vitplasticity.data.synthetic import STYLES, synthetic_images
from vitplasticity.utils.io import UnreadableFileError


def test_split_pool_is_seeded_disjoint_and_complete() -> None:
    train, val = split_pool(100, seed=42, val_fraction=0.2)
    assert len(train) == 80 and len(val) == 20
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(range(100))
    assert list(train) == sorted(train)
    again, _ = split_pool(100, seed=42)
    other, _ = split_pool(100, seed=0)
    assert np.array_equal(train, again) and not np.array_equal(train, other)
    pool, test = fixed_split(100)
    order = np.random.RandomState(42).permutation(100)  # the reference code's split
    assert np.array_equal(pool, np.sort(order[:80])) and np.array_equal(test, np.sort(order[80:]))
    with pytest.raises(ValueError, match="val_fraction"):
        split_pool(10, 0, 1.0)


@pytest.mark.parametrize("style", STYLES)
def test_synthetic_images_are_deterministic_and_balanced(style: str) -> None:
    images, labels = synthetic_images(style, num_classes=4, n=40, image_size=16, seed=3)
    assert images.shape == (40, 16, 16, 3) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [10, 10, 10, 10]
    again, _ = synthetic_images(style, num_classes=4, n=40, image_size=16, seed=3)
    assert np.array_equal(images, again)
    # Classes differ on average more than images within a class: there is something to learn.
    means = np.stack([images[labels == k].mean(axis=0) for k in range(4)]).astype(np.float64)
    between = np.abs(means[:, None] - means[None]).mean()
    assert between > 1.0


def test_synthetic_dataset_round_trips_through_the_store(demo_dataset: Path) -> None:
    meta = read_meta(demo_dataset)
    assert meta["splits"] == {"pool": 64, "test": 32}
    assert meta["demo"] is True and meta["num_classes"] == 4 and len(meta["class_names"]) == 4
    pool = read_split(demo_dataset, "pool")
    assert len(pool) == 64 and pool.labels.dtype == np.int64
    pixels = decode(pool.images[0])
    assert pixels.shape == (3, 32, 32) and pixels.dtype == torch.uint8
    subset = pool.subset([3, 1])
    assert subset.files == [pool.files[3], pool.files[1]]
    with pytest.raises(FileNotFoundError, match="no split 'val'"):
        read_split(demo_dataset, "val")


def test_png_encoding_is_lossless() -> None:
    array = np.random.default_rng(0).integers(0, 256, size=(9, 7, 3), dtype=np.uint8)
    assert np.array_equal(decode(encode_png(array)).permute(1, 2, 0).numpy(), array)


def test_writer_leaves_nothing_behind_on_error(tmp_path: Path) -> None:
    out = tmp_path / "broken"
    with pytest.raises(RuntimeError), PreparedDatasetWriter(out) as writer:
        writer.add_split("pool", [encode_png(np.zeros((4, 4, 3), np.uint8))], [0], ["a"])
        raise RuntimeError("interrupted")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    with (
        pytest.raises(ValueError, match="split 'test' was not written"),
        PreparedDatasetWriter(out) as writer,
    ):
        writer.add_split("pool", [b"x"], [0], ["a"])
        writer.finish({})
    assert not out.exists()


def _image_tree(root: Path, classes: dict[str, int], size: int = 12) -> None:
    rng = np.random.default_rng(0)
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
                root / name / f"{i:03d}.jpg"
            )


def test_image_folder_random_split_keeps_original_bytes(tmp_path: Path) -> None:
    _image_tree(tmp_path / "tree", {"cat": 6, "dog": 4})
    counts = prepare_image_folder(tmp_path / "tree", tmp_path / "out", "pets")
    assert counts == {"pool": 8, "test": 2}
    meta = read_meta(tmp_path / "out")
    assert meta["class_names"] == ["cat", "dog"]
    pool = read_split(tmp_path / "out", "pool")
    for image, file, label in zip(pool.images, pool.files, pool.labels, strict=True):
        assert image == (tmp_path / "tree" / file).read_bytes()
        assert meta["class_names"][label] == file.split("/")[0]


def test_image_folder_with_train_test_folders(tmp_path: Path) -> None:
    _image_tree(tmp_path / "tree" / "train", {"a": 3, "b": 2})
    _image_tree(tmp_path / "tree" / "test", {"a": 1, "b": 1})
    counts = prepare_image_folder(tmp_path / "tree", tmp_path / "out", "ab")
    assert counts == {"pool": 5, "test": 2}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        prepare_image_folder(tmp_path / "missing", tmp_path / "out2", "x")


def test_reference_from_a_prepared_split(demo_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "ref.parquet"
    assert (
        build_reference(
            out, source="dataset", dataset_dir=str(demo_dataset), split="test", n_images=20
        )
        == 20
    )
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    assert table.column_names == ["image", "label", "file"]
    assert table.column("file").to_pylist() == read_split(demo_dataset, "test").files[:20]
    with pytest.raises(ValueError, match=r"fewer than reference\.n_images"):
        build_reference(
            tmp_path / "r2.parquet", source="dataset", dataset_dir=str(demo_dataset), n_images=999
        )
    assert not (tmp_path / "r2.parquet").exists()


def test_reference_without_imagenet_names_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    code = cli_main(
        [
            "reference",
            "--source",
            "imagenet",
            "--imagenet",
            "",
            "--out",
            str(tmp_path / "r.parquet"),
        ]
    )
    assert code == 2
    message = caplog.text
    assert "paths.imagenet" in message and "VITPLASTICITY_IMAGENET" in message
    assert "ILSVRC2012_img_val.tar" in message and "val_images.tar.gz" in message
    assert not (tmp_path / "r.parquet").exists()


def test_prepare_cli_synthetic(tmp_path: Path) -> None:
    spec = {
        "source": "synthetic",
        "style": "blobs",
        "num_classes": 3,
        "n_pool": 12,
        "n_test": 6,
        "image_size": 16,
        "seed": 0,
        "steps": 1,
        "val_every": 1,
    }
    assert (
        cli_main(
            ["prepare", "--dataset", "d", "--spec", json.dumps(spec), "--out", str(tmp_path / "d")]
        )
        == 0
    )
    assert read_meta(tmp_path / "d")["splits"] == {"pool": 12, "test": 6}


def test_prepare_cli_unknown_source(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    code = cli_main(
        [
            "prepare",
            "--dataset",
            "d",
            "--spec",
            json.dumps({"source": "svhn"}),
            "--out",
            str(tmp_path / "d"),
        ]
    )
    assert code == 2 and "datasets.d.source: unknown source 'svhn'" in caplog.text


# --- meta.json against the labels ---------------------------------------------------------


def _labels(*values: int) -> Split:
    return Split([b""] * len(values), np.asarray(values, dtype=np.int64), [""] * len(values))


def test_labels_must_be_classes_of_the_head(tmp_path: Path) -> None:
    # The head has num_classes outputs: a label at or past it (or negative) cannot be trained.
    check_labels(tmp_path, 4, {"pool": _labels(0, 1, 2, 3), "test": _labels(3, 0)})
    for bad in (4, -1):
        with pytest.raises(UnreadableFileError) as error:
            check_labels(tmp_path, 4, {"pool": _labels(0, 1), "test": _labels(2, bad)})
        assert str(error.value).startswith(
            f"{tmp_path / 'meta.json'}: num_classes 4, but test.parquet has labels from "
            f"{min(bad, 2)} to {max(bad, 2)}"
        )


def test_a_class_without_images_is_allowed_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A small subset of a dataset need not hold every class of its official list.
    check_labels(tmp_path, 5, {"pool": _labels(0, 1), "test": _labels(1, 3)})
    assert "2 of 5 classes have no image in any split (e.g. [2, 4])" in caplog.text


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        (
            {"num_classes": 10, "class_names": ["a", "b", "c", "d"]},
            "num_classes 10 but 4 class_names",
        ),
        ({"num_classes": "4"}, "num_classes '4' is not a positive integer"),
        ({"num_classes": 0, "class_names": []}, "num_classes 0 is not a positive integer"),
        ([4], "expected a JSON object, found list"),
    ],
    ids=["more-classes-than-names", "a-string", "zero", "not-an-object"],
)
def test_meta_is_checked_when_read(tmp_path: Path, meta: object, says: str) -> None:
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UnreadableFileError) as error:
        read_meta(tmp_path)
    assert f"{tmp_path / 'meta.json'}: {says}; delete the folder {tmp_path} and rerun" in str(
        error.value
    )


@pytest.mark.parametrize("source", ["text_file", "labelled_text"])
def test_prepare_cli_says_a_text_dataset_is_read_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, source: str
) -> None:
    spec = {"source": source, "path": str(tmp_path / "wiki.txt")}
    args = ["prepare", "--dataset", "wiki", "--spec", json.dumps(spec)]
    code = cli_main([*args, "--out", str(tmp_path / "wiki")])
    assert (
        code == 2
        and f"datasets.wiki: a text dataset (source: {source}) is not prepared" in caplog.text
    )
    assert not (tmp_path / "wiki").exists()
