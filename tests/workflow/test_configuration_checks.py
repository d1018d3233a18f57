"""Two configurations are refused as duplicates exactly when they train the same parameters:
the parse-time rule (plain strings, no torch) against the parameters a tiny timm ViT trains
for each (vitplasticity.models.architectures.ParameterMap.trained_names)."""

from __future__ import annotations

from itertools import combinations

from tests.helpers.tiny_vit import TINY_SPEC
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.workflow.configuration_checks import trained_parts

SPELLINGS = [
    "full", "emb", "ln1", "mha", "ln2", "fc1", "fc2", "head",
    "mha+fc1", "fc1+mha", "mha+mha", "mha+head", "head+head", "full+fc1", "emb+full",
    "ln1+ln2", "ln2+ln1+ln2", "fc1+fc2+mha",
]  # fmt: skip


def test_the_same_parts_exactly_when_the_same_parameters() -> None:
    parameters = parameter_map(build_model(TINY_SPEC, num_classes=4))
    for a, b in combinations(SPELLINGS, 2):
        same = parameters.trained_names(a) == parameters.trained_names(b)
        assert (trained_parts(a) == trained_parts(b)) == same, (a, b)
