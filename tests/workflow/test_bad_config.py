"""Bad config input of issue 27 refused when the Snakefile is parsed, before any job: each row
the edit over the demo's config (or the bad config.yaml), and the words its one-line message
must hold. The check rows call the Snakefile's cross-checks directly; the `snakemake -n` rows
show the wiring as the user sees it: a non-zero exit, the culprit named, no traceback,
nothing planned or written."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.configs import DEMO, PAPER, dry_run, load_config, merged, validated
from tests.helpers.repo import REPO
from tests.helpers.text_entries import gpt2_entry, text_dataset
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config


def text_files(tmp: Path, reference: Path, dataset: Path) -> dict[str, Any]:
    """An enabled text_plasticity on a tiny random GPT2: its reference dataset reads
    ``reference``, its dataset ``wiki`` reads ``dataset``."""
    return {
        "models": {"tiny_gpt2": gpt2_entry("random", config={"n_layer": 1, "n_embd": 8})},
        "datasets": {"ref": text_dataset(reference), "wiki": text_dataset(dataset)},
        "text_plasticity": {
            "enabled": True,
            "run_models": ["tiny_gpt2"],
            "reference": "ref",
            "datasets": ["wiki"],
        },
    }


def a_text_file(tmp: Path) -> Path:
    path = tmp / "reference.txt"
    path.write_text("one document\nanother\n")
    return path


Edit = Callable[[Path], dict[str, Any]]
# (id, edit over the demo's config, words of the message)
CASES: list[tuple[str, Edit, list[str]]] = [
    (
        "configurations-in-another-order",
        lambda tmp: {"experiments": {"sgd": {"configurations": ["mha+fc1", "fc1+mha"]}}},
        ["experiments.sgd.configurations: 'mha+fc1' and 'fc1+mha' train the same parameters"],
    ),
    (
        "configuration-repeating-a-part",
        lambda tmp: {"experiments": {"adam": {"configurations": ["mha", "mha+mha"]}}},
        ["experiments.adam.configurations: 'mha' and 'mha+mha' train the same parameters"],
    ),
    (
        "configuration-adding-the-head",
        lambda tmp: {"experiments": {"sgd": {"configurations": ["fc1", "head+fc1"]}}},
        ["experiments.sgd.configurations: 'fc1' and 'head+fc1'", "list that configuration once"],
    ),
    (
        "configuration-within-full",
        lambda tmp: {"experiments": {"sgd": {"configurations": ["full", "full+ln1"]}}},
        ["experiments.sgd.configurations: 'full' and 'full+ln1' train the same parameters"],
    ),
    (
        "recommend-configurations-in-another-order",
        lambda tmp: {"recommend": {"configurations": ["mha", "fc2+fc1", "fc1+fc2"]}},
        ["recommend.configurations: 'fc2+fc1' and 'fc1+fc2' train the same parameters"],
    ),
    (
        "optimizer-compared-with-itself",
        lambda tmp: {"report": {"optimizer_comparison": ["sgd", "sgd"]}},
        ["report.optimizer_comparison:", "compares experiment 'sgd' with itself"],
    ),
    (
        "learning-rate-far-too-large",
        lambda tmp: {"experiments": {"sgd": {"lrs": [0.05, 1e300]}}},
        ["experiments.sgd.lrs[1]: 1e+300 is outside", "1e-08 to 10"],
    ),
    (
        "learning-rate-far-too-small-for-one-dataset",
        lambda tmp: {"experiments": {"sgd": {"lrs_by_dataset": {"demo-stripes": [0.02, 1e-12]}}}},
        ["experiments.sgd.lrs_by_dataset.demo-stripes[1]: 1e-12 is outside"],
    ),
    (
        "imagenet-missing",
        lambda tmp: {
            "paths": {"imagenet": str(tmp / "no-imagenet")},
            "reference": {"source": "imagenet", "n_images": 256},
        },
        ["paths.imagenet:", "no-imagenet' does not exist", "ImageNet-1k val"],
    ),
    (
        "text-reference-a-folder",
        lambda tmp: text_files(tmp, tmp, a_text_file(tmp)),
        ["datasets.ref.path:", "is a folder: give a text file, one document per line"],
    ),
    (
        "text-dataset-missing",
        lambda tmp: text_files(tmp, a_text_file(tmp), tmp / "wiki.txt"),
        ["datasets.wiki.path:", "wiki.txt' does not exist"],
    ),
    (
        "text-reference-an-old-file-path",
        lambda tmp: merged(
            text_files(tmp, a_text_file(tmp), a_text_file(tmp)),
            {"text_plasticity": {"reference": str(a_text_file(tmp))}},
        ),
        ["text_plasticity.reference:", "is a file, not a dataset name: text files are datasets:"],
    ),
    (
        "text-datasets-cut-otherwise-than-the-reference",
        lambda tmp: merged(
            text_files(tmp, a_text_file(tmp), a_text_file(tmp)),
            {"datasets": {"wiki": {"sequence_length": 64}}},
        ),
        [
            "datasets.wiki.sequence_length: 64, but the reference datasets.ref.sequence_length is 128"
        ],
    ),
    (
        "an-image-stage-names-a-text-dataset",
        lambda tmp: merged(
            text_files(tmp, a_text_file(tmp), a_text_file(tmp)),
            {"plasticity": {"datasets": ["wiki"]}},
        ),
        ["plasticity.datasets: 'wiki' is a text dataset (source: text_file)"],
    ),
]


@pytest.fixture(autouse=True)
def no_imagenet_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """ImageNet is where the config says (the variable would override it)."""
    monkeypatch.delenv("VITPLASTICITY_IMAGENET", raising=False)


def demo_config(tmp: Path, edit: dict[str, Any]) -> dict[str, Any]:
    """The demo's config with ``edit`` over it, its results and resources in ``tmp``."""
    paths = {"paths": {"resources": str(tmp / "resources"), "results": str(tmp / "results")}}
    return validated(merged(merged(load_config(PAPER, DEMO), paths), edit))


@pytest.mark.parametrize(("edit", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_is_named_at_parse(tmp_path: Path, edit: Edit, words: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        check_config(demo_config(tmp_path, edit(tmp_path)))
    for word in words:
        assert word in str(error.value), f"{word!r} not in:\n{error.value}"


def test_the_variable_is_named_when_it_names_no_imagenet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VITPLASTICITY_IMAGENET", str(tmp_path / "elsewhere"))
    config = demo_config(tmp_path, {"reference": {"source": "imagenet", "n_images": 256}})
    with pytest.raises(ConfigError, match=r"VITPLASTICITY_IMAGENET \(overrides paths.imagenet\)"):
        check_config(config)


def test_what_the_checks_allow_passes(tmp_path: Path) -> None:
    """The shipped configs; distinct combinations; the range's ends; an unset ImageNet (dry
    runs plan without it); a missing ImageNet once its reference set is made; text files."""
    check_config(validated(load_config(PAPER)))
    reference = tmp_path / "resources/reference/imagenet_val.parquet"
    reference.parent.mkdir(parents=True)
    reference.write_bytes(b"")
    edit = {
        "paths": {"imagenet": str(tmp_path / "unmounted")},
        "reference": {"source": "imagenet", "name": "imagenet_val", "n_images": 256},
        "experiments": {
            "sgd": {"configurations": ["mha", "mha+fc1", "fc1+fc2", "full+lora"]},
            "adam": {"lrs": [1e-8, 10]},
        },
        "recommend": {"configurations": ["mha+fc1", "ln1+ln2"]},
        **text_files(tmp_path, a_text_file(tmp_path), a_text_file(tmp_path)),
    }
    check_config(demo_config(tmp_path, edit))


# --- as the user sees it: `snakemake -n` ------------------------------------------------------


def assert_refused(result: subprocess.CompletedProcess, workdir: Path, *words: str) -> None:
    """The dry run stopped with the message alone: the culprit named, no traceback, no job
    planned, nothing written."""
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    for word in words:
        assert word in out, f"{word!r} not in:\n{out}"
    assert "Traceback" not in out and 'File "' not in out, out
    assert "Building DAG" not in out, out
    assert not (workdir / "results").exists() and not (workdir / "resources").exists()


def dry_run_in(workdir: Path) -> subprocess.CompletedProcess:
    """`snakemake -n all` in ``workdir`` on the config/config.yaml found there (no --configfile)."""
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    command = [
        str(bindir / "snakemake"),
        "-n",
        "all",
        "--snakefile",
        str(REPO / "workflow/Snakefile"),
    ]
    return subprocess.run(
        [*command, "--directory", str(workdir)], env=env, capture_output=True, text=True
    )


# (id, the bytes of config.yaml, words of the message)
BAD_FILES: list[tuple[str, bytes, list[str]]] = [
    (
        "not-utf8",
        PAPER.read_bytes().replace(b"# vitplasticity", b"# vitplasticit\xe9", 1),
        ["config.yaml, line 1, column 15: byte 0xe9 is not UTF-8 text", "save the file as UTF-8"],
    ),
    (
        "yaml-syntax-error",
        b"demo: false\nplasticity:\n  models: [vit_base\n  n_pairs: 3\n",
        ["config.yaml, line 4, column 10: not valid YAML", "expected ',' or ']'"],
    ),
    (
        "a-list-at-the-top",
        b"- demo\n- false\n",
        ["config.yaml: holds a list, not a mapping of config keys"],
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("content", "words"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_snakemake_names_the_file_and_line_of_a_bad_config_yaml(
    tmp_path: Path, content: bytes, words: list[str]
) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config/config.yaml").write_bytes(content)
    assert_refused(dry_run_in(tmp_path), tmp_path, "invalid config file:", *words)


@pytest.mark.slow
def test_snakemake_names_the_grid_and_file_problems_before_any_job(tmp_path: Path) -> None:
    edit = {
        "paths": {"imagenet": str(tmp_path / "no-imagenet")},
        "reference": {"source": "imagenet", "n_images": 256},
        "experiments": {"sgd": {"configurations": ["mha+fc1", "fc1+mha"], "lrs": [1e300]}},
        "report": {"optimizer_comparison": ["adam", "adam"]},
    }
    result = dry_run(tmp_path, PAPER, DEMO, edit=edit)
    assert_refused(
        result,
        tmp_path,
        "paths.imagenet:",
        "experiments.sgd.configurations: 'mha+fc1' and 'fc1+mha' train the same parameters",
        "experiments.sgd.lrs[0]: 1e+300 is outside",
        "compares experiment 'adam' with itself",
    )
