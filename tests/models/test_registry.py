"""The family registry and what config parsing accepts agree: the torch-free model types the
Snakefile reads are the registered architectures' own, and every family the schema offers is
a registered spec class."""

from __future__ import annotations

from collections import defaultdict

from tests.helpers.configs import SCHEMA
from vitplasticity.models.architectures import ARCHITECTURES
from vitplasticity.models.registry import model_id_keys
from vitplasticity.models.spec import FAMILIES, TRANSFORMERS_MODEL_TYPES, HFModelSpec, ModelSpec
from vitplasticity.workflow.config import load_schema
from vitplasticity.workflow.model_entries import model_inputs


def test_the_parse_time_model_types_are_the_architectures_own() -> None:
    declared: dict[str, set[str]] = defaultdict(set)
    for architecture in ARCHITECTURES.values():
        declared[architecture.inputs].update(architecture.model_types)
    assert {inputs: set(types) for inputs, types in TRANSFORMERS_MODEL_TYPES.items()} == declared


def test_config_parsing_tells_each_model_type_by_its_architecture() -> None:
    for architecture in ARCHITECTURES.values():
        for model_type in architecture.model_types:
            entry = {"family": "transformers", "config": {"model_type": model_type}}
            assert model_inputs(entry) == architecture.inputs, (architecture.name, model_type)
    assert model_inputs({"family": "transformers", "config": {"model_type": "deberta"}}) is None
    assert model_inputs({"family": "timm", "timm_id": "vit_base_patch16_224"}) == "images"


def test_the_schemas_families_are_the_registered_ones() -> None:
    entry = load_schema(SCHEMA)["properties"]["models"]["additionalProperties"]
    assert set(entry["properties"]["family"]["enum"]) == set(FAMILIES) == set(model_id_keys())
    assert FAMILIES["transformers"] is HFModelSpec
    for family, spec in FAMILIES.items():
        assert issubclass(spec, ModelSpec) and spec.family == family
        assert spec.builder and spec.preprocessor, family
