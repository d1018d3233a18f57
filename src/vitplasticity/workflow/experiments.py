"""Which experiments the report's statistics, optimizer figure and criteria score, and the
(model, dataset) cells an experiment covers: decisions over the config alone.

An experiment finetunes image models on image datasets or text models on text datasets
(``source: text_file``; check_config refuses a mix, naming both). Its runs are the same jobs
either way; what differs is how they are read: an image experiment's by the accuracy report
(aggregation, tables, figures, Wilcoxon tests, the criteria), a text experiment's by the text
criteria check, which selects by the lowest validation loss (a language-modelling loss has no
test accuracy)."""

from __future__ import annotations

from typing import Any

from vitplasticity.workflow.config import enabled_experiments
from vitplasticity.workflow.dataset_kinds import is_text_dataset


def is_text_experiment(config: dict[str, Any], name: str) -> bool:
    """Whether experiment ``name`` finetunes on text datasets (all of its datasets are one
    kind: check_config)."""
    datasets = config.get("datasets") or {}
    named = config["experiments"][name].get("datasets") or []
    return any(is_text_dataset(datasets.get(d)) for d in named)


def image_experiments(config: dict[str, Any]) -> list[str]:
    """The enabled experiments on image datasets: the accuracy report's."""
    return [name for name in enabled_experiments(config) if not is_text_experiment(config, name)]


def text_experiments(config: dict[str, Any]) -> list[str]:
    """The enabled experiments on text datasets: the text criteria check's."""
    return [name for name in enabled_experiments(config) if is_text_experiment(config, name)]


def stats_experiments(config: dict[str, Any]) -> list[str]:
    """Enabled experiments that have the reference configuration and other ones to test
    (``report.reference_component``): the Wilcoxon tests' experiments."""
    reference = config["report"]["reference_component"]
    return [
        name
        for name in image_experiments(config)
        if reference in config["experiments"][name]["configurations"]
        and len(config["experiments"][name]["configurations"]) > 1
    ]


def compared_optimizers(config: dict[str, Any]) -> list[str]:
    """The two enabled image experiments of ``report.optimizer_comparison``, or [] when not
    both are."""
    names = config["report"]["optimizer_comparison"]
    enabled = set(image_experiments(config))
    return names if len(names) == 2 and all(n in enabled for n in names) else []


def experiment_cells(config: dict[str, Any], experiment: str) -> list[tuple[str, str]]:
    """The (model, dataset) cells of ``experiment``, models first."""
    exp = config["experiments"][experiment]
    return [(model, dataset) for model in exp["models"] for dataset in exp["datasets"]]


def measured_cells(config: dict[str, Any], experiment: str) -> list[tuple[str, str]]:
    """The cells of ``experiment`` whose plasticity the plasticity grid measures (a text
    experiment's: text plasticity, when enabled)."""
    p = config["plasticity"]
    if is_text_experiment(config, experiment):
        text = config["text_plasticity"]
        if not text["enabled"]:
            return []
        p = {"models": text["run_models"], "datasets": text["datasets"]}
    return [
        (model, dataset)
        for model, dataset in experiment_cells(config, experiment)
        if model in p["models"] and dataset in p["datasets"]
    ]


def criteria_experiments(config: dict[str, Any]) -> list[str]:
    """The image experiments the criteria score: none unless report.criteria.enabled or
    recommend.enabled; else those of report.criteria.experiments that are enabled and have a
    criterion to score (the parameter counts, recommend's tables, or measured plasticity)."""
    criteria = config["report"]["criteria"]
    recommend = config["recommend"]["enabled"]
    if not (criteria["enabled"] or recommend):
        return []
    enabled = set(image_experiments(config))
    return [
        name
        for name in criteria["experiments"]
        if name in enabled and (criteria["parameters"] or recommend or measured_cells(config, name))
    ]
