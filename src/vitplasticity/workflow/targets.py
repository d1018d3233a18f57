"""What each target rule asks for (``rule all`` and the ``<stage>_all`` rules): the files of
every job the config enables, each stage's own."""

from __future__ import annotations

from typing import Any

from snakemake.io import expand

from vitplasticity.workflow.config import enabled_experiments, experiment_runs
from vitplasticity.workflow.experiments import (
    classification_experiments,
    compared_optimizers,
    criteria_experiments,
    language_model_experiments,
    stats_experiments,
)
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.recommend_jobs import recommend_cells, recommend_text_models
from vitplasticity.workflow.report import ReportFiles
from vitplasticity.workflow.results import POOLED, ResultFiles

RECOMMEND_FORMATS = ("md", "json", "parquet", "png", "pdf")


class Targets:
    """The target files of the config's stages below ``<results>`` (config ``paths.results``).

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.results = config["paths"]["results"]
        self.models = ModelJobs(config)
        self.report_files = ReportFiles(config)
        self.result_files = ResultFiles(config)

    def plasticity(self) -> list[str]:
        """Per-pair and summary tables of every plasticity (model, dataset)."""
        p = self.config["plasticity"]
        return [
            f"{self.results}/plasticity/{model}/{dataset}{suffix}.parquet"
            for model in p["models"]
            for dataset in p["datasets"]
            for suffix in ("", "_summary")
        ]

    def bounds(self) -> list[str]:
        """The bounds table of every plasticity.models (its figure: :meth:`report`)."""
        return [
            f"{self.results}/bounds/{model}.parquet"
            for model in self.config["plasticity"]["models"]
        ]

    def text_plasticity(self) -> list[str]:
        """Per-pair and summary tables of every text_plasticity (model, dataset); none unless
        enabled."""
        text = self.config["text_plasticity"]
        if not text["enabled"]:
            return []
        return [
            f"{self.results}/plasticity_text/{model}/{dataset}{suffix}.parquet"
            for model in text["run_models"]
            for dataset in text["datasets"]
            for suffix in ("", "_summary")
        ]

    def text_bounds(self) -> list[str]:
        """The bounds table of every text_plasticity.bounds_models; none unless text plasticity
        is enabled (the tables sit beside its measurements)."""
        text = self.config["text_plasticity"]
        if not text["enabled"]:
            return []
        return [f"{self.results}/bounds_text/{model}.parquet" for model in text["bounds_models"]]

    def finetune(self, experiment: str | None = None) -> list[str]:
        """The summary of every run of ``experiment`` (default: every enabled experiment)."""
        names = [experiment] if experiment else enabled_experiments(self.config)
        return [
            self.result_files.finetune_summary(run)
            for name in names
            for run in experiment_runs(self.config, name)
        ]

    def weights(self) -> list[str]:
        """The weights stage's outputs of every `weights: hub` model that a plasticity job, an
        enabled experiment, enabled recommend or enabled text plasticity uses."""
        config = self.config
        used = list(config["plasticity"]["models"])
        for name in enabled_experiments(config):
            used += config["experiments"][name]["models"]
        if config["recommend"]["enabled"]:
            used += config["recommend"]["models"] or []
        if config["text_plasticity"]["enabled"]:
            used += config["text_plasticity"]["run_models"]
        return [path for model in dict.fromkeys(used) for path in self.models.weights_files(model)]

    def report(self) -> list[str]:
        """Every enabled classification experiment's runs (images or labelled text) in one
        table (none when there is none: the workflow is then the plasticity part alone), each
        one's selected runs, and every stats file, table and figure
        (:meth:`figures_and_tables`)."""
        experiments = classification_experiments(self.config)
        return [
            *([f"{self.results}/aggregate/runs.parquet"] if experiments else []),
            *expand(
                f"{self.results}/aggregate/{{experiment}}_selected.parquet", experiment=experiments
            ),
            *self.figures_and_tables(),
        ]

    def text_criteria(self, experiment: str | None = None) -> list[str]:
        """The criteria check of ``experiment`` (default: every enabled experiment on text
        files): its selected runs, the scores and the report (rule text_criteria)."""
        names = [experiment] if experiment else language_model_experiments(self.config)
        return [
            f"{self.results}/stats/{name}/{kind}"
            for name in names
            for kind in ("selected.parquet", "criteria.parquet", "criteria.md")
        ]

    def figures_and_tables(self) -> list[str]:
        """Every stats file, table and figure of the enabled classification experiments and
        the plasticity grid."""
        config, files = self.config, self.report_files
        experiments = classification_experiments(config)
        tested = stats_experiments(config)
        p = config["plasticity"]
        targets = [
            *expand(f"{self.results}/stats/{{experiment}}_wilcoxon.parquet", experiment=tested),
            *files.table_files("wilcoxon", experiment=tested),
            *files.table_files("accuracy", experiment=experiments),
            *files.figure_files("accuracy", experiment=experiments),
            *files.figure_files("robustness", experiment=experiments),
        ]
        for name in experiments:
            exp = config["experiments"][name]
            targets += files.figure_files(
                "curves", experiment=[name], model=exp["models"], dataset=exp["datasets"]
            )
        if p["models"] and p["datasets"]:
            targets += files.table_files("plasticity")
            targets += files.figure_files(
                "plasticity_boxplot", model=p["models"], scope=[*p["datasets"], POOLED]
            )
            targets += files.figure_files("plasticity_depth", model=p["models"])
        if compared_optimizers(config):
            targets += files.figure_files("optimizers")
        targets += files.figure_files("bounds", model=p["models"])
        return targets

    def criteria(self) -> list[str]:
        """Stats (Parquet), table (.tex + .csv) and figure of every scored classification
        experiment, and every text-file experiment's check (:meth:`text_criteria`: its
        language-model runs are read by it alone)."""
        names = criteria_experiments(self.config)
        return [
            *expand(f"{self.results}/stats/{{experiment}}_criteria.parquet", experiment=names),
            *self.report_files.table_files("criteria", experiment=names),
            *self.report_files.figure_files("criteria", experiment=names),
            *self.text_criteria(),
        ]

    def recommend(self) -> list[str]:
        """Report, decision, table and figure of every recommend (model, dataset) (image
        datasets and labelled text, each with the models that take it:
        :func:`~vitplasticity.workflow.recommend_jobs.recommend_cells`), and those of every
        text recommend (:meth:`recommend_text`); none unless enabled."""
        if not self.config["recommend"]["enabled"]:
            return []
        ranked = [
            f"{self.results}/recommend/{model}/{dataset}.{ext}"
            for model, dataset in recommend_cells(self.config)
            for ext in RECOMMEND_FORMATS
        ]
        return ranked + self.recommend_text()

    def recommend_text(self) -> list[str]:
        """Report, decision and table of every text model x text dataset that text_plasticity
        measures and recommend --text ranks (an encoder recommend ranks on labelled text is
        left to that: :func:`~vitplasticity.workflow.recommend_jobs.recommend_text_models`);
        none unless recommend and text_plasticity are both enabled."""
        text = self.config["text_plasticity"]
        if not (self.config["recommend"]["enabled"] and text["enabled"]):
            return []
        return expand(
            f"{self.results}/recommend_text/{{model}}/{{dataset}}.{{ext}}",
            model=recommend_text_models(self.config),
            dataset=list(text["datasets"]),
            ext=list(RECOMMEND_FORMATS),
        )
