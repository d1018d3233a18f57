"""An experiment of labelled text (``source: labelled_text``): its runs are the finetune rules'
jobs with the table or folder as their input, ``--labelled-text`` and the cut as their flags
but no masks (vitplasticity.workflow.finetune_jobs); the accuracy report reads it as an image
experiment, its criteria are recommend's tables of the cells recommend ranks on its labelled
text (and the parameter baseline), and the text criteria check leaves it out
(vitplasticity.workflow.experiments, .results, .targets); its problems are named before any
job (vitplasticity.workflow.dataset_kinds)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from snakemake.iocontainers import Wildcards

from tests.helpers.configs import DEMO, PAPER, load_config, merged, validated
from tests.helpers.labelled_text import write_first_byte_csv
from tests.helpers.text_entries import BERT, GPT2, labelled_dataset, text_dataset
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config
from vitplasticity.workflow.datasets import DatasetJobs
from vitplasticity.workflow.experiments import (
    classification_experiments,
    criteria_experiments,
    image_experiments,
    language_model_experiments,
    stats_experiments,
)
from vitplasticity.workflow.finetune_jobs import FinetuneJobs
from vitplasticity.workflow.results import ResultFiles
from vitplasticity.workflow.targets import Targets

EXPERIMENT = "cls"
RUN = {"experiment": EXPERIMENT, "model": "tiny_bert", "dataset": "reviews", "lr": "0.001"}


def _config(tmp_path: Path, dataset: dict | None = None, **block: Any) -> dict:
    """The demo's config with a labelled-text experiment on a CSV in ``tmp_path`` (its entry
    edited by ``dataset``, a key given None removed; the experiment by ``block``), and a text
    file beside it."""
    notes = tmp_path / "notes.txt"
    notes.write_text("some text\n")
    reviews = write_first_byte_csv(tmp_path / "reviews.csv")
    entry = labelled_dataset(reviews, tokenizer="bytes", sequence_length=12)
    edit = {
        "models": {"tiny_gpt2": GPT2, "tiny_bert": BERT},
        "datasets": {
            "reviews": {k: v for k, v in {**entry, **(dataset or {})}.items() if v is not None},
            "notes": text_dataset(notes, sequence_length=12),
        },
        "finetune": {"warmup_steps": 2, "mask_probability": 0.25},
        "experiments": {
            EXPERIMENT: {
                "optimizer": "adamw",
                "models": ["tiny_gpt2", "tiny_bert"],
                "datasets": ["reviews"],
                "configurations": ["mha", "fc1"],
                "lrs": [1e-3],
                "seeds": [0, 1],
                **block,
            }
        },
    }
    return validated(merged(load_config(PAPER, DEMO), edit))


def _evaluated(params: dict[str, Any], wildcards: Wildcards) -> dict[str, Any]:
    return {k: v(wildcards) if callable(v) else v for k, v in params.items()}


def test_a_labelled_experiment_is_run_by_the_finetune_rules_and_read_as_an_image_one(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    check_config(config)
    assert EXPERIMENT in classification_experiments(config)
    assert EXPERIMENT in stats_experiments(config)  # the demo's reference component is mha
    assert EXPERIMENT not in language_model_experiments(config)
    assert EXPERIMENT not in image_experiments(config)  # its models are text models
    targets = Targets(config)
    results = config["paths"]["results"]
    runs = targets.finetune(EXPERIMENT)
    assert len(runs) == 2 * 1 * 2 * 1 * 2
    assert f"{results}/finetune/cls/tiny_bert/reviews/fc1/lr0.001_seed1/summary.json" in runs
    report = targets.report()
    for name in (
        "aggregate/runs.parquet",
        f"aggregate/{EXPERIMENT}_selected.parquet",
        f"tables/{EXPERIMENT}_accuracy.tex",
        f"tables/{EXPERIMENT}_accuracy.csv",
        f"tables/{EXPERIMENT}_wilcoxon.tex",
        f"stats/{EXPERIMENT}_wilcoxon.parquet",
    ):
        assert f"{results}/{name}" in report, name
    assert not [t for t in targets.criteria() if f"/stats/{EXPERIMENT}/" in t]
    job = Wildcards(fromdict=RUN)
    assert DatasetJobs(config).dataset(job) == str(tmp_path / "reviews.csv")
    params = FinetuneJobs(config).params()
    assert params["data_flag"](job) == "--labelled-text"
    assert params["text_flags"](job) == "--tokenizer bytes --sequence-length 12"
    # The image loader's settings reach image runs only: a classification run gets the defaults.
    config["finetune"]["num_workers"] = 7
    assert FinetuneJobs(config).params()["num_workers"](job) == 4


def test_editing_the_mask_probability_changes_no_classification_runs_params(
    tmp_path: Path,
) -> None:
    """Snakemake reruns a job whose params changed: a classifier masks nothing, so its params
    stay as they were while a text-file run's (its masks) change."""
    config = _config(tmp_path)
    text = Wildcards(fromdict={**RUN, "experiment": "lm", "dataset": "notes"})
    labelled = Wildcards(fromdict=RUN)
    config["experiments"]["lm"] = {**config["experiments"][EXPERIMENT], "datasets": ["notes"]}
    before = [_evaluated(FinetuneJobs(config).params(), job) for job in (labelled, text)]
    config["finetune"]["mask_probability"] = 0.4
    after = [_evaluated(FinetuneJobs(config).params(), job) for job in (labelled, text)]
    assert after[0] == before[0]
    assert after[1]["text_flags"].endswith("--mask-probability 0.4") and after[1] != before[1]


def test_a_labelled_experiment_is_scored_by_recommends_tables_of_the_cells_it_ranks(
    tmp_path: Path,
) -> None:
    """Plasticity measures images and text files: a labelled-text experiment's criteria are
    recommend's tables of the cells recommend ranks on its labelled text, and the
    trainable-parameter baseline. Without a ranked cell it is scored by the baseline alone, or
    not at all; with one, by recommend's table of that cell alone when the baseline is off."""
    criteria = {"enabled": True, "experiments": [EXPERIMENT], "parameters": True}
    config = merged(_config(tmp_path), {"report": {"criteria": criteria}})
    check_config(config)
    job = Wildcards(fromdict={"experiment": EXPERIMENT})
    assert criteria_experiments(config) == [EXPERIMENT]
    files = ResultFiles(config)
    assert (files.criteria_plasticity(job), files.criteria_recommend(job)) == ([], [])
    config["report"]["criteria"]["parameters"] = False
    assert config["recommend"]["enabled"]  # the demo's: it ranks the image datasets alone
    assert criteria_experiments(config) == []

    # recommend ranks one of the experiment's two models on its labelled dataset, against the
    # text file as reference text (the parse-time check asks for one).
    ranked = {"models": ["tiny_bert"], "datasets": ["reviews"]}
    config = merged(config, {"recommend": ranked, "text_plasticity": {"reference": "notes"}})
    check_config(config)
    assert criteria_experiments(config) == [EXPERIMENT]  # the baseline still off
    results = config["paths"]["results"]
    files = ResultFiles(config)
    assert files.criteria_recommend(job) == [f"{results}/recommend/tiny_bert/reviews.parquet"]
    assert files.criteria_plasticity(job) == []
    # The table the check reads is one recommend's own rule writes.
    assert f"{results}/recommend/tiny_bert/reviews.parquet" in Targets(config).recommend()
    config["recommend"]["enabled"] = False  # recommend's tables are read only when it runs
    assert (criteria_experiments(config), files.criteria_recommend(job)) == ([], [])


Layout = Callable[[Path], Path]


def _tables(root: Path) -> Path:
    root.mkdir()
    for split in ("train", "test"):
        write_first_byte_csv(root / f"{split}.csv", rows=8)
    (root / "test.csv").rename(root / "test.jsonl")  # the reader takes either suffix
    return root


def _class_folders(root: Path, splits: tuple[str, ...] = ("",)) -> Path:
    for split in splits:
        for label in ("odd", "even"):
            folder = root / split / label
            folder.mkdir(parents=True)
            (folder / "a.txt").write_text(f"x {label}")
    return root


LAYOUTS: dict[str, Layout] = {
    "jsonl": lambda tmp: _jsonl(tmp / "reviews.jsonl"),
    "train-and-test-tables": lambda tmp: _tables(tmp / "tables"),
    "class-folders": lambda tmp: _class_folders(tmp / "classes"),
    "train-and-test-class-folders": lambda tmp: _class_folders(tmp / "split", ("train", "test")),
}


def _jsonl(path: Path) -> Path:
    path.write_text('{"text": "x", "label": "odd"}\n{"text": "y", "label": "even"}\n')
    return path


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_each_layout_of_the_reader_is_accepted_and_read_where_it_is(
    tmp_path: Path, layout: str
) -> None:
    path = LAYOUTS[layout](tmp_path)
    config = _config(tmp_path, dataset={"path": str(path)})
    check_config(config)
    assert DatasetJobs(config).dataset(Wildcards(fromdict=RUN)) == str(path)


def _edit(tmp: Path, edit: dict) -> dict:
    """``edit`` with ``{tmp}`` in its strings made the test's folder."""
    return {
        key: _edit(tmp, value) if isinstance(value, dict) else _placed(tmp, value)
        for key, value in edit.items()
    }


def _placed(tmp: Path, value: Any) -> Any:
    return value.replace("{tmp}", str(tmp)) if isinstance(value, str) else value


@pytest.mark.parametrize(
    ("block", "files", "message"),
    [
        ({"datasets": ["reviews", "cifar10"]}, None, "experiments.cls.datasets: labelled text datasets of source labelled_text (reviews) and image datasets (cifar10): an experiment finetunes on one kind; split it in two"),
        ({"datasets": ["notes", "reviews"]}, None, "experiments.cls.datasets: text datasets of source text_file (notes) and labelled text datasets of source labelled_text (reviews)"),
        ({"datasets": ["cifar10", "reviews", "notes"]}, None, "image datasets (cifar10) and labelled text datasets of source labelled_text (reviews) and text datasets of source text_file (notes): an experiment finetunes on one kind; split it in three"),
        ({"models": ["tiny_bert", "vit_base"]}, None, "experiments.cls.models: 'vit_base' takes images, and experiments.cls.datasets are text datasets (reviews): a text experiment finetunes transformers text models"),
        ({"dataset": {"path": "{tmp}/none.csv"}}, None, "datasets.reviews.path: '{tmp}/none.csv' does not exist: give a .csv or .jsonl file with text and label columns, or a folder of train and test ones or of <class>/<document>.txt files"),
        ({"dataset": {"path": "{tmp}/notes.txt"}}, None, "datasets.reviews.path: '{tmp}/notes.txt' is a .txt file, not a .csv or .jsonl table: give"),
        ({"dataset": {"path": "{tmp}/empty"}}, ["empty/train.csv"], "datasets.reviews.path: '{tmp}/empty' is a folder of neither train and test tables (train.csv and test.csv, or .jsonl) nor <class>/<document>.txt files"),
        ({"dataset": {"path": "{tmp}/split"}}, ["split/train/odd/a.txt", "split/test/odd/a.md"], "datasets.reviews.path: '{tmp}/split' is a folder whose test/ holds no <class>/<document>.txt files"),
        ({"dataset": {"path": None}}, None, "datasets.reviews.path: missing: a labelled_text dataset reads its documents from path: give a .csv or .jsonl file"),
        ({"dataset": {"sequence_length": 20}}, None, "datasets.reviews.sequence_length: 20 exceeds the 16 positions that models.tiny_gpt2.config states (experiments.cls finetunes it on reviews)"),
        ({"dataset": {"steps": 2}}, None, "finetune.warmup_steps: 2, not fewer than datasets.reviews.steps 2: the runs of experiments.cls would never reach their learning rate"),
        ({"plasticity": {"datasets": ["reviews"]}}, None, "plasticity.datasets: 'reviews' is a text dataset (source: labelled_text): this stage takes image datasets"),
        ({"text_plasticity": {"enabled": True, "run_models": ["tiny_gpt2"], "reference": "notes", "datasets": ["reviews"]}}, None, "text_plasticity.datasets: 'reviews' is a labelled text dataset (source: labelled_text): this stage takes text files"),
        ({"text_plasticity": {"enabled": True, "run_models": ["tiny_gpt2"], "reference": "reviews", "datasets": ["notes"]}}, None, "text_plasticity.reference: 'reviews' is a labelled text dataset (source: labelled_text)"),
    ],
    ids=[
        "with-images", "with-a-text-file", "three-kinds", "image-model", "path-missing",
        "path-a-text-file", "folder-of-neither", "test-folder-without-documents", "no-path",
        "sequence-past-positions", "warmup-past-steps", "image-stage", "text-plasticity-dataset",
        "text-plasticity-reference",
    ],
)  # fmt: skip
def test_each_problem_is_named_before_any_job(
    tmp_path: Path, block: dict, files: list[str] | None, message: str
) -> None:
    for name in files or []:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    edit = _edit(tmp_path, block)
    stages = {k: edit.pop(k) for k in ("plasticity", "text_plasticity") if k in edit}
    config = merged(_config(tmp_path, **edit), stages)
    with pytest.raises(ConfigError, match="invalid config") as error:
        check_config(config)
    assert _placed(tmp_path, message) in str(error.value)
