"""vitplasticity.workflow.params: canonical JSON, the demo switch, a stage's settings as
params, and the folders and prefixes taken from a job's outputs."""

from __future__ import annotations

from typing import Any

from snakemake.iocontainers import Namedlist, Wildcards

from vitplasticity.plasticity.settings import PlasticitySettings
from vitplasticity.report.settings import CriteriaSettings
from vitplasticity.settings.declaration import rule_params
from vitplasticity.workflow.params import (
    as_json,
    config_block,
    demo_flag,
    output_folder,
    output_prefix,
    stage_params,
)


def test_json_params_are_canonical() -> None:
    """Snakemake compares params as strings: key order must not rerun a job."""
    assert (
        as_json({"b": 1, "a": [1, 2]}) == as_json({"a": [1, 2], "b": 1}) == '{"a": [1, 2], "b": 1}'
    )


def test_the_demo_switch(demo: dict[str, Any], paper: dict[str, Any]) -> None:
    assert (demo_flag(demo), demo_flag(paper)) == ("--demo", "")


def test_stage_params_are_the_blocks_settings_and_the_demo_switch(demo: dict[str, Any]) -> None:
    params = stage_params(demo, CriteriaSettings, "report.criteria")
    block = rule_params(CriteriaSettings, demo["report"]["criteria"], "report.criteria")
    assert params == {**block, "demo_flag": "--demo"}
    assert config_block(demo, "report.criteria") is demo["report"]["criteria"]
    assert stage_params(demo, PlasticitySettings, "plasticity")["demo_flag"] == "--demo"


def test_output_folders_and_prefixes() -> None:
    output = Namedlist(
        fromdict={"table": "r/recommend/m/d.parquet", "weights": "w/m/model.safetensors"}
    )
    job = Wildcards(fromdict={})
    assert output_folder("weights")(job, output) == "w/m"
    assert output_prefix("table", ".parquet")(job, output) == "r/recommend/m/d"
