"""The text finetuning grid (config ``text_finetune``): its checks, its targets and its rule's
params. Torch-free: the Snakefile imports it.

One job per (model, text dataset, configuration, lr, seed), writing
``<results>/finetune_text/<model>/<dataset>/<configuration>/lr<lr>_seed<seed>/``: a folder of
its own, beside the image grid's ``finetune/``, so the image report's aggregation (which
selects by the highest validation accuracy) never reads a text run (selected by the lowest
validation loss).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vitplasticity.finetune.run import lr_label
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.text_settings import IMAGE_ONLY_TRAINING_FIELDS, TextFinetuneSettings
from vitplasticity.models.registry import family_inputs
from vitplasticity.models.text import stated_positions
from vitplasticity.settings.declaration import command_flags, rule_params
from vitplasticity.settings.sequences import SEQUENCE_DEFAULTS, sequence_settings
from vitplasticity.workflow.config import ConfigError, shared_label_problems
from vitplasticity.workflow.dataset_kinds import is_text_dataset
from vitplasticity.workflow.model_entries import model_inputs
from vitplasticity.workflow.params import Wildcards, demo_flag

TEXT_EXPERIMENT = "text_finetune"
"""The experiment name a text run's summary records."""


def text_finetune_problems(config: Mapping[str, Any]) -> list[str]:
    """With text_finetune.enabled true, one message per missing list, unknown or image model,
    pair of LRs sharing a path label, dataset whose run is no longer than the warm-up, or
    dataset's sequence longer than a random-init model's stated positions (the datasets
    themselves: :func:`vitplasticity.workflow.dataset_kinds.text_dataset_problems`)."""
    block = config.get("text_finetune") or {}
    if not block.get("enabled"):
        return []
    problems = [
        f"text_finetune.{key}: empty (text_finetune.enabled is true)"
        for key in ("run_models", "datasets", "configurations", "lrs", "seeds")
        if not block.get(key)
    ]
    models = config.get("models") or {}
    for name in block.get("run_models") or []:
        if name not in models:
            problems.append(
                f"text_finetune.run_models: unknown model {name!r} (defined: {', '.join(sorted(models))})"
            )
        elif "tokens" not in family_inputs(models[name]) or model_inputs(models[name]) == "images":
            problems.append(
                f"text_finetune.run_models: {name!r} is an image model; finetune it in "
                "experiments:, text finetuning takes transformers text models"
            )
        else:
            limit = stated_positions(models[name])
            problems += [
                f"datasets.{dataset}.sequence_length: {length} exceeds the {limit} positions "
                f"that models.{name}.config states (text_finetune finetunes it on {dataset})"
                for dataset, length in _sequence_lengths(config, block)
                if limit is not None and length > limit
            ]
    problems += shared_label_problems("text_finetune.lrs", block.get("lrs") or [])
    warmup = (config.get("finetune") or {}).get("warmup_steps", 0)
    for dataset in _text_datasets(config, block):
        steps = config["datasets"][dataset].get("steps", 1)
        if warmup >= steps:
            problems.append(
                f"finetune.warmup_steps: {warmup}, not fewer than datasets.{dataset}.steps "
                f"{steps}: its text runs would never reach their learning rate"
            )
    return problems


def _text_datasets(config: Mapping[str, Any], block: Mapping[str, Any]) -> list[str]:
    """The text grid's datasets that are text datasets of the config (others are named by
    :func:`vitplasticity.workflow.dataset_kinds.text_dataset_problems`)."""
    datasets = config.get("datasets") or {}
    return [name for name in block.get("datasets") or [] if is_text_dataset(datasets.get(name))]


def _sequence_lengths(config: Mapping[str, Any], block: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(dataset, sequence length) of the text grid's text datasets."""
    return [
        (name, sequence_settings(config["datasets"][name])["sequence_length"])
        for name in _text_datasets(config, block)
    ]


class TextFinetuneJobs:
    """The text finetuning rule's targets and params from the config.

    The settings are the finetune stage's (:class:`~vitplasticity.finetune.settings.
    TrainingSettings`, the keys of ``finetune`` a text run takes) and the text runs' own
    (:class:`~vitplasticity.finetune.text_settings.TextFinetuneSettings`, ``text_finetune``).

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.block = config["text_finetune"]
        self.results = config["paths"]["results"]

    def targets(self) -> list[str]:
        """The summary of every run of the grid; none unless enabled."""
        if not self.block["enabled"]:
            return []
        return [
            f"{self.results}/finetune_text/{model}/{dataset}/{configuration}/"
            f"lr{lr_label(lr)}_seed{seed}/summary.json"
            for model in self.block["run_models"]
            for dataset in self.block["datasets"]
            for configuration in self.block["configurations"]
            for lr in self.block["lrs"]
            for seed in self.block["seeds"]
        ]

    def criteria_targets(self) -> list[str]:
        """The criteria check of the grid (:meth:`criteria_files`); none unless enabled."""
        if not self.block["enabled"]:
            return []
        return list(self.criteria_files().values())

    def criteria_files(self) -> dict[str, str]:
        """The text_criteria rule's outputs: the selected runs, the scores, the report."""
        folder = f"{self.results}/stats/{TEXT_EXPERIMENT}"
        return {
            "selected": f"{folder}/selected.parquet",
            "scores": f"{folder}/criteria.parquet",
            "markdown": f"{folder}/criteria.md",
        }

    def checked_cells(self) -> list[tuple[str, str]]:
        """The (model, dataset) cells of the grid that text_plasticity measures too (the same
        model entry and dataset name): their plasticity and recommend-text tables are scored."""
        text = self.config["text_plasticity"]
        if not text["enabled"]:
            return []
        return [
            (model, dataset)
            for model in self.block["run_models"]
            if model in text["run_models"]
            for dataset in self.block["datasets"]
            if dataset in text["datasets"]
        ]

    def criteria_recommend(self) -> list[str]:
        """recommend-text's table of every :meth:`checked_cells` cell; none unless
        recommend is enabled (which makes those tables)."""
        if not self.config["recommend"]["enabled"]:
            return []
        return [
            f"{self.results}/recommend_text/{model}/{dataset}.parquet"
            for model, dataset in self.checked_cells()
        ]

    def criteria_plasticity(self) -> list[str]:
        """The text plasticity summary of every :meth:`checked_cells` cell."""
        return [
            f"{self.results}/plasticity_text/{model}/{dataset}_summary.parquet"
            for model, dataset in self.checked_cells()
        ]

    def params(self) -> dict[str, Any]:
        """The params of every run, in the order of the command's flags: the grid's optimizer,
        the dataset's steps and validation period, the finetune keys a text run takes, the
        text settings (the dataset's tokenizer and sequence length, the grid's mask
        probability), the demo switch. Each its own entry: editing one key reruns only what
        it changes."""
        return {**self._training_params(), **self._text_params()}

    def _training_params(self) -> dict[str, Any]:
        finetune = rule_params(TrainingSettings, self.config["finetune"], "finetune")
        return {
            "optimizer": self.block["optimizer"],
            "steps": self._dataset_value("steps"),
            "val_every": self._dataset_value("val_every"),
            **{k: v for k, v in finetune.items() if k not in IMAGE_ONLY_TRAINING_FIELDS},
            "demo_flag": demo_flag(self.config),
        }

    def _text_params(self) -> dict[str, Any]:
        return {
            **{key: self._dataset_value(key) for key in SEQUENCE_DEFAULTS},
            **rule_params(TextFinetuneSettings, self.block, "text_finetune"),
        }

    def _dataset_value(self, key: str) -> Callable[[Wildcards], Any]:
        """A params function: ``key`` of the job's dataset entry (its default when absent)."""

        def value(wildcards: Wildcards) -> Any:
            entry = self.config["datasets"][wildcards.dataset]
            return {**SEQUENCE_DEFAULTS, **entry}[key]

        return value

    def command_flags(self) -> str:
        """The command's flags of :meth:`params`, each ``--flag {params.<name>}``."""
        return command_flags(TrainingSettings, list(self._training_params())) + command_flags(
            TextFinetuneSettings, list(self._text_params())
        )

    def text_file(self, wildcards: Wildcards) -> str:
        """Input function: the job's text file (``datasets.<name>.path``)."""
        return self.config["datasets"][wildcards.dataset]["path"]

    def lr(self, wildcards: Wildcards) -> float:
        """The grid's exact LR of the job (the {lr} wildcard is its 6-digit path label).

        Raises:
            ConfigError: when no LR of text_finetune.lrs has that label.
        """
        for lr in self.block["lrs"]:
            if lr_label(lr) == wildcards.lr:
                return lr
        raise ConfigError(
            f"text_finetune.lrs: no learning rate has the path label lr{wildcards.lr} "
            f"(grid: {self.block['lrs']})"
        )
