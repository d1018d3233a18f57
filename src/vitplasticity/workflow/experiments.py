"""Which experiments the report's statistics, optimizer figure and criteria score, and the
(model, dataset) cells an experiment covers: decisions over the config alone.

An experiment finetunes image models on image datasets, or text models on text files
(``source: text_file``) or on labelled text (``source: labelled_text``); check_config refuses a
mix, naming each kind's datasets. Its runs are the same jobs every way; what differs is how
they are read. A *classification* experiment (images or labelled text) trains a new head and
measures a test accuracy: the accuracy report reads it (aggregation, tables, figures, Wilcoxon
tests, the criteria). A *language-model* experiment (text files) is read by the text criteria
check, which selects by the lowest validation loss (a language-modelling loss has no test
accuracy)."""

from __future__ import annotations

from typing import Any

from vitplasticity.settings.sequences import LABELLED_SOURCE, TEXT_SOURCE
from vitplasticity.workflow.config import enabled_experiments
from vitplasticity.workflow.dataset_kinds import IMAGES, dataset_kind


def experiment_kind(config: dict[str, Any], name: str) -> str:
    """The kind of experiment ``name``'s datasets (:func:`.dataset_kinds.dataset_kind`: all of
    them are one kind, check_config); :data:`IMAGES` for an experiment of no known dataset."""
    datasets = config.get("datasets") or {}
    named = [d for d in config["experiments"][name].get("datasets") or [] if d in datasets]
    return dataset_kind(datasets[named[0]]) if named else IMAGES


def is_text_experiment(config: dict[str, Any], name: str) -> bool:
    """Whether experiment ``name`` finetunes text models, on text files or labelled text."""
    return experiment_kind(config, name) != IMAGES


def is_classification_experiment(config: dict[str, Any], name: str) -> bool:
    """Whether experiment ``name``'s runs measure a test accuracy (images or labelled text),
    which the accuracy report reads."""
    return experiment_kind(config, name) != TEXT_SOURCE


def image_experiments(config: dict[str, Any]) -> list[str]:
    """The enabled experiments on image datasets: their models are checked with the image
    stages'."""
    return [name for name in enabled_experiments(config) if not is_text_experiment(config, name)]


def classification_experiments(config: dict[str, Any]) -> list[str]:
    """The enabled experiments on image datasets or labelled text: the accuracy report's."""
    return [
        name for name in enabled_experiments(config) if is_classification_experiment(config, name)
    ]


def language_model_experiments(config: dict[str, Any]) -> list[str]:
    """The enabled experiments on text files: the text criteria check's."""
    return [
        name
        for name in enabled_experiments(config)
        if not is_classification_experiment(config, name)
    ]


def stats_experiments(config: dict[str, Any]) -> list[str]:
    """Enabled experiments that have the reference configuration and other ones to test
    (``report.reference_component``): the Wilcoxon tests' experiments."""
    reference = config["report"]["reference_component"]
    return [
        name
        for name in classification_experiments(config)
        if reference in config["experiments"][name]["configurations"]
        and len(config["experiments"][name]["configurations"]) > 1
    ]


def compared_optimizers(config: dict[str, Any]) -> list[str]:
    """The two enabled classification experiments of ``report.optimizer_comparison``, or []
    when not both are."""
    names = config["report"]["optimizer_comparison"]
    enabled = set(classification_experiments(config))
    return names if len(names) == 2 and all(n in enabled for n in names) else []


def experiment_cells(config: dict[str, Any], experiment: str) -> list[tuple[str, str]]:
    """The (model, dataset) cells of ``experiment``, models first."""
    exp = config["experiments"][experiment]
    return [(model, dataset) for model in exp["models"] for dataset in exp["datasets"]]


def measured_cells(config: dict[str, Any], experiment: str) -> list[tuple[str, str]]:
    """The cells of ``experiment`` whose plasticity the plasticity grid measures (a text
    experiment's: text plasticity, when enabled; a labelled-text experiment has none, as text
    plasticity measures text files)."""
    p = config["plasticity"]
    kind = experiment_kind(config, experiment)
    if kind == LABELLED_SOURCE:
        return []
    if kind == TEXT_SOURCE:
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
    """The classification experiments the criteria score: none unless report.criteria.enabled
    or recommend.enabled; else those of report.criteria.experiments that are enabled and have a
    criterion to score (the parameter counts, recommend's tables, or measured plasticity;
    the check reads recommend's tables of an image experiment's cells only: a labelled-text
    experiment is scored without them, though recommend may rank its cells)."""
    criteria = config["report"]["criteria"]
    recommend = config["recommend"]["enabled"]
    if not (criteria["enabled"] or recommend):
        return []
    enabled = set(classification_experiments(config))

    def scored(name: str) -> bool:
        ranked = recommend and experiment_kind(config, name) == IMAGES
        return bool(criteria["parameters"] or ranked or measured_cells(config, name))

    return [name for name in criteria["experiments"] if name in enabled and scored(name)]
