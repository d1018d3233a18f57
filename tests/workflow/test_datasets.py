"""vitplasticity.workflow.datasets: what the download, prepare and reference jobs read and
are given, and the text files of text plasticity, on the paper's and the demo's configs."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from snakemake.iocontainers import Namedlist, Wildcards

from tests.helpers.text_entries import text_dataset
from vitplasticity.data.sources import registry
from vitplasticity.workflow.config import IMAGENET_ENV
from vitplasticity.workflow.datasets import DatasetJobs

CIFAR10 = "cifar-10-python.tar.gz"
MIRROR = "https://mirror.example/cifar-10-python.tar.gz"
SHA256 = "sha256:" + "a" * 64


def of(**wildcards: str) -> Wildcards:
    return Wildcards(fromdict=wildcards)


def test_a_downloaded_dataset_is_prepared_from_the_downloads(paper: dict[str, Any]) -> None:
    jobs = DatasetJobs(paper)
    assert jobs.prepare_inputs(of(dataset="cifar10")) == [f"resources/downloads/{CIFAR10}"]
    assert jobs.downloads == "resources/downloads"


def test_a_local_archive_is_read_where_it_is(paper: dict[str, Any]) -> None:
    paper["datasets"]["cifar10"]["archive"] = "/data/cifar10.tar.gz"
    assert DatasetJobs(paper).prepare_inputs(of(dataset="cifar10")) == ["/data/cifar10.tar.gz"]


def test_a_synthetic_dataset_reads_no_file(demo: dict[str, Any]) -> None:
    assert DatasetJobs(demo).prepare_inputs(of(dataset="demo-stripes")) == []


def test_the_prepare_spec_leaves_out_the_training_keys(paper: dict[str, Any]) -> None:
    """Editing steps or val_every must not prepare the dataset again."""
    spec = json.loads(DatasetJobs(paper).source_spec(of(dataset="cifar10")))
    expected = {
        k: v for k, v in paper["datasets"]["cifar10"].items() if k not in ("steps", "val_every")
    }
    assert spec == expected and "source" in spec


def test_downloads_get_the_registrys_url_and_digest(paper: dict[str, Any]) -> None:
    jobs = DatasetJobs(paper)
    assert jobs.download_url(of(file=CIFAR10)) == registry.FILES[CIFAR10].url
    assert jobs.download_checksum(of(file=CIFAR10)) == f"md5:{registry.FILES[CIFAR10].md5}"


def test_a_mirror_and_a_checksum_override_reach_the_download(paper: dict[str, Any]) -> None:
    paper["datasets"]["cifar10"].update(url=MIRROR, checksums={CIFAR10: SHA256})
    jobs = DatasetJobs(paper)
    assert jobs.download_url(of(file=CIFAR10)) == MIRROR
    assert jobs.download_checksum(of(file=CIFAR10)) == SHA256


def test_only_registry_files_are_downloaded(paper: dict[str, Any]) -> None:
    pattern = re.compile(DatasetJobs(paper).registry_files)
    assert all(pattern.fullmatch(name) for name in registry.FILES)
    assert not pattern.fullmatch("cifar-10-python.tar") and not pattern.fullmatch("other.zip")


def test_a_dataset_sourced_reference_reads_its_prepared_dataset(demo: dict[str, Any]) -> None:
    jobs = DatasetJobs(demo)
    assert jobs.reference_file() == "resources/demo/reference/demo_reference.parquet"
    folder = "resources/demo/datasets/demo-reference"
    assert jobs.reference_input(of(reference="demo_reference")) == [folder]
    assert jobs.reference_dataset_dir(of(), Namedlist([folder])) == folder


def test_an_imagenet_reference_reads_no_prepared_dataset(paper: dict[str, Any]) -> None:
    jobs = DatasetJobs(paper)
    assert jobs.reference_file() == "resources/reference/imagenet_val.parquet"
    assert jobs.reference_input(of()) == []
    assert jobs.reference_dataset_dir(of(), Namedlist([])) == ""


def test_the_environment_names_imagenet_before_the_config(
    paper: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(IMAGENET_ENV, raising=False)
    jobs = DatasetJobs(paper)
    assert jobs.imagenet(of()) == ""
    paper["paths"]["imagenet"] = "/data/imagenet"
    assert jobs.imagenet(of()) == "/data/imagenet"
    monkeypatch.setenv(IMAGENET_ENV, "/fast/imagenet")
    assert jobs.imagenet(of()) == "/fast/imagenet"


def test_a_jobs_dataset_is_its_prepared_folder(demo: dict[str, Any]) -> None:
    assert (
        DatasetJobs(demo).dataset(of(dataset="demo-blobs")) == "resources/demo/datasets/demo-blobs"
    )


def test_text_jobs_read_the_configured_files(paper: dict[str, Any]) -> None:
    """A text dataset's file is read where its entry names it; the text stages cut text as the
    reference's entry says (its defaults where it says nothing)."""
    paper["datasets"]["wiki"] = text_dataset("/t/wiki.txt", tokenizer="bytes")
    paper["datasets"]["code"] = text_dataset("/t/code.txt", sequence_length=64)
    paper["text_plasticity"].update(reference="wiki", datasets=["code"])
    jobs = DatasetJobs(paper)
    assert jobs.text_reference(of(dataset="code")) == "/t/wiki.txt"
    assert jobs.dataset(of(dataset="code")) == "/t/code.txt"
    assert jobs.reference_sequences() == {"tokenizer": "bytes", "sequence_length": 128}
