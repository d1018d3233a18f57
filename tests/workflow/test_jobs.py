"""vitplasticity.workflow.jobs: the weights files a compute job reads and the model spec JSON
on its command line, per family, on the paper's config and small edits of it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from snakemake.iocontainers import Wildcards

from vitplasticity.models.spec import FAMILIES
from vitplasticity.models.weights import RECORD_FILENAME
from vitplasticity.workflow.jobs import ModelJobs, names_pattern

GPT2 = {"family": "transformers", "hf_id": "gpt2", "revision": "v1", "weights": "hub"}


def of(**wildcards: str) -> Wildcards:
    return Wildcards(fromdict=wildcards)


@pytest.fixture
def jobs(paper: dict[str, Any]) -> ModelJobs:
    paper["models"]["gpt2"] = GPT2
    return ModelJobs(paper)


def test_a_timm_hub_models_jobs_read_its_file_and_record(jobs: ModelJobs) -> None:
    assert jobs.weights(of(model="vit_base")) == [
        "resources/weights/vit_base/model.safetensors",
        "resources/weights/vit_base/weights.json",
    ]


def test_a_transformers_hub_models_jobs_read_its_record_only(jobs: ModelJobs) -> None:
    """The record is written last and lists the snapshot's files: the folder's sentinel."""
    assert jobs.weights_files("gpt2") == ["resources/weights/gpt2/weights.json"]


def test_random_and_local_weights_are_no_input(paper: dict[str, Any]) -> None:
    paper["models"]["vit_base"]["weights"] = "random"
    paper["models"]["vit_large"]["weights"] = "/data/vit_large.safetensors"
    jobs = ModelJobs(paper)
    assert jobs.weights_files("vit_base") == jobs.weights_files("vit_large") == []


def test_local_weights_jobs_read_their_checksum_record(paper: dict[str, Any], tmp_path) -> None:
    """The record, brought up to date when the input function runs, stands for the file."""
    local = tmp_path / "vit_large.safetensors"
    local.write_bytes(b"weights")
    paper["models"]["vit_large"]["weights"] = str(local)
    paper["paths"]["resources"] = str(tmp_path / "resources")
    record = tmp_path / "resources/weights/vit_large/local.sha256.json"
    assert ModelJobs(paper).weights(of(model="vit_large")) == [str(record)]
    assert json.loads(record.read_text())["files"][0]["size"] == len(b"weights")


def test_the_paper_vit_b_spec_is_the_timm_only_layouts(jobs: ModelJobs) -> None:
    """Byte for byte the spec the paper's commands carried before families existed: no
    `family`, no `revision`, the local weights file, keys sorted."""
    assert jobs.spec(of(model="vit_base")) == (
        '{"crop_pct": 1.0, "init_seed": 0, "kwargs": {}, "normalize": "imagenet", '
        '"timm_id": "vit_base_patch16_224.orig_in21k", '
        '"weights": "resources/weights/vit_base/model.safetensors"}'
    )


def test_a_transformers_spec_keeps_its_family_and_names_the_snapshot_folder(
    jobs: ModelJobs,
) -> None:
    assert json.loads(jobs.compute_spec("gpt2")) == {
        "family": "transformers",
        "hf_id": "gpt2",
        "weights": "resources/weights/gpt2",
    }


def test_a_random_models_spec_keeps_its_weights_value(demo: dict[str, Any]) -> None:
    spec = json.loads(ModelJobs(demo).compute_spec("demo_vit"))
    assert spec["weights"] == "random" and "family" not in spec and "revision" not in spec
    assert spec["kwargs"] == demo["models"]["demo_vit"]["kwargs"]


def test_weights_live_below_the_configured_resources(paper: dict[str, Any]) -> None:
    paper["paths"]["resources"] = "/scratch/res"
    assert (
        ModelJobs(paper).weights_files("vit_huge")[0]
        == "/scratch/res/weights/vit_huge/model.safetensors"
    )


def test_family_patterns_match_exactly_the_familys_models(jobs: ModelJobs) -> None:
    timm = re.compile(jobs.of_family("timm"))
    assert all(timm.fullmatch(name) for name in ("vit_base", "vit_large", "dinov3_base"))
    assert not timm.fullmatch("gpt2") and not timm.fullmatch("vit_base2")
    assert re.compile(jobs.of_family("transformers")).fullmatch("gpt2")


def test_a_pattern_of_no_names_matches_nothing() -> None:
    assert not re.compile(names_pattern([])).fullmatch("")
    assert re.compile(names_pattern(["a.b"])).fullmatch("a.b")
    assert not re.compile(names_pattern(["a.b"])).fullmatch("axb")


def test_source_kwargs_are_those_that_decide_where_weights_come_from(paper: dict[str, Any]) -> None:
    paper["models"]["vit_base"]["kwargs"] = {
        "pretrained_cfg_overlay": {"file": "x"},
        "drop_rate": 0.1,
    }
    jobs = ModelJobs(paper)
    assert jobs.source_kwargs(of(model="vit_base")) == '{"pretrained_cfg_overlay": {"file": "x"}}'
    assert jobs.source_kwargs(of(model="vit_large")) == "{}"


def test_entry_values_are_the_models_keys(jobs: ModelJobs) -> None:
    assert jobs.entry_value("revision")(of(model="gpt2")) == "v1"
    assert jobs.entry_value("timm_id")(of(model="vit_huge")) == "vit_huge_patch14_224.orig_in21k"


def test_every_familys_weights_stage_ends_with_its_record() -> None:
    """The record is written last: a compute job that reads it reads a complete folder."""
    assert all(spec.weights_stage_files[-1] == RECORD_FILENAME for spec in FAMILIES.values())
