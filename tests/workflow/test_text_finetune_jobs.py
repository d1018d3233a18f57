"""The text finetuning grid's checks, targets and params (vitplasticity.workflow.text_finetune_jobs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from snakemake.iocontainers import Wildcards

from tests.helpers.configs import DEMO, PAPER, load_config, merged, validated
from tests.helpers.text_entries import text_dataset
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config
from vitplasticity.workflow.text_finetune_jobs import (
    TextFinetuneJobs,
    text_finetune_problems,
)

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
        "finetune": {"warmup_steps": 2},
        "text_finetune": {
            "enabled": True,
            "run_models": ["tiny_gpt2"],
            "datasets": ["notes"],
            "configurations": ["mha", "fc1"],
            "lrs": [1e-3, 3e-4],
            "seeds": [0, 1],
            **block,
        },
    }
    return validated(merged(load_config(PAPER, DEMO), edit))


def test_a_valid_grid_has_no_problem_and_one_target_per_run(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert text_finetune_problems(config) == []
    jobs = TextFinetuneJobs(config)
    targets = jobs.targets()
    assert len(targets) == 1 * 1 * 2 * 2 * 2
    results = config["paths"]["results"]
    assert f"{results}/finetune_text/tiny_gpt2/notes/fc1/lr0.0003_seed1/summary.json" in targets
    wildcards = Wildcards(fromdict={"lr": "0.0003"})
    assert jobs.lr(wildcards) == 3e-4
    with pytest.raises(ConfigError, match=r"no learning rate has the path label lr0\.5"):
        jobs.lr(Wildcards(fromdict={"lr": "0.5"}))
    params = jobs.params()
    notes = Wildcards(fromdict={"dataset": "notes"})
    assert (params["optimizer"], params["steps"](notes), params["warmup_steps"]) == ("adamw", 10, 2)
    assert params["sequence_length"](notes) == 12 and params["tokenizer"](notes) == "auto"
    assert "augment" not in params
    flags = jobs.command_flags()
    assert (
        "--steps {params.steps}" in flags and "--sequence-length {params.sequence_length}" in flags
    )


def test_a_disabled_block_is_neither_checked_nor_run(tmp_path: Path) -> None:
    config = _config(tmp_path, enabled=False, run_models=["nowhere"])
    assert text_finetune_problems(config) == []
    assert TextFinetuneJobs(config).targets() == []


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"run_models": []}, "text_finetune.run_models: empty (text_finetune.enabled is true)"),
        ({"run_models": ["gpt3"]}, "text_finetune.run_models: unknown model 'gpt3'"),
        ({"run_models": ["vit_base"]}, "text_finetune.run_models: 'vit_base' is an image model"),
        ({"datasets": ["gone"]}, "text_finetune.datasets: unknown dataset 'gone'"),
        ({"datasets": ["/no/such.txt"]}, "text_finetune.datasets: '/no/such.txt' is a file, not a dataset name: text files are datasets: entries now"),
        ({"datasets": ["cifar10"]}, "text_finetune.datasets: 'cifar10' is an image dataset (source: cifar10)"),
        ({"dataset": {"path": "/no/such.txt"}}, "datasets.notes.path: '/no/such.txt' does not exist"),
        ({"dataset": {"sequence_length": 20}}, "datasets.notes.sequence_length: 20 exceeds the 16 positions"),
        ({"lrs": [1e-3, 1.0000001e-3]}, "text_finetune.lrs: learning rates 0.001 and 0.0010000001 share the path label"),
        ({"dataset": {"steps": 2}}, "finetune.warmup_steps: 2, not fewer than datasets.notes.steps 2"),
    ],
)  # fmt: skip
def test_each_problem_is_named_before_any_job(tmp_path: Path, block: dict, message: str) -> None:
    config = _config(tmp_path, **block)
    with pytest.raises(ConfigError, match="invalid config") as error:
        check_config(config)
    assert message in str(error.value)
