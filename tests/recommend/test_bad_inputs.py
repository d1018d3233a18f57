"""Bad inputs of ``recommend``, ``recommend --text``, ``vitplasticity.select`` and the output
paths of ``finetune`` and ``plasticity --text`` (issue 27): each ends in one clear error naming
the culprit, before any compute, with nothing written.

One table per way in: CLI rows run ``vitplasticity`` in-process (exit status 2, exactly one
ERROR line, no exception escaping, the culprit and the words named, the output folder left
empty); config rows call the workflow's parse-time check on the demo config with one edit;
call rows call the Python API.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.helpers.cli_errors import refusal
from tests.helpers.configs import DEMO, PAPER, dry_run, load_config, merged, validated
from tests.helpers.images import image_folder
from tests.helpers.text_entries import text_dataset
from tests.helpers.tiny_models import GPT2_TINY_CONFIG, HF_TEXT_TINY_CONFIG
from tests.helpers.tiny_vit import TINY_VIT_KWARGS
from vitplasticity.recommend.criteria import CRITERIA
from vitplasticity.recommend.ranking import TABLE_SCHEMA, Recommendation, markdown

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT_WRITES = pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")

TIMM = ["--timm-id", "vit_tiny_patch16_224", "--weights", "random"]
TIMM += ["--model-kwargs", json.dumps(TINY_VIT_KWARGS), "--model", "tiny"]
FAST = ["--batch-size", "4", "--batches", "2", "--warmup-steps", "1", "--device", "cpu"]

RANDOM_GPT2 = {
    "family": "transformers",
    "hf_id": "tiny-gpt2",
    "weights": "random",
    "config": {"model_type": "gpt2", **GPT2_TINY_CONFIG},
    "model_class": "GPT2Model",
}
"""A random GPT2 of 16 positions (its config says so)."""

UNTIED_LLAMA = {
    "family": "transformers",
    "hf_id": "tiny-llama",
    "weights": "random",
    "config": {"model_type": "llama", **HF_TEXT_TINY_CONFIG, "tie_word_embeddings": False},
    "model_class": "LlamaModel",
}
"""A bare Llama whose config unties its LM head: the head's weights are in no bare model."""


@dataclass(frozen=True)
class CliCase:
    """A command on one bad input, and what its one error line must say."""

    argv: list[str]
    culprit: str  # the flag, file or folder the error names
    says: str
    outputs: Path  # where the command writes: must stay empty


def _write_texts(root: Path) -> tuple[Path, Path]:
    root.mkdir(parents=True, exist_ok=True)
    reference, user = root / "reference.txt", root / "notes.txt"
    reference.write_text("".join(f"the reference line {i}\n" for i in range(40)))
    user.write_text("".join(f"a note {i} on cats\n" for i in range(40)))
    return reference, user


def _recommend(tmp_path: Path, *extra: str, prefix: Path | str | None = None) -> list[str]:
    """A small recommend on an image folder against generated reference images."""
    folder = tmp_path / "pets"
    if not folder.exists():
        image_folder(folder, per_class=3)
    prefix = tmp_path / "out" / "pets" if prefix is None else prefix
    argv = ["recommend", *TIMM, "--image-folder", str(folder)]
    argv += ["--reference-fallback", "synthetic", "--n-pairs", "4", *FAST]
    return [*argv, *extra, "--out-prefix", str(prefix)]


def _recommend_text(tmp_path: Path, spec: dict, *extra: str, prefix: Path | None = None) -> list:
    reference, user = _write_texts(tmp_path / "text")
    prefix = tmp_path / "out" / "notes" if prefix is None else prefix
    argv = ["recommend", "--model", "tiny_lm", "--model-spec", json.dumps(spec)]
    argv += ["--reference", str(reference), "--text", str(user), "--sequence-length", "8"]
    argv += ["--n-pairs", "4", "--batch-size", "2", "--batches", "2", "--device", "cpu"]
    return [*argv, *extra, "--out-prefix", str(prefix)]


def nfn_with_norms_only(tmp_path: Path) -> CliCase:
    argv = _recommend(tmp_path, "--criterion", "nfn", "--configurations", "ln1", "ln2", "ln1+ln2")
    return CliCase(
        argv,
        "--criterion nfn",
        "NFN is n/a for norms (they hold no linear map), and --configurations ln1 ln2 ln1+ln2 "
        "holds norms only",
        tmp_path / "out",
    )


def image_folder_with_text_files(tmp_path: Path) -> CliCase:
    folder = image_folder(tmp_path / "pets", per_class=3)
    for name in ("cat/notes.txt", "dog/labels.csv", "README.txt"):
        (folder / name).write_text("not an image")
    (folder / "cat" / ".DS_Store").write_bytes(b"\0")  # the system's: passed over
    return CliCase(
        _recommend(tmp_path),
        f"--image-folder {folder}",
        "3 file(s) are not images (.bmp .gif .jpeg .jpg .png .webp): README.txt, cat/notes.txt, "
        "dog/labels.csv; remove them",
        tmp_path / "out",
    )


def empty_budget(tmp_path: Path) -> CliCase:
    return CliCase(
        _recommend(tmp_path, "--budget", ""),
        "--budget (recommend.budget)",
        "budget '' is empty: give a parameter count",
        tmp_path / "out",
    )


def combine_without_budget(tmp_path: Path) -> CliCase:
    return CliCase(
        _recommend(tmp_path, "--combine"),
        "--combine",
        "needs --budget",
        tmp_path / "out",
    )


def out_prefix_a_folder_by_its_slash(tmp_path: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir()
    return CliCase(
        _recommend(tmp_path, prefix=f"{out}/"),
        f"--out-prefix {out}/",
        "a folder, but the outputs are files PREFIX.md",
        out,
    )


def out_prefix_an_existing_folder(tmp_path: Path) -> CliCase:
    out = tmp_path / "out"
    (out / "pets").mkdir(parents=True)
    return CliCase(
        _recommend(tmp_path, prefix=out / "pets"),
        f"--out-prefix {out / 'pets'}",
        "a folder, but the outputs are files PREFIX.md",
        out / "pets",
    )


def out_prefix_below_a_file(tmp_path: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    prefix = out / "notes.txt" / "tiny" / "pets"
    return CliCase(
        _recommend(tmp_path, prefix=prefix),
        f"cannot write {prefix}.md",
        f"Not a directory ({out / 'notes.txt'}, from --out-prefix)",
        out / "tiny",
    )


def out_prefix_in_a_read_only_folder(tmp_path: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir(mode=0o555)
    return CliCase(
        _recommend(tmp_path, prefix=out / "pets"),
        f"cannot write {out / 'pets'}.md",
        f"Permission denied ({out}, from --out-prefix)",
        out,
    )


def text_out_prefix_below_a_file(tmp_path: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    prefix = out / "notes.txt" / "notes"
    return CliCase(
        _recommend_text(tmp_path, RANDOM_GPT2, prefix=prefix),
        f"cannot write {prefix}.md",
        f"Not a directory ({out / 'notes.txt'}, from --out-prefix)",
        out / "text",
    )


def untied_bare_decoder(tmp_path: Path) -> CliCase:
    return CliCase(
        _recommend_text(tmp_path, UNTIED_LLAMA),
        "--model-spec of model 'tiny_lm'",
        "LlamaModel has no LM head and its config unties it (tie_word_embeddings false)",
        tmp_path / "out",
    )


def text_sequence_beyond_the_positions(tmp_path: Path) -> CliCase:
    argv = _recommend_text(tmp_path, RANDOM_GPT2)
    argv[argv.index("--sequence-length") + 1] = "32"
    return CliCase(
        argv,
        "--sequence-length 32",
        "exceeds the 16 positions of model 'tiny_lm' (its --model-spec config)",
        tmp_path / "out",
    )


def text_plasticity_sequence_beyond_the_positions(tmp_path: Path) -> CliCase:
    reference, user = _write_texts(tmp_path / "text")
    out = tmp_path / "out"
    argv = ["plasticity", "--model", "tiny_lm", "--model-spec", json.dumps(RANDOM_GPT2)]
    argv += ["--reference", str(reference), "--text", str(user), "--sequence-length", "32"]
    argv += ["--n-pairs", "4", "--device", "cpu"]
    argv += ["--out", str(out / "pairs.parquet"), "--summary", str(out / "summary.parquet")]
    return CliCase(
        argv,
        "--sequence-length 32",
        "exceeds the 16 positions of model 'tiny_lm' (its --model-spec config)",
        out,
    )


def _finetune(tmp_path: Path, demo_dataset: Path, out_dir: Path) -> list[str]:
    spec = {"timm_id": "vit_tiny_patch16_224", "weights": "random", "kwargs": TINY_VIT_KWARGS}
    return [
        "finetune", "--experiment", "sgd", "--model", "tiny", "--dataset", "demo",
        "--model-spec", json.dumps(spec), "--dataset-dir", str(demo_dataset),
        "--configuration", "mha", "--lr", "0.05", "--seed", "0", "--out-dir", str(out_dir),
        "--steps", "2", "--val-every", "1", "--batch-size", "8", "--micro-batch-size", "4",
        "--precision", "fp32", "--device", "cpu", "--num-workers", "0",
    ]  # fmt: skip


def finetune_out_dir_below_a_file(tmp_path: Path, demo_dataset: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    run = out / "notes.txt" / "run"
    return CliCase(
        _finetune(tmp_path, demo_dataset, run),
        f"cannot write {run}",
        f"Not a directory ({out / 'notes.txt'}, from --out-dir)",
        out / "sgd",
    )


def finetune_out_dir_read_only(tmp_path: Path, demo_dataset: Path) -> CliCase:
    out = tmp_path / "out"
    out.mkdir(mode=0o555)
    return CliCase(
        _finetune(tmp_path, demo_dataset, out / "run"),
        f"cannot write {out / 'run'}",
        f"Permission denied ({out}, from --out-dir)",
        out,
    )


CLI_CASES: list[Any] = [
    nfn_with_norms_only,
    image_folder_with_text_files,
    empty_budget,
    combine_without_budget,
    out_prefix_a_folder_by_its_slash,
    out_prefix_an_existing_folder,
    out_prefix_below_a_file,
    pytest.param(out_prefix_in_a_read_only_folder, marks=ROOT_WRITES),
    text_out_prefix_below_a_file,
    untied_bare_decoder,
    text_sequence_beyond_the_positions,
    text_plasticity_sequence_beyond_the_positions,
]
FINETUNE_CASES: list[Any] = [
    finetune_out_dir_below_a_file,
    pytest.param(finetune_out_dir_read_only, marks=ROOT_WRITES),
]


def _case_id(case: Any) -> str:
    return (case.values[0] if hasattr(case, "values") else case).__name__


def _assert_refused(case: CliCase, caplog: pytest.LogCaptureFixture) -> None:
    message = refusal(case.argv, caplog, case.outputs)
    assert case.culprit in message and case.says in message, message
    assert "4 pairs" not in caplog.text, "refused only after the measurement began"


@pytest.mark.parametrize("build", CLI_CASES, ids=[_case_id(c) for c in CLI_CASES])
def test_the_command_refuses_by_name_before_compute(build, tmp_path, caplog) -> None:
    _assert_refused(build(tmp_path), caplog)


@pytest.mark.parametrize("build", FINETUNE_CASES, ids=[_case_id(c) for c in FINETUNE_CASES])
def test_finetune_refuses_an_out_dir_it_cannot_write(build, tmp_path, demo_dataset, caplog):
    try:
        _assert_refused(build(tmp_path, demo_dataset), caplog)
    finally:
        (tmp_path / "out").chmod(0o755)


# --- the workflow's config, checked when the Snakefile is parsed ---------------------------


def _text_block(tmp_path: Path, model: dict, **text: Any) -> dict[str, Any]:
    """The demo config's edit enabling text plasticity (and so recommend --text) on ``model``."""
    reference, user = _write_texts(tmp_path / "text")
    length = text.pop("sequence_length", 8)
    datasets = {
        "wiki": text_dataset(reference, sequence_length=length),
        "notes": text_dataset(user, sequence_length=length),
    }
    block = {"enabled": True, "run_models": ["tiny_lm"], "reference": "wiki"}
    block |= {"datasets": ["notes"], **text}
    return {"models": {"tiny_lm": model}, "datasets": datasets, "text_plasticity": block}


def combine_without_a_budget(tmp_path: Path) -> tuple[dict, str]:
    return {"recommend": {"combine": True}}, "recommend.combine: true needs recommend.budget"


def sequence_length_beyond_stated_positions(tmp_path: Path) -> tuple[dict, str]:
    return (
        _text_block(tmp_path, RANDOM_GPT2, sequence_length=32),
        "datasets.wiki.sequence_length: 32 exceeds the 16 positions that "
        "models.tiny_lm.config states",
    )


def untied_bare_decoder_for_recommend_text(tmp_path: Path) -> tuple[dict, str]:
    return (
        _text_block(tmp_path, UNTIED_LLAMA),
        "models.tiny_lm.config.tie_word_embeddings: false, but LlamaModel has no LM head",
    )


CONFIG_CASES: list[Callable[[Path], tuple[dict, str]]] = [
    combine_without_a_budget,
    sequence_length_beyond_stated_positions,
    untied_bare_decoder_for_recommend_text,
]


@pytest.mark.parametrize("build", CONFIG_CASES, ids=[c.__name__ for c in CONFIG_CASES])
def test_the_config_check_names_the_key(build, tmp_path) -> None:
    from vitplasticity.workflow.config import ConfigError
    from vitplasticity.workflow.config_check import check_config

    edit, says = build(tmp_path)
    config = validated(merged(load_config(PAPER, DEMO), edit))
    with pytest.raises(ConfigError) as error:
        check_config(config)
    assert says in str(error.value)


def test_the_demo_config_passes_the_check() -> None:
    from vitplasticity.workflow.config_check import check_config

    check_config(validated(load_config(PAPER, DEMO)))


def test_snakemake_refuses_combine_without_a_budget_at_parse(tmp_path: Path) -> None:
    """The check is wired into the Snakefile's parse: the dry run stops, naming the key."""
    result: subprocess.CompletedProcess = dry_run(
        tmp_path, PAPER, DEMO, edit={"recommend": {"combine": True}}
    )
    assert result.returncode != 0
    assert "recommend.combine: true needs recommend.budget" in result.stdout + result.stderr


# --- the Python API ------------------------------------------------------------------------


@pytest.mark.parametrize("configuration", [None, 123, ["mha"]], ids=["none", "int", "list"])
def test_select_names_the_configuration_it_takes(tiny_vit, configuration) -> None:
    from vitplasticity import select

    with pytest.raises(TypeError, match=r"select: configuration must be a string such as 'mha'"):
        select(tiny_vit, configuration)
    assert all(p.requires_grad for p in tiny_vit.parameters()), "nothing frozen"


def test_a_criterion_with_no_value_for_any_configuration_is_reported(tmp_path: Path) -> None:
    """A criterion n/a for every configuration ranked (a weight statistic a family lacks,
    known only once the model is built) says so in the report instead of failing on it."""
    rows = [
        {"model": "m", "dataset": "d", "configuration": "ln1", "criterion": criterion,
         "value": float("nan"), "ci_low": None, "ci_high": None, "rank": 1,
         "trainable_parameters": 96}
        for criterion in CRITERIA
    ]  # fmt: skip
    table = pl.DataFrame(rows, schema=TABLE_SCHEMA)
    text = markdown(
        table,
        Recommendation(None, "weight_spectral", None, None),
        model="m",
        dataset="d",
        reference="r",
        always_trained=10,
    )
    assert "**No configuration has a weight spectral value** (n/a for each)" in text
