"""The criteria check of a labelled-text experiment, through its commands: the recommend table
the workflow lists for it (vitplasticity.workflow.results.ResultFiles.criteria_recommend),
written by ``vitplasticity recommend --labelled-text`` on a tiny BERT, is scored by
``vitplasticity criteria --selected`` beside the trainable-parameter baseline, as rule
``criteria_stats`` runs them. The workflow's choice of files is
tests/workflow/test_labelled_text_experiments.py's; the statistics are
tests/report/test_criteria.py's."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from snakemake.iocontainers import Wildcards

from tests.helpers.configs import DEMO, PAPER, load_config, merged, validated
from tests.helpers.labelled_text import write_first_byte_csv
from tests.helpers.report_inputs import write_grid
from tests.helpers.text_entries import BERT, labelled_dataset, text_dataset
from vitplasticity.cli import main
from vitplasticity.criteria import PARAMETERS
from vitplasticity.recommend.ranking import CRITERIA
from vitplasticity.report.aggregate import collect_runs, select_learning_rates
from vitplasticity.utils.io import write_parquet
from vitplasticity.workflow.config_check import check_config
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.results import ResultFiles

pytest.importorskip("transformers", reason="the text model is transformers'")

EXPERIMENT = "cls"
LENGTH = 12


def _config(tmp_path: Path) -> dict:
    """The demo's config with a labelled-text experiment of a tiny BERT that recommend ranks
    on its labelled CSV (against a text file as the reference text), its criteria the
    recommend tables and the parameter baseline."""
    notes = tmp_path / "notes.txt"
    notes.write_text("".join(f"reference line {i} of plain words\n" for i in range(40)))
    reviews = write_first_byte_csv(tmp_path / "reviews.csv", rows=40)
    edit = {
        "paths": {"results": str(tmp_path / "results")},
        "models": {"tiny_bert": BERT},
        "datasets": {
            "reviews": labelled_dataset(reviews, tokenizer="bytes", sequence_length=LENGTH),
            "notes": text_dataset(notes, sequence_length=LENGTH),
        },
        "experiments": {
            EXPERIMENT: {
                "optimizer": "adamw",
                "models": ["tiny_bert"],
                "datasets": ["reviews"],
                "configurations": ["ln1", "mha", "ln2", "fc1", "fc2"],
                "lrs": [1e-3, 3e-3],
                "seeds": [0, 1],
            }
        },
        "text_plasticity": {"reference": "notes"},
        "recommend": {"enabled": True, "models": ["tiny_bert"], "datasets": ["reviews"]},
        "report": {"criteria": {"enabled": True, "experiments": [EXPERIMENT]}},
    }
    config = validated(merged(load_config(PAPER, DEMO), edit))
    check_config(config)
    return config


def _recommend(config: dict, prefix: str) -> None:
    """Run ``vitplasticity recommend`` on the labelled cell as rule ``recommend`` does (its
    model spec, the dataset's cut, the reference text), small and on the CPU."""
    reviews, notes = config["datasets"]["reviews"], config["datasets"]["notes"]
    spec = ModelJobs(config).compute_spec("tiny_bert")
    argv = ["recommend", "--model", "tiny_bert", "--model-spec", spec, "--dataset", "reviews",
            "--labelled-text", reviews["path"], "--tokenizer", "bytes", "--sequence-length",
            str(LENGTH), "--reference", notes["path"], "--n-pairs", "8",
            "--batch-size", "4", "--batches", "2", "--warmup-steps", "2", "--device", "cpu",
            "--out-prefix", prefix]  # fmt: skip
    assert main(argv) == 0


def _selected(config: dict, root: Path) -> Path:
    """The experiment's selected-LR table, aggregated from run summaries of its grid (seeded
    accuracies: what the criteria are scored against, not what they predict)."""
    exp = config["experiments"][EXPERIMENT]
    summaries = write_grid(
        root / "finetune",
        experiment=EXPERIMENT,
        optimizer=exp["optimizer"],
        models=tuple(exp["models"]),
        datasets=tuple(exp["datasets"]),
        configurations=tuple(exp["configurations"]),
        lrs=tuple(exp["lrs"]),
        seeds=tuple(exp["seeds"]),
    )
    path = root / "aggregate" / f"{EXPERIMENT}_selected.parquet"
    write_parquet(path, select_learning_rates(collect_runs(summaries)))
    return path


def test_a_labelled_experiment_is_scored_by_the_recommend_table_written_on_its_text(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    files = ResultFiles(config)
    job = Wildcards(fromdict={"experiment": EXPERIMENT})
    (table,) = files.criteria_recommend(job)
    _recommend(config, table.removesuffix(".parquet"))
    results = Path(config["paths"]["results"])
    out = results / "stats" / f"{EXPERIMENT}_criteria.parquet"
    argv = ["criteria", "--selected", str(_selected(config, results)), "--plasticity",
            *files.criteria_plasticity(job), "--recommend", table, "--out", str(out)]  # fmt: skip
    assert main(argv) == 0

    per = pl.read_parquet(out).filter(pl.col("level") == "dataset")
    assert set(per["criterion"]) == {*CRITERIA, PARAMETERS}
    assert set(per.select("experiment", "model", "dataset").iter_rows()) == {
        (EXPERIMENT, "tiny_bert", "reviews")
    }
    # Recommend's plasticity and gradient criteria value every component: each is a
    # correlation over the five, as the baseline is.
    for criterion in ("plasticity", "relative_gradient_norm", PARAMETERS):
        (row,) = per.filter(pl.col("criterion") == criterion).iter_rows(named=True)
        assert row["n"] == 5, row
