"""The criteria's registry (vitplasticity.criteria) is the one list of criteria: the config
schema's ``recommend.criterion`` enum restates it (a YAML file cannot import it), and an entry
that contradicts itself is refused when the registry is built."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers.repo import REPO
from vitplasticity.criteria import (
    LOWER_FIRST,
    NA_FOR_NORMS,
    RECOMMEND_CRITERIA,
    REGISTRY,
    Criterion,
    Items,
    short_label,
)
from vitplasticity.recommend.settings import RecommendImageSettings, RecommendTextSettings
from vitplasticity.settings.declaration import setting_fields

SCHEMA_PATH = REPO / "workflow/schemas/config.schema.yaml"


def test_the_schemas_criterion_enum_is_the_registrys_recommend_criteria() -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    criterion = schema["properties"]["recommend"]["properties"]["criterion"]
    assert criterion["enum"] == list(RECOMMEND_CRITERIA), (
        f"{SCHEMA_PATH.relative_to(REPO)}: recommend.criterion's enum must list "
        f"vitplasticity.criteria.RECOMMEND_CRITERIA in order: {list(RECOMMEND_CRITERIA)}"
    )
    assert criterion["default"] in RECOMMEND_CRITERIA


def test_both_recommends_offer_the_registrys_criteria() -> None:
    for settings in (RecommendImageSettings, RecommendTextSettings):
        choices = {f.name: declared.choices for f, declared, _ in setting_fields(settings)}
        assert choices["criterion"] == RECOMMEND_CRITERIA


def test_derived_views_follow_the_entries() -> None:
    assert tuple(n for n, e in REGISTRY.items() if e.items is not None) == RECOMMEND_CRITERIA
    assert {"nfn", "kappa"} == LOWER_FIRST
    assert {"nfn", "spectrum_snr", "kappa"} == NA_FOR_NORMS
    assert all(name == entry.name for name, entry in REGISTRY.items())
    assert short_label("weight_spectral") == "Spectral"
    assert short_label("plasticity_some_protocol") == "plasticity_some_protocol"


def test_an_entry_that_contradicts_itself_is_refused() -> None:
    with pytest.raises(ValueError, match="'x': source 'elsewhere' not one of"):
        Criterion("x", "x", "x", "elsewhere")
    with pytest.raises(ValueError, match="'x': recommend's criteria"):
        Criterion("x", "x", "x", "recommend")  # measured by recommend, but no items
    with pytest.raises(ValueError, match="'x': recommend's criteria"):
        Criterion("x", "x", "x", "plasticity", items=Items("pairs", "ratio"))
    with pytest.raises(ValueError, match=r"'x': recommend's criteria .* state their basis"):
        Criterion("x", "x", "x", "recommend", items=Items("pairs", "ratio"))  # no basis
    with pytest.raises(ValueError, match=r"'x': recommend's criteria .* state their basis"):
        Criterion("x", "x", "x", "plasticity", basis="a heuristic")
