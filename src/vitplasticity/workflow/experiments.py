"""Which experiments the report's statistics, optimizer figure and criteria score, and the
(model, dataset) cells an experiment covers: decisions over the config alone."""

from __future__ import annotations

from typing import Any

from vitplasticity.workflow.config import enabled_experiments


def stats_experiments(config: dict[str, Any]) -> list[str]:
    """Enabled experiments that have the reference configuration and other ones to test
    (``report.reference_component``): the Wilcoxon tests' experiments."""
    reference = config["report"]["reference_component"]
    return [
        name
        for name in enabled_experiments(config)
        if reference in config["experiments"][name]["configurations"]
        and len(config["experiments"][name]["configurations"]) > 1
    ]


def compared_optimizers(config: dict[str, Any]) -> list[str]:
    """The two enabled experiments of ``report.optimizer_comparison``, or [] when not both are."""
    names = config["report"]["optimizer_comparison"]
    enabled = set(enabled_experiments(config))
    return names if len(names) == 2 and all(n in enabled for n in names) else []


def experiment_cells(config: dict[str, Any], experiment: str) -> list[tuple[str, str]]:
    """The (model, dataset) cells of ``experiment``, models first."""
    exp = config["experiments"][experiment]
    return [(model, dataset) for model in exp["models"] for dataset in exp["datasets"]]


def measured_cells(config: dict[str, Any], experiment: str) -> list[tuple[str, str]]:
    """The cells of ``experiment`` whose plasticity the plasticity grid measures."""
    p = config["plasticity"]
    return [
        (model, dataset)
        for model, dataset in experiment_cells(config, experiment)
        if model in p["models"] and dataset in p["datasets"]
    ]


def criteria_experiments(config: dict[str, Any]) -> list[str]:
    """The experiments the criteria score: none unless report.criteria.enabled or
    recommend.enabled; else those of report.criteria.experiments that are enabled and have a
    criterion to score (the parameter counts, recommend's tables, or measured plasticity)."""
    criteria = config["report"]["criteria"]
    recommend = config["recommend"]["enabled"]
    if not (criteria["enabled"] or recommend):
        return []
    enabled = set(enabled_experiments(config))
    return [
        name
        for name in criteria["experiments"]
        if name in enabled and (criteria["parameters"] or recommend or measured_cells(config, name))
    ]
