"""vitplasticity.workflow.experiments: which experiments the Wilcoxon tests, the optimizer
figure and the criteria take, from the demo's config and edits of it."""

from __future__ import annotations

from typing import Any

from tests.helpers.configs import Configure
from vitplasticity.workflow.experiments import (
    compared_optimizers,
    criteria_experiments,
    experiment_cells,
    measured_cells,
    stats_experiments,
)


def test_the_demos_experiments_are_all_tested_and_compared(demo: dict[str, Any]) -> None:
    assert stats_experiments(demo) == ["sgd", "adam"]
    assert compared_optimizers(demo) == ["sgd", "adam"]


def test_an_experiment_without_the_reference_or_without_others_is_not_tested(
    demo: dict[str, Any],
) -> None:
    reference = demo["report"]["reference_component"]
    demo["experiments"]["sgd"]["configurations"] = [reference]
    demo["experiments"]["adam"]["configurations"] = [c for c in ("mha", "fc1") if c != reference]
    assert stats_experiments(demo) == []


def test_the_optimizers_are_compared_only_when_both_are_enabled(demo_with: Configure) -> None:
    assert compared_optimizers(demo_with({"experiments": {"adam": {"enabled": False}}})) == []
    assert compared_optimizers(demo_with({"report": {"optimizer_comparison": ["sgd"]}})) == []


def test_cells_are_models_by_datasets(demo: dict[str, Any]) -> None:
    demo["experiments"]["sgd"].update(models=["a", "b"], datasets=["x", "y"])
    assert experiment_cells(demo, "sgd") == [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]


def test_measured_cells_are_those_of_the_plasticity_grid(demo: dict[str, Any]) -> None:
    demo["plasticity"]["datasets"] = ["demo-blobs"]
    assert measured_cells(demo, "adam") == [("demo_vit", "demo-blobs")]
    demo["plasticity"]["models"] = []
    assert measured_cells(demo, "adam") == []


def test_criteria_score_nothing_unless_enabled_or_recommend_is(demo_with: Configure) -> None:
    off = {"recommend": {"enabled": False}, "report": {"criteria": {"enabled": False}}}
    assert criteria_experiments(demo_with(off)) == []
    # The demo enables recommend, which turns the criteria on.
    assert criteria_experiments(demo_with({})) == ["sgd", "adam"]


def test_criteria_score_enabled_experiments_that_have_a_criterion(demo_with: Configure) -> None:
    only_criteria = {"recommend": {"enabled": False}, "report": {"criteria": {"enabled": True}}}
    config = demo_with(
        {**only_criteria, "experiments": {"sgd": {"enabled": False}}, "plasticity": {"models": []}}
    )
    assert criteria_experiments(config) == ["adam"]  # the parameter counts score it
    config["report"]["criteria"]["parameters"] = False
    assert criteria_experiments(config) == []  # no plasticity measured, no recommend
    config["plasticity"]["models"] = ["demo_vit"]
    assert criteria_experiments(config) == ["adam"]
