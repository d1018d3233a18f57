"""Bad config input is named when the Snakefile is parsed, before any job: each case a row
(the edit over config.yaml, the words its message must hold), checked by the same passes the
Snakefile runs; two `snakemake -n` runs show the message as the user sees it."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.configs import DEMO, PAPER, SCHEMA, dry_run, load_config, merged
from vitplasticity.workflow.checks import model_kwargs_problems
from vitplasticity.workflow.config import ConfigError, check_keys, load_schema
from vitplasticity.workflow.config_check import check_config

SCHEMA_DICT = load_schema(SCHEMA)
TINY_VIT = {"family": "timm", "timm_id": "vit_tiny_patch16_224", "weights": "random"}
FLOWERS = ("102flowers.tgz", "imagelabels.mat", "setid.mat")


def checked(config: dict[str, Any]) -> None:
    """The Snakefile's passes that can name a problem in one line: strict keys, then the
    cross-checks (timm models with kwargs built on the meta device)."""
    check_keys(config, SCHEMA_DICT)
    check_config(config, build_models=True)


def files(folder: Path, *names: str) -> Path:
    """``folder`` holding an empty file of each name."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def only_experiment_configs(configurations: list[str]) -> dict[str, Any]:
    """Every enabled paper experiment trains ``configurations`` only."""
    return {
        "experiments": {
            name: {"configurations": configurations} for name in ("sgd", "adam", "model_size")
        }
    }


Edit = Callable[[Path], dict[str, Any]]
CASES: list[tuple[str, Edit, list[str]]] = [
    (
        "archive-missing",
        lambda tmp: {"datasets": {"cifar10": {"archive": str(tmp / "c10.tar.gz")}}},
        ["datasets.cifar10.archive:", "c10.tar.gz", "does not exist", "remove archive:"],
    ),
    (
        "archive-one-file-of-three",
        lambda tmp: {
            "datasets": {"flowers102": {"archive": str(files(tmp, FLOWERS[0]) / FLOWERS[0])}}
        },
        [
            "datasets.flowers102.archive:",
            "is one file, but this flowers102 entry needs 3: 102flowers.tgz, imagelabels.mat, "
            "setid.mat; missing: imagelabels.mat, setid.mat",
            "folder holding all of them",
            "map each file to its path",
        ],
    ),
    (
        "archive-folder-lacks-a-file",
        lambda tmp: {"datasets": {"flowers102": {"archive": str(files(tmp / "f", *FLOWERS[:2]))}}},
        ["datasets.flowers102.archive: the folder", "lacks setid.mat", "put them there"],
    ),
    (
        "archive-mapped-file-missing",
        lambda tmp: {"datasets": {"flowers102": {"archive": {"setid.mat": str(tmp / "s.mat")}}}},
        ["datasets.flowers102.archive.setid.mat:", "s.mat", "is not a file"],
    ),
    (
        "checksums-as-a-string",
        lambda tmp: {"datasets": {"flowers102": {"checksums": "md5:" + "a" * 32}}},
        ["datasets.flowers102.checksums: expected a mapping", "got the str 'md5:aaaa", "md5:<hex>"],
    ),
    (
        "reference-beyond-imagenet-val",
        lambda tmp: {"reference": {"n_images": 60000}},
        ["reference.n_images: 60000", "50,000 images of ImageNet-1k val", "at most 50000"],
    ),
    (
        "reference-beyond-its-split",
        lambda tmp: {"reference": {"source": "dataset", "dataset": "pet", "n_images": 4000}},
        ["reference.n_images: 4000", "3,669 images of the test split of 'pet'"],
    ),
    (
        "micro-batch-not-a-divisor",
        lambda tmp: {"finetune": {"micro_batch_size": 200}},
        ["finetune.micro_batch_size: 200 does not divide finetune.batch_size 512", "e.g. 128"],
    ),
    (
        "device-tpu",
        lambda tmp: {"finetune": {"device": "tpu"}},
        ["finetune.device: 'tpu' is not a device", "auto", "cpu", "cuda"],
    ),
    (
        "lr-infinite",
        lambda tmp: {"experiments": {"sgd": {"lrs": [0.01, math.inf]}}},
        ["experiments.sgd.lrs: inf is not a learning rate (a finite number > 0)"],
    ),
    (
        "lr-nan-by-dataset",
        lambda tmp: {"experiments": {"adam": {"lrs_by_dataset": {"cifar100": [math.nan]}}}},
        ["experiments.adam.lrs_by_dataset.cifar100: nan is not a learning rate"],
    ),
    (
        "lr-twice",
        lambda tmp: {"experiments": {"sgd": {"lrs": [0.05, 0.05]}}},
        ["experiments.sgd.lrs: 0.05 is listed twice"],
    ),
    (
        "pairs-beyond-reference",
        lambda tmp: {"plasticity": {"n_pairs": 20000}},
        ["plasticity.n_pairs: 20000 pairs", "reference.n_images = 12800", "at most 12800"],
    ),
    (
        "val-split-missing",
        lambda tmp: {
            "plasticity": {"datasets": ["cifar10", "flowers102"], "downstream_split": "val"}
        },
        ["plasticity.downstream_split: 'val', but dataset 'cifar10' (cifar10) has no val split"],
    ),
    (
        "reference-split-missing",
        lambda tmp: {"reference": {"source": "dataset", "dataset": "pet", "split": "val"}},
        ["reference.split: 'val', but dataset 'pet' (pet) has no val split"],
    ),
    (
        "image-folder-without-root",
        lambda tmp: {"datasets": {"mine": {"source": "image_folder", "steps": 1, "val_every": 1}}},
        ["datasets.mine.root: missing", "root: <folder>"],
    ),
    (
        "image-folder-root-missing",
        lambda tmp: {
            "datasets": {
                "mine": {
                    "source": "image_folder",
                    "root": str(tmp / "x"),
                    "steps": 1,
                    "val_every": 1,
                }
            }
        },
        ["datasets.mine.root:", "is not a folder"],
    ),
    (
        "seed-beyond-64-bits",
        lambda tmp: {"experiments": {"sgd": {"seeds": [0, 2**70]}}},
        ["experiments.sgd.seeds[1]: 1180591620717411303424 is out of the range of a seed"],
    ),
    (
        "reference-component-untrained",
        lambda tmp: merged(
            only_experiment_configs(["full", "mha"]), {"report": {"reference_component": "ln1"}}
        ),
        ["report.reference_component: 'ln1' is trained by no enabled experiment", "full, mha"],
    ),
    (
        "optimizer-comparison-unknown",
        lambda tmp: {"report": {"optimizer_comparison": ["sgd", "adamw"]}},
        ["report.optimizer_comparison: unknown experiment(s) 'adamw'", "[] for no figure"],
    ),
    (
        "results-is-a-file",
        lambda tmp: {"paths": {"results": str(files(tmp, "results.txt") / "results.txt")}},
        ["paths.results:", "results.txt' is a file, not a folder"],
    ),
    (
        "model-kwargs-typo",
        lambda tmp: {"models": {"tiny": {**TINY_VIT, "kwargs": {"embed_dimm": 48}}}},
        ["models.tiny.kwargs:", "unexpected keyword argument 'embed_dimm'", "fix or remove"],
    ),
    (
        "model-kwargs-of-another-size",
        lambda tmp: {"models": {"tiny": {**TINY_VIT, "kwargs": {"embed_dim": 50, "num_heads": 3}}}},
        ["models.tiny.kwargs:", "vit_tiny_patch16_224"],
    ),
]


@pytest.mark.parametrize(("edit", "words"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_named_before_any_job(tmp_path: Path, edit: Edit, words: list[str]) -> None:
    config = merged(load_config(PAPER), edit(tmp_path))
    with pytest.raises(ConfigError) as error:
        checked(config)
    message = str(error.value)
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"


def test_the_shipped_configs_and_good_archives_pass(tmp_path: Path) -> None:
    checked(load_config(PAPER))
    checked(load_config(PAPER, DEMO))  # builds the demo's tiny ViT on the meta device
    folder = files(tmp_path / "flowers", *FLOWERS)
    archives = {
        "cifar10": {"archive": str(files(tmp_path, "c10.tgz") / "c10.tgz")},
        "flowers102": {"archive": str(folder)},
        # a mapping may name some files only: the others are downloaded, as written
        "pet": {"archive": {"images.tar.gz": str(files(tmp_path, "i.tgz") / "i.tgz")}},
        "domainnet-sketch": {"archive": str(files(tmp_path, "sketch.zip") / "sketch.zip")},
    }
    checked(merged(load_config(PAPER), {"datasets": archives}))


def test_a_built_model_is_recorded_and_not_built_again(tmp_path: Path) -> None:
    cache = tmp_path / "built.json"
    good = {"tiny": {**TINY_VIT, "kwargs": {"embed_dim": 48, "num_heads": 3}}}
    bad = {"tiny": {**TINY_VIT, "kwargs": {"embed_dimm": 48}}}
    assert model_kwargs_problems(good, cache) == []
    assert "vit_tiny_patch16_224" in cache.read_text()
    assert model_kwargs_problems(bad, cache), "an entry not built before is built"
    assert len(re.findall("embed_dimm", cache.read_text())) == 0, "only what builds is recorded"


def test_the_paper_config_is_checked_without_torch() -> None:
    """Its timm models have no kwargs: nothing to build, so no seconds of imports at parse."""
    code = (
        "import sys, yaml; from vitplasticity.workflow.config_check import check_config; "
        f"check_config(yaml.safe_load(open({str(PAPER)!r})), build_models=True); "
        "print(sorted({'torch', 'timm'} & set(sys.modules)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def assert_named_cleanly(result: Any, workdir: Path, *words: str) -> None:
    """The dry run stopped with every message and nothing else: no traceback lines, no job
    planned, nothing written."""
    out = result.stdout + result.stderr
    assert result.returncode != 0
    for word in words:
        assert word in out, f"{word!r} not in:\n{out}"
    assert not re.search(r'^\s*File ".*", line \d+', out, re.M), out
    assert "Traceback" not in out and "Failed validating" not in out
    assert "Building DAG" not in out
    assert not (workdir / "results").exists() and not (workdir / "resources").exists()


@pytest.mark.slow
def test_snakemake_names_key_problems_in_one_line_each(tmp_path: Path) -> None:
    edit = {"datasets": {"flowers102": {"checksums": "md5:" + "a" * 32}, "pet": {"archvie": "/x"}}}
    result = dry_run(tmp_path, PAPER, edit=edit)
    assert_named_cleanly(
        result,
        tmp_path,
        "invalid config: 1 unknown or outdated key(s), 1 value(s) that must be a mapping",
        "datasets.flowers102.checksums: expected a mapping",
        "datasets.pet.archvie: unknown key; did you mean 'archive'?",
    )


@pytest.mark.slow
def test_snakemake_names_every_cross_check_problem_before_any_job(tmp_path: Path) -> None:
    edit = {
        "models": {"demo_vit": {"kwargs": {"embed_dimm": 48}}},
        "datasets": {
            "mine": {"source": "image_folder", "root": "missing-folder", "steps": 1, "val_every": 1}
        },
        "plasticity": {"device": "tpu"},
        "experiments": {"sgd": {"seeds": [2**70]}},
    }
    result = dry_run(tmp_path, PAPER, DEMO, edit=edit)
    assert_named_cleanly(
        result,
        tmp_path,
        "models.demo_vit.kwargs:",
        "'embed_dimm'",
        "datasets.mine.root: 'missing-folder' is not a folder",
        "plasticity.device: 'tpu' is not a device",
        "experiments.sgd.seeds[0]: 1180591620717411303424 is out of the range of a seed",
    )


@pytest.mark.slow
def test_every_experiment_disabled_plans_the_plasticity_part_alone(tmp_path: Path) -> None:
    """With every experiment disabled, `all` is the plasticity part: no aggregation of runs
    that do not exist (it used to plan aggregate_all on no input, which failed after the
    plasticity jobs had run)."""
    edit = {"experiments": {name: {"enabled": False} for name in ("sgd", "adam")}}
    result = dry_run(tmp_path, PAPER, DEMO, edit=edit)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "aggregate_all" not in out and "finetune" not in out
    assert re.search(r"^plasticity\s+\d+$", out, re.M), out[-3000:]
