"""An experiment of text datasets: its runs are the finetune rules' jobs, with the text file as
their input and its cut as their flags (vitplasticity.workflow.finetune_jobs); the accuracy
report leaves it out and the text criteria check reads it (vitplasticity.workflow.experiments,
.targets); its problems are named before any job (vitplasticity.workflow.dataset_kinds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from snakemake.iocontainers import Wildcards

from tests.helpers.configs import DEMO, PAPER, load_config, merged, validated
from tests.helpers.text_entries import text_dataset
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config
from vitplasticity.workflow.datasets import DatasetJobs
from vitplasticity.workflow.experiments import (
    classification_experiments,
    language_model_experiments,
)
from vitplasticity.workflow.finetune_jobs import FinetuneJobs
from vitplasticity.workflow.targets import Targets

GPT2 = {
    "family": "transformers",
    "hf_id": "tiny-gpt2",
    "weights": "random",
    "config": {"model_type": "gpt2", "n_embd": 48, "n_layer": 2, "n_head": 3, "n_positions": 16},
}


def _config(tmp_path: Path, dataset: dict | None = None, **block) -> dict:
    text = tmp_path / "notes.txt"
    text.write_text("some text\n")
    edit = {
        "models": {"tiny_gpt2": GPT2},
        "datasets": {"notes": {**text_dataset(text, sequence_length=12), **(dataset or {})}},
        "finetune": {"warmup_steps": 2, "mask_probability": 0.25},
        "experiments": {
            "text": {
                "optimizer": "adamw",
                "models": ["tiny_gpt2"],
                "datasets": ["notes"],
                "configurations": ["mha", "fc1"],
                "lrs": [1e-3, 3e-4],
                "seeds": [0, 1],
                **block,
            }
        },
    }
    return validated(merged(load_config(PAPER, DEMO), edit))


def test_a_text_experiment_is_run_by_the_finetune_rules_and_checked_by_text_criteria(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    check_config(config)
    assert "text" in language_model_experiments(config)
    assert "text" not in classification_experiments(config)
    targets = Targets(config)
    runs = targets.finetune("text")
    assert len(runs) == 1 * 1 * 2 * 2 * 2
    results = config["paths"]["results"]
    assert f"{results}/finetune/text/tiny_gpt2/notes/fc1/lr0.0003_seed1/summary.json" in runs
    assert f"{results}/stats/text/criteria.md" in targets.criteria()
    assert not [t for t in targets.report() if "/text_" in t or "/text/" in t]
    text = Wildcards(fromdict={"experiment": "text", "dataset": "notes", "lr": "0.0003"})
    image = Wildcards(fromdict={"experiment": "sgd", "dataset": "cifar10", "lr": "0.001"})
    assert DatasetJobs(config).dataset(text) == str(tmp_path / "notes.txt")
    assert DatasetJobs(config).dataset(image).endswith("/datasets/cifar10")
    jobs = FinetuneJobs(config)
    assert jobs.lr(text) == 3e-4
    params = jobs.params()
    assert (params["optimizer"](text), params["steps"](text), params["warmup_steps"]) == (
        "adamw",
        10,
        2,
    )
    assert params["data_flag"](text) == "--text" and params["data_flag"](image) == "--dataset-dir"
    assert params["text_flags"](text) == (
        "--tokenizer auto --sequence-length 12 --mask-probability 0.25"
    )
    assert params["text_flags"](image) == ""
    # The image loader's settings reach image runs only: a text run gets the flags' defaults.
    config["finetune"]["num_workers"] = 7
    params = FinetuneJobs(config).params()
    assert (params["num_workers"](image), params["num_workers"](text)) == (7, 4)


def test_a_disabled_text_experiment_is_neither_checked_nor_run(tmp_path: Path) -> None:
    config = _config(tmp_path, enabled=False, models=["nowhere"])
    check_config(config)
    assert language_model_experiments(config) == []
    assert not [t for t in Targets(config).criteria() if "stats/text/" in t]


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"models": ["gpt3"]}, "experiments.text.models: unknown model 'gpt3'"),
        ({"models": ["vit_base"]}, "experiments.text.models: 'vit_base' takes images, and experiments.text.datasets are text datasets (notes)"),
        ({"datasets": ["gone"]}, "experiments.text.datasets: unknown dataset 'gone'"),
        ({"datasets": ["notes", "cifar10"]}, "experiments.text.datasets: text datasets of source text_file (notes) and image datasets (cifar10)"),
        ({"dataset": {"path": "/no/such.txt"}}, "datasets.notes.path: '/no/such.txt' does not exist"),
        ({"dataset": {"sequence_length": 20}}, "datasets.notes.sequence_length: 20 exceeds the 16 positions"),
        ({"lrs": [1e-3, 1.0000001e-3]}, "experiments.text: learning rates 0.001 and 0.0010000001 of dataset 'notes' share the path label"),
        ({"dataset": {"steps": 2}}, "finetune.warmup_steps: 2, not fewer than datasets.notes.steps 2"),
    ],
)  # fmt: skip
def test_each_problem_is_named_before_any_job(tmp_path: Path, block: dict, message: str) -> None:
    config = _config(tmp_path, **block)
    with pytest.raises(ConfigError, match="invalid config") as error:
        check_config(config)
    assert message in str(error.value)
