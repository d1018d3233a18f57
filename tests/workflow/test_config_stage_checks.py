"""The stage blocks' cross-checks of config.check_config (text_plasticity, recommend,
report.criteria): each bad block named by its key, every problem in one ConfigError, at parse
time, so that the workflow's rules only look values up."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from snakemake.utils import validate

from tests.helpers.repo import REPO
from tests.helpers.text_entries import text_dataset
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config

SCHEMA = str(REPO / "workflow/schemas/config.schema.yaml")
TINY_TEXT_MODEL = {
    "family": "transformers",
    "hf_id": "tiny-gpt2",
    "weights": "random",
    "config": {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 256},
}


def paper_with(**blocks: Any) -> dict:
    """config.yaml with ``blocks`` replacing its top-level blocks, the schema's defaults in."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    config.update(copy.deepcopy(blocks))
    validate(config, SCHEMA)
    return config


def problems_of(config: dict) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        check_config(config)
    return str(raised.value).splitlines()[1:]


def test_the_paper_config_passes() -> None:
    check_config(paper_with())


def test_enabled_text_plasticity_needs_a_reference_models_and_datasets(tmp_path: Path) -> None:
    config = paper_with(text_plasticity={"enabled": True})
    assert [line.strip() for line in problems_of(config)] == [
        "text_plasticity.reference: no reference dataset (a datasets: entry of source "
        "text_file) (text_plasticity.enabled is true)",
        "text_plasticity.run_models: no model (text_plasticity.enabled is true)",
        "text_plasticity.datasets: no dataset (text_plasticity.enabled is true)",
    ]
    # Disabled, the same empty block is fine; enabled and complete (its files exist), too.
    check_config(paper_with(text_plasticity={"enabled": False}))
    for name in ("ref.txt", "news.txt"):
        (tmp_path / name).write_text("a document\n")
    config = paper_with(
        text_plasticity={
            "enabled": True,
            "reference": "ref",
            "run_models": ["tiny"],
            "datasets": ["news"],
        }
    )
    config["models"]["tiny"] = TINY_TEXT_MODEL
    for name in ("ref", "news"):
        config["datasets"][name] = text_dataset(tmp_path / f"{name}.txt")
    check_config(config)
    # The text bounds sit beside the model's text plasticity: bounds_models within run_models.
    config["text_plasticity"]["bounds_models"] = ["tiny"]
    check_config(config)
    config["text_plasticity"]["bounds_models"] = ["tiny", "gpt2_large"]
    assert [line.strip() for line in problems_of(config)] == [
        "text_plasticity.bounds_models: 'gpt2_large' is not in text_plasticity.run_models "
        "(tiny): its bounds sit beside its text plasticity"
    ]


def test_recommend_names_only_defined_models_and_datasets() -> None:
    config = paper_with(
        recommend={"enabled": True, "models": ["vit_base", "vit_gigantic"], "datasets": ["mnist"]}
    )
    found = problems_of(config)
    assert len(found) == 2
    assert found[0].strip().startswith("recommend.models: unknown model 'vit_gigantic' (defined: ")
    assert found[1].strip().startswith("recommend.datasets: unknown dataset 'mnist' (defined: ")
    check_config(paper_with(recommend={"enabled": True, "models": ["vit_base"]}))


def test_criteria_names_only_defined_experiments() -> None:
    config = paper_with()
    config["report"]["criteria"]["experiments"] = ["sgd", "lion", "muon"]
    (found,) = problems_of(config)
    assert found.strip().startswith(
        "report.criteria.experiments: unknown experiment(s) lion, muon (defined: sgd, "
    )


def test_every_problem_of_every_block_at_once() -> None:
    config = paper_with(text_plasticity={"enabled": True}, recommend={"datasets": ["mnist"]})
    config["report"]["criteria"]["experiments"] = ["lion"]
    keys = [line.strip().split(":")[0] for line in problems_of(config)]
    assert keys == [
        "text_plasticity.reference",
        "text_plasticity.run_models",
        "text_plasticity.datasets",
        "recommend.datasets",
        "report.criteria.experiments",
    ]
