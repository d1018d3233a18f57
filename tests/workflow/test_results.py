"""vitplasticity.workflow.results: the result files a job reads from other jobs, by its
wildcards, on the demo's config."""

from __future__ import annotations

from typing import Any

from snakemake.iocontainers import Wildcards

from vitplasticity.workflow.config import experiment_runs
from vitplasticity.workflow.results import ResultFiles

R = "results/demo"


def of(**wildcards: str) -> Wildcards:
    return Wildcards(fromdict=wildcards)


def test_an_experiment_reads_the_summary_of_each_of_its_runs(demo: dict[str, Any]) -> None:
    summaries = ResultFiles(demo).experiment_summaries(of(experiment="sgd"))
    assert len(summaries) == len(experiment_runs(demo, "sgd")) == 8 * (2 + 1 + 1)
    assert f"{R}/finetune/sgd/demo_vit/demo-stripes/mha/lr0.02_seed0/summary.json" in summaries


def test_curves_read_one_cells_metrics_and_summaries(demo: dict[str, Any]) -> None:
    inputs = ResultFiles(demo).curve_inputs(
        of(experiment="sgd", model="demo_vit", dataset="demo-stripes")
    )
    runs = [
        f"{c}/lr{lr}_seed0"
        for c in demo["experiments"]["sgd"]["configurations"]
        for lr in ("0.02", "0.1")
    ]
    cell = f"{R}/finetune/sgd/demo_vit/demo-stripes"
    assert inputs == {
        "metrics": [f"{cell}/{run}/metrics.parquet" for run in runs],
        "summaries": [f"{cell}/{run}/summary.json" for run in runs],
    }


def test_plasticity_inputs_by_model_dataset_and_scope(demo: dict[str, Any]) -> None:
    files = ResultFiles(demo)
    datasets = demo["plasticity"]["datasets"]
    summaries = [f"{R}/plasticity/demo_vit/{d}_summary.parquet" for d in datasets]
    assert files.plasticity_pairs(of(model="demo_vit")) == [
        f"{R}/plasticity/demo_vit/{d}.parquet" for d in datasets
    ]
    assert files.model_summaries(of(model="demo_vit")) == summaries
    assert files.scope_summaries(of(model="demo_vit", scope="pooled")) == summaries
    assert files.scope_summaries(of(model="demo_vit", scope="demo-blobs")) == [summaries[1]]
    demo["plasticity"]["models"] = ["demo_vit", "other"]
    assert files.grid_summaries() == [
        *summaries,
        *(s.replace("demo_vit", "other") for s in summaries),
    ]


def test_criteria_read_measured_plasticity_and_recommend_tables(demo: dict[str, Any]) -> None:
    demo["plasticity"]["datasets"] = ["demo-palette"]
    files = ResultFiles(demo)
    job = of(experiment="adam")
    assert files.criteria_plasticity(job) == [
        f"{R}/plasticity/demo_vit/demo-palette_summary.parquet"
    ]
    assert files.criteria_recommend(job) == [
        f"{R}/recommend/demo_vit/{d}.parquet" for d in demo["experiments"]["adam"]["datasets"]
    ]
    demo["recommend"]["enabled"] = False
    assert files.criteria_recommend(job) == []
