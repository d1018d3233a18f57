"""Text classification through Snakemake: an experiment of labelled text (a CSV of documents
and labels), run by the finetune rules every experiment's runs go through (packed, as the demo
packs them), on a tiny random-init GPT2 and a tiny bare BERT each inside its
sequence-classification class, and read by the accuracy report as an image experiment is: its
accuracy table holds the runs' test accuracies, and the criteria score its trainable-parameter
baseline. Editing finetune.mask_probability, which only a text file's encoder runs use, reruns
none of it."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.helpers.labelled_text import write_first_byte_csv
from tests.helpers.text_entries import BERT, GPT2, labelled_dataset
from tests.helpers.workflow import planned_jobs, snakemake
from vitplasticity.report.style import label

pytestmark = pytest.mark.slow

MODELS = {"tiny_gpt2": GPT2, "tiny_bert": BERT}
# Three components: the criteria correlate three configurations at least.
CONFIGURATIONS = ["head", "ln1", "mha", "fc1"]
EXPERIMENT = "cls"
DATASET = "first_byte"
RESULTS = "results/demo"
TABLE = [f"{RESULTS}/tables/{EXPERIMENT}_accuracy.{fmt}" for fmt in ("tex", "csv")]
CRITERIA = f"{RESULTS}/stats/{EXPERIMENT}_criteria.parquet"
TARGETS = [*TABLE, CRITERIA]


def _override(tmp_path: Path, mask_probability: float = 0.15) -> Path:
    """A labelled-text experiment over the mini preset (whose finetune keys the runs take),
    its runs packed (finetune.pack_runs), with ``mask_probability``."""
    data = write_first_byte_csv(tmp_path / "first_byte.csv")
    entry = labelled_dataset(data, tokenizer="bytes", sequence_length=12, steps=20, val_every=10)
    override = {
        "models": MODELS,
        "datasets": {DATASET: entry},
        "finetune": {"pack_runs": True, "mask_probability": mask_probability},
        "report": {"criteria": {"enabled": True, "experiments": [EXPERIMENT]}},
        "experiments": {
            EXPERIMENT: {
                "optimizer": "adamw",
                "models": list(MODELS),
                "datasets": [DATASET],
                "configurations": CONFIGURATIONS,
                "lrs": [0.003],
                "seeds": [0],
            }
        },
    }
    path = tmp_path / f"labelled_mask{mask_probability}.yaml"
    path.write_text(yaml.safe_dump(override))
    return path


def _table_cells(csv_text: str) -> dict[tuple[str, str], dict[str, str]]:
    """The accuracy table's CSV rows by (model, row name), its DEMO comment line skipped."""
    lines = [line for line in csv_text.splitlines() if not line.startswith("#")]
    return {
        (row["Model"], row["Dataset"]): row for row in csv.DictReader(io.StringIO("\n".join(lines)))
    }


def test_the_accuracy_report_reads_a_labelled_text_experiments_runs(tmp_path: Path) -> None:
    override = _override(tmp_path)
    dry = snakemake(tmp_path, "-n", "-p", *TARGETS, extra_configfiles=(override,))
    jobs = planned_jobs(dry)
    # Packed: one job per (model, dataset), as an image experiment's.
    packs = {name: count for name, count in jobs.items() if name.startswith("finetune_pack_")}
    assert sum(packs.values()) == len(MODELS), jobs
    assert jobs["aggregate_experiment"] == jobs["table_accuracy"] == 1, jobs
    output = dry.stdout + dry.stderr
    assert f"--labelled-text {tmp_path / 'first_byte.csv'}" in output
    assert "--tokenizer bytes --sequence-length 12 " in output
    assert "--mask-probability" not in output  # a classifier masks nothing
    everything = planned_jobs(snakemake(tmp_path, "-n", "all", extra_configfiles=(override,)))
    assert "text_criteria" not in everything  # it reads language-model experiments only

    result = snakemake(tmp_path, *TARGETS, extra_configfiles=(override,))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    cells = _table_cells((tmp_path / TABLE[1]).read_text())
    for model in MODELS:
        for configuration in CONFIGURATIONS:
            run = f"{RESULTS}/finetune/{EXPERIMENT}/{model}/{DATASET}/{configuration}/lr0.003_seed0"
            summary = json.loads((tmp_path / run / "summary.json").read_text())
            task = summary["settings"]["resolved"]["task"]
            assert (task, summary["status"]) == ("classification", "completed")
            # One seed and one learning rate: the table's cell is the run's test accuracy.
            shown = cells[(model, DATASET)][label(configuration)]
            assert shown == f"{100 * summary['test_accuracy']:.1f}", (model, configuration)
    tex = (tmp_path / TABLE[0]).read_text()
    assert tex.startswith("% DEMO") and f"{EXPERIMENT}-accuracy" in tex
    # Plasticity measures images and text files, and recommend ranks the preset's image
    # datasets, not this one (recommend.datasets null): the baseline is the criterion.
    scores = pl.read_parquet(tmp_path / CRITERIA).filter(pl.col("level") == "dataset")
    assert set(scores["criterion"]) == {"trainable_parameters"}
    assert set(scores["model"]) == set(MODELS)

    # The mask probability reaches no classification run: nothing to redo.
    edited = _override(tmp_path, mask_probability=0.3)
    assert planned_jobs(snakemake(tmp_path, "-n", *TARGETS, extra_configfiles=(edited,))) == {}
