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
from vitplasticity.workflow.recommend_jobs import recommend_cells


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


def recommended_cells(config: dict[str, Any], experiment: str) -> list[tuple[str, str]]:
    """The cells of ``experiment`` whose recommend tables (``recommend/<model>/<dataset>``)
    the criteria check reads: none unless recommend.enabled; an image experiment's every
    cell; a labelled-text experiment's those recommend ranks (:func:`.recommend_cells`: only
    those have their reference text checked at parse time, so only those have a job that can
    run). A text-file experiment reads recommend --text's tables instead
    (:meth:`.results.ResultFiles.criteria_recommend`): none of recommend's."""
    if not config["recommend"]["enabled"]:
        return []
    kind = experiment_kind(config, experiment)
    cells = experiment_cells(config, experiment)
    if kind == IMAGES:
        return cells
    if kind == LABELLED_SOURCE:
        ranked = set(recommend_cells(config))
        return [cell for cell in cells if cell in ranked]
    return []


def criteria_experiments(config: dict[str, Any]) -> list[str]:
    """The classification experiments the criteria score: none unless report.criteria.enabled
    or recommend.enabled; else those of report.criteria.experiments that are enabled and have a
    criterion to score (the parameter counts, recommend's tables of some of their cells,
    :func:`recommended_cells`, or measured plasticity). A labelled-text experiment has no
    measured plasticity: it is scored by recommend's tables where recommend ranks its cells on
    the labelled text, else by the parameter counts alone, or not at all."""
    criteria = config["report"]["criteria"]
    if not (criteria["enabled"] or config["recommend"]["enabled"]):
        return []
    enabled = set(classification_experiments(config))

    def scored(name: str) -> bool:
        return bool(
            criteria["parameters"]
            or recommended_cells(config, name)
            or measured_cells(config, name)
        )

    return [name for name in criteria["experiments"] if name in enabled and scored(name)]
