"""vitplasticity.workflow.recommend_jobs: the recommend rules' params, whose null settings
take the measuring stage's, on the demo's config."""

from __future__ import annotations

from typing import Any

from snakemake.iocontainers import Wildcards

from tests.helpers.text_entries import text_dataset
from vitplasticity.recommend.settings import RecommendImageSettings, RecommendTextSettings
from vitplasticity.settings.declaration import rule_params
from vitplasticity.workflow.recommend_jobs import (
    recommend_params,
    recommend_text_n_pairs,
    recommend_text_params,
    recommend_value,
)


def test_null_recommend_keys_take_the_plasticity_blocks(demo: dict[str, Any]) -> None:
    assert demo["recommend"]["models"] is None and demo["recommend"]["n_pairs"] is None
    assert recommend_value(demo, "models") == demo["plasticity"]["models"]
    assert recommend_value(demo, "n_pairs") == demo["plasticity"]["n_pairs"]
    assert recommend_text_n_pairs(demo) == demo["text_plasticity"]["n_pairs"]
    assert demo["plasticity"]["n_pairs"] != demo["text_plasticity"]["n_pairs"]


def test_recommends_own_values_win(demo: dict[str, Any]) -> None:
    demo["recommend"].update(n_pairs=7, datasets=["demo-blobs"])
    assert recommend_value(demo, "n_pairs") == recommend_text_n_pairs(demo) == 7
    assert recommend_value(demo, "datasets") == ["demo-blobs"]


def test_the_image_recommend_measures_the_plasticity_pairs(demo: dict[str, Any]) -> None:
    params = recommend_params(demo, RecommendImageSettings)
    block = rule_params(RecommendImageSettings, demo["recommend"], "recommend")
    n_pairs = params.pop("n_pairs")
    assert params == {**{k: v for k, v in block.items() if k != "n_pairs"}, "demo_flag": "--demo"}
    assert n_pairs(Wildcards(fromdict={"dataset": "demo-stripes"})) == demo["plasticity"]["n_pairs"]


def test_the_text_recommend_cuts_text_as_text_plasticity_does(demo: dict[str, Any]) -> None:
    demo["datasets"]["wiki"] = text_dataset("wiki.txt", sequence_length=64, tokenizer="bytes")
    demo["text_plasticity"].update(reference="wiki")
    params = recommend_text_params(demo, RecommendTextSettings)
    assert (params["sequence_length"], params["tokenizer"]) == (64, "bytes")
    assert params["n_pairs"] == demo["text_plasticity"]["n_pairs"]
    assert params["batch_size"] == demo["recommend"]["batch_size"]
    assert params["demo_flag"] == "--demo"
