"""The ImageNet reference set from each accepted layout: same images, same order, same manifest;
the paper's and the stratified selection; errors that name the key and the layouts."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers.fixtures_data import imagenet_val, write_hf, write_official, write_val_folder
from vitplasticity.data.imagenet import imagenet_reference, index_val
from vitplasticity.data.imagenet_layouts import IMAGENET_LAYOUTS
from vitplasticity.data.reference import build_reference

N_CLASSES, PER_CLASS = 5, 4
TINY = (N_CLASSES, N_CLASSES * PER_CLASS)


@pytest.fixture(scope="module")
def val():
    return imagenet_val(N_CLASSES, PER_CLASS)


@pytest.fixture(scope="module")
def layouts(val, tmp_path_factory):
    """The same val set in every accepted layout: name -> path to give paths.imagenet."""
    root = tmp_path_factory.mktemp("imagenet")
    folder = write_val_folder(val, root / "tree")
    official = write_official(val, root / "official")
    hf = write_hf(val, root / "hf")
    return {
        "folder": folder,
        "val folder itself": folder / "val",
        "official tar": official,
        "folder with official tar": official.parent,
        "hf tar": hf,
        "folder with hf tar": hf.parent,
    }


@pytest.mark.parametrize(
    "layout",
    [
        "folder",
        "val folder itself",
        "official tar",
        "folder with official tar",
        "hf tar",
        "folder with hf tar",
    ],
)
def test_every_layout_gives_the_paper_selection(layout, layouts, val):
    n = 2 * PER_CLASS + 1  # two whole classes and the first image of the third
    images, labels, files = imagenet_reference(
        layouts[layout], n_images=n, selection="paper", expected=TINY
    )
    expected_files = val.manifest()[:n]  # sorted by (wnid, file name)
    assert files == expected_files
    assert images == [val.images[f.split("/")[1]] for f in expected_files]  # original bytes
    assert labels == [val.wnids.index(f.split("/")[0]) for f in expected_files]
    assert labels == [0] * PER_CLASS + [1] * PER_CLASS + [2]


def test_stratified_selection(layouts, val):
    n = 2 * N_CLASSES + 2
    _, labels, files = imagenet_reference(
        layouts["folder"], n_images=n, selection="stratified", seed=7, expected=TINY
    )
    per_class = Counter(labels)
    assert set(per_class) == set(range(N_CLASSES))
    assert sorted(per_class.values()) == [2, 2, 2, 3, 3]
    assert files == sorted(files) and len(set(files)) == n
    again = imagenet_reference(
        layouts["hf tar"], n_images=n, selection="stratified", seed=7, expected=TINY
    )[2]
    assert again == files  # the same choice from another layout
    others = {
        tuple(
            imagenet_reference(
                layouts["folder"], n_images=n, selection="stratified", seed=s, expected=TINY
            )[2]
        )
        for s in range(5)
    }
    assert len(others) > 1  # the seed matters


def test_full_val_counts_are_checked_by_default(layouts):
    with pytest.raises(ValueError, match="holds 20 images of 5 classes; ImageNet-1k val has 50000"):
        imagenet_reference(layouts["folder"], n_images=4)


def test_too_many_images_requested(layouts):
    with pytest.raises(ValueError, match=r"reference\.n_images = 21"):
        imagenet_reference(layouts["folder"], n_images=21, expected=None)


def assert_names_key_and_layouts(message: str) -> None:
    assert "paths.imagenet" in message and "VITPLASTICITY_IMAGENET" in message
    for layout in IMAGENET_LAYOUTS:
        assert layout in message


def test_missing_path_names_key_and_layouts(tmp_path):
    with pytest.raises(ValueError) as error:
        index_val(tmp_path / "nowhere")
    assert "does not exist" in str(error.value)
    assert_names_key_and_layouts(str(error.value))


def test_wrong_folder_names_key_and_layouts(tmp_path):
    (tmp_path / "cats").mkdir()
    with pytest.raises(ValueError) as error:
        index_val(tmp_path)
    assert_names_key_and_layouts(str(error.value))


def test_official_tar_without_devkit(val, tmp_path):
    tar = write_official(val, tmp_path / "nodevkit", devkit=False)
    with pytest.raises(ValueError, match=r"ILSVRC2012_devkit_t12\.tar\.gz beside it"):
        index_val(tar)


def test_a_file_that_is_not_a_tar(tmp_path):
    path = tmp_path / "val.zip"
    path.write_bytes(b"PK\x03\x04 not a tar")
    with pytest.raises(ValueError) as error:
        index_val(path)
    assert_names_key_and_layouts(str(error.value))


def test_reference_stage_keeps_the_manifest_and_checks_counts(layouts, tmp_path):
    # The reference stage calls imagenet_reference with the real val set's counts: a tiny set
    # is rejected with the counts named, and no output appears.
    out = tmp_path / "reference.parquet"
    with pytest.raises(ValueError, match="ImageNet-1k val has 50000 of 1000"):
        build_reference(out, source="imagenet", imagenet=str(layouts["hf tar"]), n_images=8)
    assert not out.exists()
