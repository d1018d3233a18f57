"""The one check of a workflow config the Snakefile calls, before any job: :func:`check_config`.

It checks what the JSON schema cannot: that every name an experiment or stage uses is
defined, that grids are not empty, that a dataset's ``url``/``archive``/``checksums`` fit its
files, and (:mod:`vitplasticity.workflow.checks`) what only values together or the files they
name can tell; then each stage's own block: the time cap
(:mod:`vitplasticity.workflow.time_cap`) and the budgeted verification
(:mod:`vitplasticity.workflow.verify_jobs`). Its own module, above those it calls: they read
the config through :mod:`vitplasticity.workflow.config`, which this module would otherwise
have to import back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from vitplasticity.data.sources import registry
from vitplasticity.workflow import (
    checks,
    configuration_checks,
    dataset_kinds,
    model_entries,
    refusal_checks,
)
from vitplasticity.workflow.config import ConfigError, enabled_experiments, lr_label_problems
from vitplasticity.workflow.experiments import image_experiments
from vitplasticity.workflow.recommend_jobs import recommend_cell_problems
from vitplasticity.workflow.time_cap import cap_problems
from vitplasticity.workflow.verify_jobs import verify_problems


def model_problems(config: Mapping[str, Any]) -> list[str]:
    """The model entries' problems (:func:`vitplasticity.workflow.model_entries.entry_problems`)
    with the models each stage names: images for plasticity and the image experiments, token
    ids for text plasticity (a text experiment's models:
    :func:`vitplasticity.workflow.dataset_kinds.experiment_problems`; recommend's, which takes
    both: :func:`vitplasticity.workflow.recommend_jobs.recommend_cell_problems`)."""
    image_users = {"plasticity.models": config["plasticity"]["models"]}
    for experiment in image_experiments(dict(config)):
        image_users[f"experiments.{experiment}.models"] = config["experiments"][experiment].get(
            "models", []
        )
    text_models = (config.get("text_plasticity") or {}).get("run_models") or []
    return model_entries.entry_problems(config["models"], image_users, text_models)


def text_plasticity_problems(config: Mapping[str, Any]) -> list[str]:
    """With text_plasticity.enabled true, one message per missing reference file, model list
    or dataset list, and per bounds_models entry that run_models does not name
    (:func:`model_problems` checks the models themselves)."""
    text = config.get("text_plasticity") or {}
    if not text.get("enabled"):
        return []
    problems = [
        f"text_plasticity.{key}: {what} (text_plasticity.enabled is true)"
        for key, what in (
            ("reference", "no reference dataset (a datasets: entry of source text_file)"),
            ("run_models", "no model"),
            ("datasets", "no dataset"),
        )
        if not text.get(key)
    ]
    # The bounds sit beside the model's text plasticity: a model the stage does not measure
    # would have none to compare with.
    measured = text.get("run_models") or []
    problems += [
        f"text_plasticity.bounds_models: {name!r} is not in text_plasticity.run_models "
        f"({', '.join(measured) or 'none'}): its bounds sit beside its text plasticity"
        for name in text.get("bounds_models") or []
        if name not in measured
    ]
    return problems


def recommend_problems(config: Mapping[str, Any]) -> list[str]:
    """One message per model or dataset that recommend.models or recommend.datasets names and
    the config does not define."""
    recommend = config.get("recommend") or {}
    return [
        f"recommend.{key}: unknown {kind} {name!r} (defined: {', '.join(sorted(config[key]))})"
        for key, kind in (("models", "model"), ("datasets", "dataset"))
        for name in recommend.get(key) or []
        if name not in config[key]
    ]


def criteria_problems(config: Mapping[str, Any]) -> list[str]:
    """A message naming the experiments of report.criteria.experiments that the config does
    not define."""
    criteria = (config.get("report") or {}).get("criteria") or {}
    unknown = [
        name for name in criteria.get("experiments", []) if name not in config["experiments"]
    ]
    if not unknown:
        return []
    return [
        f"report.criteria.experiments: unknown experiment(s) {', '.join(unknown)} "
        f"(defined: {', '.join(config['experiments'])})"
    ]


def _unknown(kind: str, names: list[str], known: set[str], key: str) -> list[str]:
    """One message per name of ``names`` (at ``key``) not among ``known``."""
    return [
        f"{key}: unknown {kind} {name!r} (defined: {', '.join(sorted(known))})"
        for name in names
        if name not in known
    ]


def name_problems(config: dict[str, Any]) -> list[str]:
    """One message per model, dataset or experiment field that plasticity, the reference
    set and each enabled experiment name and the config does not define (or leaves empty),
    and per pair of an experiment's learning rates that share a path label."""
    models, datasets = set(config["models"]), set(config["datasets"])
    plasticity = config["plasticity"]
    problems = _unknown("model", plasticity["models"], models, "plasticity.models")
    problems += model_problems(config)
    problems += _unknown("dataset", plasticity["datasets"], datasets, "plasticity.datasets")
    reference = config["reference"]
    if reference["source"] == "dataset" and reference.get("dataset") not in datasets:
        problems.append(
            f"reference.dataset: unknown dataset {reference.get('dataset')!r} "
            "(reference.source is 'dataset')"
        )
    for name in enabled_experiments(config):
        exp = config["experiments"][name]
        key = f"experiments.{name}"
        for field in ("optimizer", "models", "datasets", "configurations", "lrs", "seeds"):
            if field not in exp:
                problems.append(f"{key}.{field}: missing")
            elif isinstance(exp[field], list) and not exp[field]:
                problems.append(f"{key}.{field}: empty grid")
        problems += _unknown("model", exp.get("models", []), models, f"{key}.models")
        problems += _unknown("dataset", exp.get("datasets", []), datasets, f"{key}.datasets")
        by_dataset = list(exp.get("lrs_by_dataset") or {})
        problems += _unknown("dataset", by_dataset, datasets, f"{key}.lrs_by_dataset")
        if "lrs" in exp:
            problems += lr_label_problems(config, name)
    return problems


def config_problems(
    config: dict[str, Any],
    build_models: bool = False,
    models_cache: str | os.PathLike[str] | None = None,
) -> list[str]:
    """Every problem of the config's names, grids, dataset file overrides and local files
    (:func:`check_config`'s first check), each naming its key and what to write instead."""
    problems = checks.path_problems(config) + name_problems(config)
    experiments = enabled_experiments(config)
    problems += checks.grid_problems(config, experiments)
    problems += configuration_checks.configuration_problems(config, experiments)
    problems += checks.seed_problems(config)
    problems += checks.report_problems(config, experiments)
    problems += checks.finetune_problems(config)
    problems += checks.device_problems(config)
    problems += model_entries.weights_path_problems(config["models"])
    problems += checks.pair_problems(config)
    problems += checks.split_problems(config)
    file_problems = [
        problem
        for name, spec in config["datasets"].items()
        for problem in registry.entry_problems(name, spec)
    ]
    # Only valid overrides can be compared across the datasets that share a download.
    problems += file_problems or registry.shared_download_problems(config["datasets"])
    problems += text_plasticity_problems(config)
    problems += dataset_kinds.text_dataset_problems(config)
    problems += dataset_kinds.experiment_problems(config)
    problems += checks.input_file_problems(config)
    problems += recommend_problems(config)
    problems += recommend_cell_problems(config)
    problems += checks.recommend_input_problems(config)
    problems += criteria_problems(config)
    problems += refusal_checks.refusal_problems(config)
    for name, spec in config["datasets"].items():
        problems += checks.image_folder_problems(name, spec)
        if not file_problems:
            problems += checks.archive_problems(name, spec)
    if build_models:
        problems += checks.model_kwargs_problems(config["models"], models_cache)
    return problems


def check_config(
    config: dict[str, Any],
    build_models: bool = False,
    models_cache: str | os.PathLike[str] | None = None,
) -> None:
    """Check what the schema cannot, before any job: :func:`config_problems`, then the time
    cap and the verification, each stage's problems raised with its own
    message, in that order (the order of the rule files that checked them before).

    Args:
        config: the merged config (with the schema's defaults filled in, or not).
        build_models: also build every timm model with ``kwargs`` on the meta device (imports
            torch and timm: the main Snakemake process only, not each cluster job).
        models_cache: with ``build_models``, a JSON file recording the models built before,
            which are not built again (:func:`checks.model_kwargs_problems`).

    Raises:
        ConfigError: listing every problem of the first check that finds any, each naming
            its key and what to write instead.
    """
    problems = config_problems(config, build_models, models_cache)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
    # scheduler.max_runtime_minutes: its problem is one message of its own.
    problems = cap_problems(config)
    if problems:
        raise ConfigError("\n".join(problems))
    problems = verify_problems(config)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
