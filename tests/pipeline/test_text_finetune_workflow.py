"""Text finetuning through Snakemake: an experiment of text datasets, run by the finetune rules
every experiment's runs go through (packed, as the demo packs them), on a tiny random-init GPT2
(the next-token loss) and a tiny BERT in its masked-LM class (the masked-LM loss), every single
component configuration, on a learnable synthetic text: the validation loss decreases."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.helpers.text_entries import text_dataset
from tests.helpers.tiny_models import ENCODER_TINY_CONFIG, GPT2_TINY_CONFIG
from tests.helpers.workflow import planned_jobs, snakemake

MODELS = {
    "tiny_gpt2": {
        "family": "transformers",
        "hf_id": "tiny-gpt2",
        "weights": "random",
        "config": {"model_type": "gpt2", **GPT2_TINY_CONFIG},
    },
    "tiny_bert": {
        "family": "transformers",
        "hf_id": "tiny-bert",
        "weights": "random",
        "model_class": "BertForMaskedLM",
        "config": {"model_type": "bert", **ENCODER_TINY_CONFIG},
    },
}
CONFIGURATIONS = ["ln1", "mha", "ln2", "fc1", "fc2"]
TASKS = {"tiny_gpt2": "causal", "tiny_bert": "masked"}


EXPERIMENT = "text"
CHECK = [f"results/demo/stats/{EXPERIMENT}/{name}" for name in ("criteria.md", "criteria.parquet")]


def _override(tmp_path: Path, enabled: bool = True, packed: bool = False) -> Path:
    """A text experiment over the mini preset (whose finetune keys the runs take), its runs
    one job each or ``packed`` (finetune.pack_runs)."""
    text = tmp_path / "pattern.txt"
    # One repeated line of byte tokens: each token is its successor's cue, learnable.
    text.write_text(("abcdefgh" * 3 + "\n") * 40)
    override = {
        "models": MODELS,
        "datasets": {"pattern": text_dataset(text, steps=20, val_every=5, sequence_length=12)},
        "finetune": {"pack_runs": packed},
        "experiments": {
            EXPERIMENT: {
                "enabled": enabled,
                "optimizer": "adamw",
                "models": list(MODELS),
                "datasets": ["pattern"],
                "configurations": CONFIGURATIONS,
                "lrs": [0.01],
                "seeds": [0],
            }
        },
    }
    path = tmp_path / f"text_{'on' if enabled else 'off'}{'_packed' if packed else ''}.yaml"
    path.write_text(yaml.safe_dump(override))
    return path


@pytest.mark.slow
def test_the_workflow_finetunes_each_component_of_a_causal_lm_and_an_encoder(
    tmp_path: Path,
) -> None:
    override = _override(tmp_path, packed=True)
    assert planned_jobs(
        snakemake(tmp_path, "-n", *CHECK, extra_configfiles=(_override(tmp_path),))
    )["finetune"] == len(MODELS) * len(CONFIGURATIONS)
    dry = snakemake(tmp_path, "-n", "-p", *CHECK, extra_configfiles=(override,))
    # Packed: one job per (model, dataset), as an image experiment's.
    jobs = planned_jobs(dry)
    packs = {name: count for name, count in jobs.items() if name.startswith("finetune_pack_")}
    assert sum(packs.values()) == len(MODELS), jobs
    output = dry.stdout + dry.stderr
    # The experiment's keys, the finetune block's training keys and the text keys reach the
    # command; the image-only settings keep their defaults (the mini preset sets num_workers 0).
    assert f"vitplasticity finetune --experiment {EXPERIMENT} --model tiny_bert" in output
    assert "--text " in output and "pattern.txt" in output
    assert "--tokenizer auto --sequence-length 12 --mask-probability 0.15" in output
    assert (
        "--optimizer adamw --steps 20 --val-every 5 --batch-size 16 --micro-batch-size 8" in output
    )
    assert "--num-workers 4" in output
    all_off = snakemake(tmp_path, "-n", "all", extra_configfiles=(_override(tmp_path, False),))
    assert "text_criteria" not in planned_jobs(all_off)
    all_on = snakemake(tmp_path, "-n", "all", extra_configfiles=(override,))
    assert planned_jobs(all_on)["text_criteria"] == 1

    result = snakemake(tmp_path, *CHECK, extra_configfiles=(override,))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    runs = tmp_path / f"results/demo/finetune/{EXPERIMENT}"
    for model, task in TASKS.items():
        for configuration in CONFIGURATIONS:
            run = runs / model / "pattern" / configuration / "lr0.01_seed0"
            summary = json.loads((run / "summary.json").read_text())
            assert (summary["task"], summary["status"], summary["demo"]) == (
                task,
                "completed",
                True,
            )
            val = pl.read_parquet(run / "metrics.parquet").filter(pl.col("kind") == "val")
            losses = val["val_loss"].to_list()
            assert val["step"].to_list() == [5, 10, 15, 20]
            # Lower at the end than at the first validation point, and the best is the lowest.
            assert losses[-1] < losses[0], (run, losses)
            assert summary["best_val_loss"] == min(losses) < losses[0]
    # The criteria check ran on the experiment: every configuration of each model selected, and
    # the trainable-parameter baseline scored (no text plasticity or recommend --text here).
    stats = tmp_path / f"results/demo/stats/{EXPERIMENT}"
    selected = pl.read_parquet(stats / "selected.parquet")
    assert selected.group_by("model").len().sort("model").rows() == [
        ("tiny_bert", len(CONFIGURATIONS)),
        ("tiny_gpt2", len(CONFIGURATIONS)),
    ]
    scores = pl.read_parquet(stats / "criteria.parquet").filter(pl.col("level") == "dataset")
    assert set(scores["criterion"]) == {"trainable_parameters"}
    assert "## tiny_gpt2 on pattern" in (stats / "criteria.md").read_text()


def _criteria_override(tmp_path: Path) -> Path:
    """The text experiment's model and dataset measured by text_plasticity and recommend --text
    too."""
    reference = tmp_path / "reference.txt"
    reference.write_text("the quick brown fox\n" * 20)
    override = yaml.safe_load(_override(tmp_path).read_text())
    override["datasets"]["reference"] = text_dataset(reference, sequence_length=12)
    override["text_plasticity"] = {
        "enabled": True,
        "run_models": ["tiny_gpt2"],
        "reference": "reference",
        "datasets": ["pattern"],
        "n_pairs": 4,
    }
    override["recommend"] = {"enabled": True}
    path = tmp_path / "text_criteria.yaml"
    path.write_text(yaml.safe_dump(override))
    return path


def test_the_criteria_check_scores_recommend_text_and_text_plasticity_of_the_same_cells(
    tmp_path: Path,
) -> None:
    """Where text_plasticity measures a model and dataset of the experiment (the same entries),
    text_criteria reads their plasticity summary and recommend --text table."""
    override = _criteria_override(tmp_path)
    dry = snakemake(tmp_path, "-n", "-p", *CHECK, extra_configfiles=(override,))
    output = dry.stdout + dry.stderr
    assert dry.returncode == 0, output[-4000:]
    assert planned_jobs(dry)["text_criteria"] == 1
    command = output[output.index("vitplasticity criteria --experiment") :].split("\n")[0]
    assert "recommend_text/tiny_gpt2/pattern.parquet" in command
    assert "plasticity_text/tiny_gpt2/pattern_summary.parquet" in command
    assert "recommend_text/tiny_bert" not in command  # text_plasticity does not measure it
