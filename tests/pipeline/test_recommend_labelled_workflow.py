"""A real text model ranked and verified on labelled text through Snakemake: all-MiniLM-L6-v2
(a bare BertModel with its pooler and tokenizer, tests/helpers/real_checkpoints.py) measured by
text plasticity on a text file, ranked by recommend as a sequence classifier on licence
paragraphs labelled by licence (recommend.datasets: a labelled_text dataset) against text
plasticity's reference text cut as the labelled dataset is cut, and that ranking verified by
recommend.verify: rungs, decisions, the survivors' runs and the verified report, whose
accuracies are the runs' own. The encoder gets no recommend --text job (it has no next-token
loss): recommend ranks it on the labelled text instead."""

from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.helpers.labelled_text import licence_paragraphs, write_licence_csv
from tests.helpers.workflow import planned_jobs, snakemake
from vitplasticity.criteria import RECOMMEND_CRITERIA, REGISTRY

pytestmark = pytest.mark.slow

RESULTS = "results/demo"
MODEL = "minilm"
LABELLED = "licences"
TEXT = "licence_text"
REFERENCE = "legal_reference"
EXPERIMENT = "verify_minilm"
LRS = [3e-4, 1e-3]
LENGTH = 64  # tokens per document and per reference sequence
CONFIGURATIONS = ["ln1", "fc1"]  # few candidates (each is trained): the smallest and a large one
RANKING = f"{RESULTS}/recommend/{MODEL}/{LABELLED}"
TARGETS = [
    f"{RESULTS}/plasticity_text/{MODEL}/{TEXT}_summary.parquet",
    f"{RANKING}.md",
    f"{RANKING}_verified.md",
]


def _lines(path: Path, licences: tuple[str, ...]) -> Path:
    """A text file of the paragraphs of ``licences``, one per line."""
    path.write_text("".join(f"{text}\n" for text, _ in licence_paragraphs(licences)))
    return path


def _override(tmp_path: Path, weights: Path) -> Path:
    """Text plasticity, recommend and its verification of MiniLM over the mini preset: the
    labelled licences (GFDL-1.3, GPL-3, MPL-2.0) ranked against a reference text of other
    licences, 8 steps a run (one rung at 4: steps = eta x val_every)."""
    cut = {"sequence_length": LENGTH}
    reference = _lines(tmp_path / "reference.txt", ("GPL-2", "LGPL-2.1", "Apache-2.0"))
    text = _lines(tmp_path / "text.txt", ("Artistic", "BSD", "MPL-1.1"))
    override = {
        "models": {
            MODEL: {"family": "transformers", "hf_id": "all-MiniLM-L6-v2", "weights": str(weights)}
        },
        "datasets": {
            REFERENCE: {"source": "text_file", "path": str(reference), "steps": 8, "val_every": 4, **cut},
            TEXT: {"source": "text_file", "path": str(text), "steps": 8, "val_every": 4, **cut},
            LABELLED: {
                "source": "labelled_text",
                "path": str(write_licence_csv(tmp_path / "licences.csv")),
                "steps": 8,
                "val_every": 4,
                **cut,
            },
        },
        "finetune": {"batch_size": 4, "micro_batch_size": 4},
        "text_plasticity": {
            "enabled": True,
            "run_models": [MODEL],
            "reference": REFERENCE,
            "datasets": [TEXT],
            "n_pairs": 8,
            "batch_size": 8,
        },
        "experiments": {
            EXPERIMENT: {
                "enabled": False,
                "optimizer": "adamw",
                "models": [MODEL],
                "datasets": [LABELLED],
                "configurations": ["head"],
                "lrs": LRS,
                "seeds": [0],
            }
        },
        "recommend": {
            "enabled": True,
            "models": [MODEL],
            "datasets": [LABELLED],
            "n_pairs": 8,
            "batch_size": 4,
            "batches": 2,
            "warmup_steps": 4,
            "configurations": CONFIGURATIONS,
            "verify": {
                "enabled": True,
                "experiment": EXPERIMENT,
                "top_k": 2,
                "baselines": ["head", "lora"],
            },
        },
    }  # fmt: skip
    path = tmp_path / "minilm.yaml"
    path.write_text(yaml.safe_dump(override))
    return path


def test_minilm_is_ranked_and_verified_on_labelled_text(
    tmp_path: Path, minilm_folder: Path
) -> None:
    override = _override(tmp_path, minilm_folder)
    dry = snakemake(tmp_path, "-n", "-p", *TARGETS, extra_configfiles=(override,))
    assert planned_jobs(dry)["recommend"] == 1
    # The encoder is ranked on the labelled text, not by recommend --text on the text file.
    everything = planned_jobs(snakemake(tmp_path, "-n", "all", extra_configfiles=(override,)))
    assert everything["text_plasticity"] == 1 and "recommend_text" not in everything
    command = next(
        line for line in dry.stdout.splitlines() if "vitplasticity recommend --model" in line
    )
    assert f"--labelled-text {tmp_path / 'licences.csv'}" in command
    assert f"--tokenizer auto --sequence-length {LENGTH}" in command
    assert f"--reference {tmp_path / 'reference.txt'}" in command
    assert "--n-pairs 8 --batch-size 4 --batches 2 --warmup-steps 4 " in command

    start = time.monotonic()
    result = snakemake(tmp_path, *TARGETS, extra_configfiles=(override,))
    elapsed = time.monotonic() - start
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    print(f"snakemake ran the MiniLM targets in {elapsed:.0f} s")

    plasticity = pl.read_parquet(tmp_path / TARGETS[0])
    assert plasticity.height > 0
    numbers = plasticity.select(pl.selectors.float())
    assert numbers.width > 0 and all(numbers[c].is_finite().all() for c in numbers.columns)

    ranking = pl.read_parquet(tmp_path / f"{RANKING}.parquet")
    assert set(ranking["criterion"]) == set(RECOMMEND_CRITERIA)
    report = (tmp_path / f"{RANKING}.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| rank |"))
    for criterion in RECOMMEND_CRITERIA:
        assert f" {REGISTRY[criterion].label} |" in header, criterion
    assert "3 classes (GFDL-1.3, GPL-3, MPL-2.0)" in report
    # What every configuration trains beside its components, module by module: the new head
    # and the checkpoint's own pooler.
    assert "`bert.pooler` (147,840 parameters), `classifier` (1,155 parameters)" in report

    verified = pl.read_parquet(tmp_path / f"{RANKING}_verified.parquet")
    candidates = json.loads(
        (tmp_path / f"{RESULTS}/verify/{MODEL}/{LABELLED}/candidates.json").read_text()
    )
    assert sorted(verified["configuration"]) == sorted(c["configuration"] for c in candidates)
    assert {"head", "lora"} <= set(verified["configuration"])
    measured = {}
    for row in verified.iter_rows(named=True):
        run = f"{RESULTS}/finetune/{EXPERIMENT}/{MODEL}/{LABELLED}/{row['configuration']}"
        survivor = tmp_path / run / f"lr{row['lr']:g}_seed0"
        summary = json.loads((survivor / "summary.json").read_text())
        # The runs are sequence classifiers of the labelled text, trained the full budget.
        resolved = summary["settings"]["resolved"]
        assert resolved["classifier_class"] == "BertForSequenceClassification"
        assert (resolved["task"], summary["status"]) == ("classification", "completed")
        # One seed: the report's accuracies are the survivor's own, read back.
        assert row["val_accuracy_mean"] == summary["best_val_accuracy"]
        assert row["test_accuracy_mean"] == summary["test_accuracy"]
        measured[row["configuration"]] = (row["lr"], row["val_accuracy_mean"])
    print(f"verified (lr, validation accuracy): {measured}")
    assert "## Recommendation (measured)" in (tmp_path / f"{RANKING}_verified.md").read_text()
