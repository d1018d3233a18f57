"""vitplasticity.workflow.targets: what `all` and the `<stage>_all` rules ask for, and which
parts of the config switch a stage's targets on or off, on the paper's and the demo's configs."""

from __future__ import annotations

from typing import Any

from tests.helpers.configs import Configure
from tests.helpers.text_entries import text_dataset
from vitplasticity.workflow.config import experiment_runs
from vitplasticity.workflow.targets import Targets

GPT2 = {"family": "transformers", "hf_id": "gpt2", "weights": "hub"}
TEXT = {"enabled": True, "run_models": ["gpt2"], "reference": "wiki", "datasets": ["code", "news"]}
TEXT_DATASETS = {name: text_dataset(f"{name}.txt") for name in ("wiki", "code", "news")}


def test_the_paper_finetunes_its_1560_runs(paper: dict[str, Any]) -> None:
    finetune = Targets(paper).finetune()
    assert len(finetune) == len(set(finetune)) == 1560
    assert Targets(paper).finetune("sgd") == [
        f"results/finetune/{run.directory}/summary.json" for run in experiment_runs(paper, "sgd")
    ]


def test_plasticity_and_bounds_cover_the_plasticity_grid(paper: dict[str, Any]) -> None:
    targets = Targets(paper)
    p = paper["plasticity"]
    assert len(targets.plasticity()) == 2 * len(p["models"]) * len(p["datasets"])
    assert "results/plasticity/vit_base/cifar10_summary.parquet" in targets.plasticity()
    assert targets.bounds() == [f"results/bounds/{m}.parquet" for m in p["models"]]


def test_weights_are_fetched_for_the_hub_models_in_use(paper: dict[str, Any]) -> None:
    """dinov3_base is defined but used by nothing; disabled experiments' models are not used."""
    weights = Targets(paper).weights()
    assert len(weights) == len(set(weights))
    fetched = {path.split("/")[2] for path in weights}
    assert fetched == {"vit_base", "vit_large", "vit_huge"}
    for name, exp in paper["experiments"].items():
        if "vit_huge" in exp["models"]:
            paper["experiments"][name]["enabled"] = False
    paper["plasticity"]["models"] = [m for m in paper["plasticity"]["models"] if m != "vit_huge"]
    assert "vit_huge" not in {path.split("/")[2] for path in Targets(paper).weights()}


def test_text_models_weights_are_fetched_when_text_plasticity_is_on(
    demo_with: Configure,
) -> None:
    config = demo_with(
        {"models": {"gpt2": GPT2}, "datasets": TEXT_DATASETS, "text_plasticity": TEXT}
    )
    assert Targets(config).weights() == ["resources/demo/weights/gpt2/weights.json"]
    assert Targets(demo_with({"models": {"gpt2": GPT2}})).weights() == []


def test_text_plasticity_and_text_recommend_need_their_blocks_enabled(demo_with: Configure) -> None:
    config = demo_with(
        {"models": {"gpt2": GPT2}, "datasets": TEXT_DATASETS, "text_plasticity": TEXT}
    )
    text = Targets(config).text_plasticity()
    assert len(text) == 2 * 2 and "results/demo/plasticity_text/gpt2/news_summary.parquet" in text
    recommended = Targets(config).recommend_text()
    assert sorted(recommended) == sorted(
        f"results/demo/recommend_text/gpt2/{d}.{ext}"
        for d in ("code", "news")
        for ext in ("md", "json", "parquet", "png", "pdf")
    )
    assert set(recommended) <= set(Targets(config).recommend())
    config["recommend"]["enabled"] = False
    assert Targets(config).recommend() == Targets(config).recommend_text() == []
    assert Targets(demo_with({})).text_plasticity() == []


def test_text_bounds_of_the_bounds_models_when_text_plasticity_is_on(
    demo_with: Configure,
) -> None:
    config = demo_with(
        {"models": {"gpt2": GPT2}, "datasets": TEXT_DATASETS, "text_plasticity": TEXT}
    )
    assert Targets(config).text_bounds() == []  # bounds_models defaults to none
    config = demo_with(
        {
            "models": {"gpt2": GPT2},
            "datasets": TEXT_DATASETS,
            "text_plasticity": {**TEXT, "bounds_models": ["gpt2"]},
        }
    )
    assert Targets(config).text_bounds() == ["results/demo/bounds_text/gpt2.parquet"]
    config["text_plasticity"]["enabled"] = False
    assert Targets(config).text_bounds() == []


def test_recommend_falls_back_on_the_plasticity_grid(demo_with: Configure) -> None:
    images = Targets(demo_with({})).recommend()
    assert len(images) == 3 * 5  # demo_vit x 3 datasets x (md, json, parquet, png, pdf)
    own = Targets(demo_with({"recommend": {"datasets": ["demo-blobs"]}})).recommend()
    assert sorted(own) == sorted(
        f"results/demo/recommend/demo_vit/demo-blobs.{ext}"
        for ext in ("md", "json", "parquet", "png", "pdf")
    )


def test_the_report_of_the_demo(demo: dict[str, Any]) -> None:
    report = Targets(demo).report()
    assert len(report) == len(set(report))
    for path in (
        "results/demo/aggregate/runs.parquet",
        "results/demo/aggregate/adam_selected.parquet",
        "results/demo/stats/sgd_wilcoxon.parquet",
        "results/demo/tables/sgd_wilcoxon.csv",
        "results/demo/tables/adam_accuracy.tex",
        "results/demo/tables/plasticity.tex",
        "results/demo/figures/robustness/sgd.pdf",
        "results/demo/figures/curves/adam/demo_vit/demo-palette.png",
        "results/demo/figures/plasticity_boxplot/demo_vit/pooled.png",
        "results/demo/figures/plasticity_depth/demo_vit.pdf",
        "results/demo/figures/optimizers.png",
        "results/demo/figures/bounds_demo_vit.png",
    ):
        assert path in report, path


def test_without_experiments_the_report_is_the_plasticity_part(demo_with: Configure) -> None:
    off = {"enabled": False}
    report = Targets(demo_with({"experiments": {"sgd": off, "adam": off}})).report()
    assert not [path for path in report if "/aggregate/" in path or "/stats/" in path]
    assert "results/demo/tables/plasticity.tex" in report
    assert "results/demo/figures/optimizers.png" not in report


def test_without_a_plasticity_grid_no_plasticity_table_or_figure(demo_with: Configure) -> None:
    report = Targets(demo_with({"plasticity": {"datasets": []}})).report()
    assert not [path for path in report if "plasticity" in path]


def test_criteria_targets_of_each_scored_experiment(demo: dict[str, Any]) -> None:
    criteria = Targets(demo).criteria()
    for name in ("sgd", "adam"):
        assert f"results/demo/stats/{name}_criteria.parquet" in criteria
        assert f"results/demo/tables/{name}_criteria.tex" in criteria
        assert f"results/demo/figures/criteria/{name}.png" in criteria
    demo["recommend"]["enabled"] = False
    assert Targets(demo).criteria() == []
