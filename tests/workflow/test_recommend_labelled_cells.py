"""recommend on labelled text (vitplasticity.workflow.recommend_jobs): which models recommend
ranks on which datasets (:func:`recommend_cells`, the one crossing of recommend.models and
recommend.datasets that the targets, the bill and the verification read), the recommend job's
inputs and params for a labelled cell, an encoder left out of recommend --text, and the
parse-time refusals, each naming its keys. The jobs run in
tests/pipeline/test_recommend_labelled_workflow.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from snakemake.iocontainers import Wildcards

from tests.helpers.configs import DEMO, PAPER, load_config, merged, validated
from tests.helpers.labelled_text import write_first_byte_csv
from tests.helpers.text_entries import BERT, GPT2, labelled_dataset, text_dataset
from tests.helpers.workflow import planned_jobs, snakemake
from vitplasticity.recommend.settings import RecommendImageSettings
from vitplasticity.workflow.bill import compute_bill
from vitplasticity.workflow.config_check import config_problems
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.datasets import DatasetJobs
from vitplasticity.workflow.finetune_jobs import FinetuneJobs
from vitplasticity.workflow.recommend_jobs import (
    recommend_cells,
    recommend_params,
    recommend_text_models,
)
from vitplasticity.workflow.targets import Targets
from vitplasticity.workflow.verify_jobs import VerifyJobs, verify_problems

# A transformers checkpoint whose config.json its job reads: it takes images and text as far
# as the config knows, so recommend ranks it on both kinds.
HUB = {"family": "transformers", "hf_id": "org/some-model", "weights": "hub"}
MODELS = ["demo_vit", "tiny_gpt2", "tiny_bert", "hub"]
DATASETS = ["demo-stripes", "reviews", "notes"]


def _edit_of(tmp_path: Path, **recommend: Any) -> dict[str, Any]:
    """A config edit: text models, a labelled CSV (``reviews``), a text file (``notes``, text
    plasticity's reference), recommend enabled on ``recommend`` over every model and the image
    and labelled datasets."""
    notes = tmp_path / "notes.txt"
    notes.write_text("some text to measure against\n" * 20)
    reviews = write_first_byte_csv(tmp_path / "reviews.csv")
    return {
        "models": {"tiny_gpt2": GPT2, "tiny_bert": BERT, "hub": HUB},
        "datasets": {
            "reviews": labelled_dataset(reviews, tokenizer="bytes", sequence_length=12),
            "notes": text_dataset(notes, sequence_length=12),
        },
        "text_plasticity": {"reference": "notes"},
        "recommend": {
            "enabled": True,
            "models": MODELS,
            "datasets": ["demo-stripes", "reviews"],
            **recommend,
        },
    }


def _config(tmp_path: Path, edit: dict[str, Any] | None = None, **recommend: Any) -> dict:
    """The demo's config with :func:`_edit_of` (``recommend``) and ``edit`` merged over it."""
    base = _edit_of(tmp_path, **recommend)
    return validated(merged(merged(load_config(PAPER, DEMO), base), edit or {}))


def test_each_model_is_ranked_on_the_datasets_of_a_kind_it_takes(tmp_path: Path) -> None:
    config = _config(tmp_path)
    ranked = set(recommend_cells(config, MODELS, DATASETS))
    # A timm model takes images, a text model (config.model_type) labelled text, a checkpoint
    # that does not tell both; a text file is recommend --text's, never recommend's.
    expected = {
        ("demo_vit", "demo-stripes"),
        ("tiny_gpt2", "reviews"),
        ("tiny_bert", "reviews"),
        ("hub", "demo-stripes"),
        ("hub", "reviews"),
    }
    assert ranked == expected
    assert recommend_cells(config) == [
        c for c in recommend_cells(config, MODELS, DATASETS) if c[1] != "notes"
    ]
    assert recommend_cells(config, ["undefined"], DATASETS) == []


def test_the_targets_the_bill_and_the_verification_take_recommends_cells(tmp_path: Path) -> None:
    config = _config(tmp_path)
    results = config["paths"]["results"]
    targets = Targets(config).recommend()
    assert sorted({path.rsplit(".", 1)[0] for path in targets}) == sorted(
        f"{results}/recommend/{m}/{d}" for m, d in recommend_cells(config)
    )
    assert len(targets) == 5 * len(recommend_cells(config))
    bill = compute_bill(config, JobRuntimes(config))
    billed = {line.model: line.runs for line in bill.lines if line.rule == "recommend"}
    assert billed == {"demo_vit": 1, "tiny_gpt2": 1, "tiny_bert": 1, "hub": 2}
    config["recommend"]["verify"].update(enabled=True, models=["tiny_bert", "demo_vit"])
    assert VerifyJobs(config).cells() == [("tiny_bert", "reviews"), ("demo_vit", "demo-stripes")]


def test_a_labelled_cell_ranks_against_the_text_reference_cut_as_its_dataset(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, {"text_plasticity": {"n_pairs": 24}})
    labelled = Wildcards(fromdict={"model": "tiny_bert", "dataset": "reviews"})
    images = Wildcards(fromdict={"model": "demo_vit", "dataset": "demo-stripes"})
    data = DatasetJobs(config)
    assert data.recommend_reference(labelled) == str(tmp_path / "notes.txt")
    assert data.recommend_reference(images) == data.reference_file()
    jobs = FinetuneJobs(config)
    # The labelled dataset's own cut (bytes, 12), not the reference dataset's (auto, 12).
    assert (jobs.data_flag(labelled), jobs.text_flags(labelled)) == (
        "--labelled-text",
        "--tokenizer bytes --sequence-length 12",
    )
    assert (jobs.data_flag(images), jobs.text_flags(images)) == ("--dataset-dir", "")
    n_pairs = recommend_params(config, RecommendImageSettings)["n_pairs"]
    # recommend.n_pairs null: each kind's measuring stage's pairs.
    assert (n_pairs(labelled), n_pairs(images)) == (24, config["plasticity"]["n_pairs"])
    config["recommend"]["n_pairs"] = 7
    assert (n_pairs(labelled), n_pairs(images)) == (7, 7)


def test_an_encoder_ranked_on_labelled_text_is_left_out_of_recommend_text(
    tmp_path: Path,
) -> None:
    """recommend --text ranks by the next-token loss, which an encoder has not: the encoder
    recommend ranks on labelled text is left to that, a causal LM is ranked both ways."""
    text = {"enabled": True, "run_models": ["tiny_bert", "tiny_gpt2"], "datasets": ["notes"]}
    config = _config(tmp_path, {"text_plasticity": text})
    assert config_problems(config) == []
    assert recommend_text_models(config) == ["tiny_gpt2"]
    assert {path.split("/")[-2] for path in Targets(config).recommend_text()} == {"tiny_gpt2"}
    # Ranked on no labelled text, the encoder is refused by recommend --text, as before.
    config["recommend"]["models"] = ["demo_vit", "tiny_gpt2"]
    (problem,) = config_problems(config)
    assert "'tiny_bert' (tiny-bert): hf_bert refuses recommend by the next-token loss" in problem


def _edit(**blocks: Any) -> Callable[[dict], None]:
    """A config edit: each block's keys set over the config's."""

    def apply(config: dict) -> None:
        for block, values in blocks.items():
            config[block].update(values)

    return apply


@pytest.mark.parametrize(
    ("edit", "messages"),
    [
        (
            _edit(recommend={"models": ["demo_vit"], "datasets": ["reviews"]}),
            [
                "recommend.datasets: 'reviews' is labelled text (source: labelled_text), and "
                "recommend.models = [demo_vit] holds no text model (family: transformers) to "
                "rank on it: add one, or drop the dataset",
                "recommend.models: 'demo_vit' takes images, and recommend.datasets = [reviews] "
                "holds no dataset of that kind",
            ],
        ),
        (
            _edit(recommend={"models": None}),  # plasticity.models: the demo's ViT
            [
                "recommend.datasets: 'reviews' is labelled text (source: labelled_text), and "
                "recommend.models (null: plasticity.models) = [demo_vit] holds no text model"
            ],
        ),
        (
            _edit(recommend={"models": ["demo_vit", "tiny_gpt2"], "datasets": ["demo-stripes"]}),
            [
                "recommend.models: 'tiny_gpt2' is a text model (config.model_type 'gpt2'), "
                "ranked on labelled text (source: labelled_text; text files: "
                "text_plasticity.run_models), and recommend.datasets = [demo-stripes] holds no "
                "dataset of that kind"
            ],
        ),
        (
            _edit(text_plasticity={"reference": None}),
            [
                "text_plasticity.reference: unset, and recommend.datasets ranks labelled text "
                "(reviews) against it: name a datasets: entry of source text_file"
            ],
        ),
        (
            _edit(text_plasticity={"reference": "reviews"}),
            [
                "text_plasticity.reference (recommend's reference text): 'reviews' is a labelled "
                "text dataset (source: labelled_text): this stage takes text files"
            ],
        ),
        (
            _edit(text_plasticity={"reference": "demo-blobs"}),
            [
                "text_plasticity.reference (recommend's reference text): 'demo-blobs' is an "
                "image dataset (source: synthetic)"
            ],
        ),
        (
            _edit(text_plasticity={"reference": "wiki"}),
            ["text_plasticity.reference (recommend's reference text): unknown dataset 'wiki'"],
        ),
        (
            _edit(recommend={"datasets": ["demo-stripes", "reviews", "notes"]}),
            [
                "recommend.datasets: 'notes' is a text dataset (source: text_file): this stage "
                "takes image datasets"
            ],
        ),
        (
            lambda config: config["datasets"]["reviews"].update(sequence_length=64),
            [
                "datasets.reviews.sequence_length: 64 exceeds the 16 positions that "
                "models.tiny_gpt2.config states (recommend ranks it on reviews)",
                "datasets.reviews.sequence_length: 64 exceeds the 16 positions that "
                "models.tiny_bert.config states (recommend ranks it on reviews)",
            ],
        ),
    ],
    ids=[
        "labelled-without-text-model",
        "labelled-with-plasticity-models",
        "text-model-without-labelled",
        "reference-unset",
        "reference-labelled",
        "reference-image",
        "reference-undefined",
        "text-file",
        "longer-than-positions",
    ],
)
def test_a_recommend_that_cannot_rank_is_refused_naming_its_keys(
    tmp_path: Path, edit: Callable[[dict], None], messages: list[str]
) -> None:
    config = _config(tmp_path)
    assert config_problems(config) == []
    edit(config)
    found = [problem.strip() for problem in config_problems(config)]
    for message in messages:
        assert any(message in problem for problem in found), (message, found)
    assert len(found) == len(messages), found


def test_the_reference_sets_pairs_bound_only_an_image_recommend(tmp_path: Path) -> None:
    """recommend.n_pairs beyond reference.n_images: refused where recommend ranks an image
    dataset (pair i starts from reference image i), not where it ranks labelled text alone."""
    config = _config(tmp_path, n_pairs=10**6)
    assert any(p.strip().startswith("recommend.n_pairs: 1000000") for p in config_problems(config))
    config["recommend"]["datasets"] = ["reviews"]
    config["recommend"]["models"] = ["tiny_bert"]
    assert config_problems(config) == []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"recommend": {"verify": {"models": ["demo_vit"], "datasets": ["reviews"]}}},
            "recommend.verify.models: 'demo_vit' pairs with none of the verified datasets",
        ),
        (
            {"recommend": {"verify": {"datasets": ["notes"]}}},
            "recommend.verify.datasets: 'notes' pairs with none of the verified models",
        ),
        # Its runs of labelled text are checked as a text experiment's (it is disabled).
        (
            {"finetune": {"warmup_steps": 10}},
            "finetune.warmup_steps: 10, not fewer than datasets.reviews.steps 10: the runs of "
            "recommend.verify would never reach their learning rate",
        ),
        (
            {"finetune": {"compile": True}},
            "finetune.compile: true, and recommend.verify finetunes text datasets: compile is "
            "not implemented for text runs; set it false or verify no text dataset",
        ),
        (
            {"recommend": {"verify": {"models": ["tiny_bert"]}, "models": ["tiny_gpt2"]}},
            "",  # the verified models need not be recommend's: the cells are paired alike
        ),
    ],
    ids=["model-unpaired", "dataset-unpaired", "warm-up", "compile", "sound"],
)
def test_a_verification_that_cannot_train_is_refused(
    tmp_path: Path, edit: dict[str, Any], message: str
) -> None:
    experiment = {
        "enabled": False,
        "optimizer": "adamw",
        "models": ["tiny_bert"],
        "datasets": ["reviews"],
        "configurations": ["head"],
        "lrs": [0.001, 0.003],
        "seeds": [0],
    }
    verify = {"enabled": True, "experiment": "check", "models": ["tiny_bert", "demo_vit"]}
    base = {"experiments": {"check": experiment}, "finetune": {"warmup_steps": 2}}
    config = _config(tmp_path, merged(base, edit), verify=verify)
    found = verify_problems(config)
    if not message:
        assert found == [] and VerifyJobs(config).cells()[0] == ("tiny_bert", "reviews")
        return
    assert [problem for problem in found if message in problem], found


@pytest.mark.slow
def test_the_recommend_job_of_a_labelled_cell_passes_the_text_flags(tmp_path: Path) -> None:
    """Snakemake's own dry run: the job reads the labelled CSV with its cut and the reference
    text, with the warm-up flags and text plasticity's pairs."""
    config = _config(tmp_path)
    override = _edit_of(tmp_path, models=["tiny_bert"], datasets=["reviews"])
    path = tmp_path / "labelled.yaml"
    path.write_text(yaml.safe_dump(override))
    target = f"{config['paths']['results']}/recommend/tiny_bert/reviews.md"
    dry = snakemake(tmp_path, "-n", "-p", target, extra_configfiles=(path,))
    assert planned_jobs(dry) == {"recommend": 1, "total": 1}
    command = next(line for line in dry.stdout.splitlines() if "vitplasticity recommend " in line)
    assert (
        f"--labelled-text {tmp_path / 'reviews.csv'} --tokenizer bytes --sequence-length 12"
        in command
    )
    assert f"--reference {tmp_path / 'notes.txt'}" in command
    assert f"--n-pairs {config['text_plasticity']['n_pairs']} " in command
    warmup = config["recommend"]["warmup_steps"], config["recommend"]["warmup_lr"]
    assert "--warmup-steps {} --warmup-lr {} ".format(*warmup) in command
