"""The result files one job reads from the others, below ``<results>`` (config
``paths.results``): finetuning summaries and metrics, plasticity tables, recommend tables."""

from __future__ import annotations

from typing import Any

from vitplasticity.finetune.run import Run
from vitplasticity.settings.sequences import TEXT_SOURCE
from vitplasticity.workflow.config import experiment_runs
from vitplasticity.workflow.experiments import (
    experiment_kind,
    is_text_experiment,
    measured_cells,
    recommended_cells,
)
from vitplasticity.workflow.params import Wildcards
from vitplasticity.workflow.recommend_jobs import recommend_text_models

# The figure_plasticity_boxplot scope of every dataset at once.
POOLED = "pooled"


class ResultFiles:
    """The inputs, by wildcards, of the jobs that read other jobs' results.

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.results = config["paths"]["results"]

    def finetune_summary(self, run: Run) -> str:
        """The summary.json of one finetuning run."""
        return f"{self.results}/finetune/{run.directory}/summary.json"

    def experiment_summaries(self, wildcards: Wildcards) -> list[str]:
        """The summaries of every run of the job's experiment."""
        runs = experiment_runs(self.config, wildcards.experiment)
        return [self.finetune_summary(run) for run in runs]

    def curve_inputs(self, wildcards: Wildcards) -> dict[str, list[str]]:
        """The metrics and summaries of the runs of the job's (experiment, model, dataset)."""
        runs = [
            run
            for run in experiment_runs(self.config, wildcards.experiment)
            if run.model == wildcards.model and run.dataset == wildcards.dataset
        ]
        return {
            "metrics": [f"{self.results}/finetune/{run.directory}/metrics.parquet" for run in runs],
            "summaries": [self.finetune_summary(run) for run in runs],
        }

    def plasticity_pairs(self, wildcards: Wildcards) -> list[str]:
        """The per-pair plasticity files of the job's model, one per plasticity.datasets."""
        datasets = self.config["plasticity"]["datasets"]
        return [f"{self.results}/plasticity/{wildcards.model}/{d}.parquet" for d in datasets]

    def text_plasticity_pairs(self, wildcards: Wildcards) -> list[str]:
        """The per-pair text plasticity files of the job's model, one per text dataset."""
        datasets = self.config["text_plasticity"]["datasets"]
        return [f"{self.results}/plasticity_text/{wildcards.model}/{d}.parquet" for d in datasets]

    def plasticity_summaries(self, model: str, datasets: list[str] | None = None) -> list[str]:
        """The plasticity summaries of ``model`` on ``datasets`` (default plasticity.datasets)."""
        names = datasets or self.config["plasticity"]["datasets"]
        return [f"{self.results}/plasticity/{model}/{d}_summary.parquet" for d in names]

    def grid_summaries(self) -> list[str]:
        """The plasticity summaries of every plasticity.models on every plasticity.datasets."""
        models = self.config["plasticity"]["models"]
        return [path for model in models for path in self.plasticity_summaries(model)]

    def model_summaries(self, wildcards: Wildcards) -> list[str]:
        """The plasticity summaries of the job's model on every plasticity.datasets."""
        return self.plasticity_summaries(wildcards.model)

    def scope_summaries(self, wildcards: Wildcards) -> list[str]:
        """The plasticity summaries of one dataset, or of every dataset for the "pooled" scope."""
        scope = wildcards.scope
        return self.plasticity_summaries(wildcards.model, None if scope == POOLED else [scope])

    def criteria_plasticity(self, wildcards: Wildcards) -> list[str]:
        """The measured plasticity summaries of the job's experiment's cells (a text
        experiment's: text plasticity's)."""
        cells = measured_cells(self.config, wildcards.experiment)
        text = is_text_experiment(self.config, wildcards.experiment)
        folder = "plasticity_text" if text else "plasticity"
        return [f"{self.results}/{folder}/{m}/{d}_summary.parquet" for m, d in cells]

    def criteria_recommend(self, wildcards: Wildcards) -> list[str]:
        """The recommend tables of the job's experiment's cells, when recommend is enabled: an
        image experiment's every cell, a labelled-text experiment's cells that recommend ranks
        (:func:`.experiments.recommended_cells`); a text-file experiment's: recommend --text's,
        of the cells text plasticity measures and recommend --text ranks (the check says why a
        cell has none)."""
        if not self.config["recommend"]["enabled"]:
            return []
        experiment = wildcards.experiment
        if experiment_kind(self.config, experiment) == TEXT_SOURCE:
            ranked = recommend_text_models(self.config)
            cells = measured_cells(self.config, experiment)
            return [
                f"{self.results}/recommend_text/{m}/{d}.parquet" for m, d in cells if m in ranked
            ]
        cells = recommended_cells(self.config, experiment)
        return [f"{self.results}/recommend/{m}/{d}.parquet" for m, d in cells]
