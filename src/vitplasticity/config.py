"""Cross-checks and the run grid of a workflow config (plain Python: no torch import, so the
Snakefile can use it on every node cheaply).

The JSON schema checks types and ranges; this module checks what a schema cannot: that every
name an experiment uses is defined, that grids are not empty, and it expands an experiment
into its runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

IMAGENET_ENV = "VITPLASTICITY_IMAGENET"
IMAGENET_LAYOUTS = (
    "a folder val/<wnid>/*.JPEG (or the val folder itself)",
    "the official ILSVRC2012_img_val.tar with ILSVRC2012_devkit_t12.tar.gz beside it",
    "the HF-hosted val_images.tar.gz",
)


class ConfigError(ValueError):
    """A config that names something undefined or asks for an empty grid."""


def lr_label(lr: float) -> str:
    """The learning rate as it appears in paths: ``f"{lr:g}"`` (0.001, 3e-05)."""
    return f"{float(lr):g}"


@dataclass(frozen=True)
class Run:
    """One single-component finetuning run of an experiment."""

    experiment: str
    model: str
    dataset: str
    configuration: str
    lr: float
    seed: int

    @property
    def directory(self) -> str:
        """The run's directory below ``<results>/finetune/``."""
        return (
            f"{self.experiment}/{self.model}/{self.dataset}/{self.configuration}/"
            f"lr{lr_label(self.lr)}_seed{self.seed}"
        )


def enabled_experiments(config: dict[str, Any]) -> list[str]:
    """Names of the experiments with ``enabled`` true (the default), in config order."""
    return [name for name, exp in config["experiments"].items() if exp.get("enabled", True)]


def learning_rates(experiment: dict[str, Any], dataset: str) -> list[float]:
    """The LR grid of ``dataset`` in ``experiment``: its own entry, else the shared ``lrs``."""
    by_dataset = experiment.get("lrs_by_dataset") or {}
    return [float(lr) for lr in by_dataset.get(dataset, experiment["lrs"])]


def grid_lr(config: dict[str, Any], experiment: str, dataset: str, label: str) -> float:
    """The learning rate of ``experiment``'s grid on ``dataset`` whose path label is ``label``.

    A run folder names its LR by :func:`lr_label` (6 significant digits); the run itself must
    train with the grid's exact value, which this gives back.

    Raises:
        ConfigError: when no LR of the grid, or more than one, has that label.
    """
    key = f"experiments.{experiment}"
    found = set(learning_rates(config["experiments"][experiment], dataset))
    matches = sorted(lr for lr in found if lr_label(lr) == label)
    if len(matches) != 1:
        raise ConfigError(
            f"{key}: {len(matches)} learning rates of dataset {dataset!r} have the path label "
            f"lr{label} ({', '.join(map(repr, matches)) or 'none'}; grid: {sorted(found)})"
        )
    return matches[0]


def lr_label_problems(config: dict[str, Any], name: str) -> list[str]:
    """One message per pair of LRs of experiment ``name`` that share a path label (their runs
    would write one folder)."""
    exp = config["experiments"][name]
    problems = []
    for dataset in exp.get("datasets", []):
        labels: dict[str, float] = {}
        for lr in learning_rates(exp, dataset):
            other = labels.setdefault(lr_label(lr), lr)
            if other != lr:
                problems.append(
                    f"experiments.{name}: learning rates {other!r} and {lr!r} of dataset "
                    f"{dataset!r} share the path label lr{lr_label(lr)} (differ within 6 "
                    "significant digits)"
                )
    return problems


def experiment_runs(config: dict[str, Any], name: str) -> list[Run]:
    """Every run of experiment ``name``: models x datasets x configurations x LRs x seeds."""
    exp = config["experiments"][name]
    return [
        Run(name, model, dataset, configuration, lr, int(seed))
        for model in exp["models"]
        for dataset in exp["datasets"]
        for configuration in exp["configurations"]
        for lr in learning_rates(exp, dataset)
        for seed in exp["seeds"]
    ]


def imagenet_path(config: dict[str, Any]) -> str | None:
    """Where ImageNet val is: the environment variable wins over ``paths.imagenet``."""
    return os.environ.get(IMAGENET_ENV) or config["paths"].get("imagenet") or None


def imagenet_missing_message() -> str:
    """The error shown when a job needs ImageNet and no path is set."""
    layouts = "\n".join(f"  - {layout}" for layout in IMAGENET_LAYOUTS)
    return (
        f"ImageNet-1k val is needed for the plasticity reference set, but no path is set.\n"
        f"Set paths.imagenet in config.yaml (or the environment variable {IMAGENET_ENV}) to one of:\n"
        f"{layouts}\n"
        "ImageNet cannot be downloaded by a program (its terms of access)."
    )


def check_config(config: dict[str, Any]) -> None:
    """Check the names and grids the schema cannot; raise one ConfigError listing every problem."""
    problems: list[str] = []
    models, datasets = set(config["models"]), set(config["datasets"])

    def unknown(kind: str, names: list[str], known: set[str], key: str) -> None:
        for name in names:
            if name not in known:
                problems.append(
                    f"{key}: unknown {kind} {name!r} (defined: {', '.join(sorted(known))})"
                )

    plasticity = config["plasticity"]
    unknown("model", plasticity["models"], models, "plasticity.models")
    unknown("dataset", plasticity["datasets"], datasets, "plasticity.datasets")
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
        unknown("model", exp.get("models", []), models, f"{key}.models")
        unknown("dataset", exp.get("datasets", []), datasets, f"{key}.datasets")
        unknown("dataset", list(exp.get("lrs_by_dataset") or {}), datasets, f"{key}.lrs_by_dataset")
        if "lrs" in exp:
            problems += lr_label_problems(config, name)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
