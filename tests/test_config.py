"""config.yaml against its schema and cross-checks; the paper's run grid; the dry run."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from vitplasticity.config import ConfigError, check_config, experiment_runs, lr_label

REPO = Path(__file__).resolve().parents[1]
SCHEMA = str(REPO / "workflow/schemas/config.schema.yaml")


@pytest.fixture
def paper_config() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def merged(base: dict, override: dict) -> dict:
    """Merge like Snakemake's --configfile: mappings merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def test_paper_config_is_valid(paper_config: dict) -> None:
    validate(copy.deepcopy(paper_config), SCHEMA)
    check_config(paper_config)


def test_demo_preset_is_valid(paper_config: dict) -> None:
    demo = yaml.safe_load((REPO / "workflow/presets/demo.yaml").read_text())
    config = merged(paper_config, demo)
    validate(config, SCHEMA)
    check_config(config)
    assert config["demo"] is True


def test_paper_grid_matches_protocol(paper_config: dict) -> None:
    """PROTOCOL.md: 11 x 4 x 3 x 7 SGD runs (+ linear probing), Adam on 4 datasets, ViT-L/H."""
    sgd = experiment_runs(paper_config, "sgd")
    single = [run for run in sgd if run.configuration != "head"]
    assert len(single) == 924
    assert len(sgd) == 924 + 11 * 4 * 3
    assert len(experiment_runs(paper_config, "adam")) == 4 * 4 * 3 * 7
    assert len(experiment_runs(paper_config, "model_size")) == 2 * 4 * 3 * 7
    clipart = {run.lr for run in sgd if run.dataset == "domainnet-clipart"}
    assert clipart == {3e-3, 1e-2, 3e-2, 6e-2}
    adam_cifar = {
        run.lr for run in experiment_runs(paper_config, "adam") if run.dataset == "cifar100"
    }
    assert adam_cifar == {1e-5, 3e-5, 1e-4, 3e-4}  # the SGD grid / 100
    assert {run.seed for run in sgd} == {0, 42, 3407}


def test_lr_label_round_trips() -> None:
    for lr in (1e-3, 3e-3, 0.06, 1e-5, 3e-05, 0.0006):
        assert float(lr_label(lr)) == lr
    assert lr_label(0.001) == "0.001" and lr_label(3e-5) == "3e-05"


@pytest.mark.parametrize(
    ("override", "culprit"),
    [
        ({"experiments": {"sgd": {"lrs": [-0.1]}}}, "['experiments']['sgd']['lrs'][0]"),
        ({"experiments": {"sgd": {"lrs": "0.1"}}}, "['experiments']['sgd']['lrs']"),
        ({"experiments": {"sgd": {"seeds": []}}}, "['experiments']['sgd']['seeds']"),
        (
            {"experiments": {"sgd": {"configurations": ["mlp"]}}},
            "['experiments']['sgd']['configurations'][0]",
        ),
        ({"plasticity": {"protocols": ["in-situ"]}}, "['plasticity']['protocols'][0]"),
        ({"finetune": {"batch_size": "512"}}, "['finetune']['batch_size']"),
        ({"report": {"alpha": 1.5}}, "['report']['alpha']"),
        ({"finetune": {"batchsize": 4}}, "batchsize"),
    ],
)
def test_schema_names_the_bad_key(paper_config: dict, override: dict, culprit: str) -> None:
    with pytest.raises(WorkflowError) as error:
        validate(merged(paper_config, override), SCHEMA)
    assert culprit in str(error.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"experiments": {"sgd": {"datasets": ["cifar11"]}}},
            "experiments.sgd.datasets: unknown dataset 'cifar11'",
        ),
        (
            {"experiments": {"adam": {"models": ["vit_giant"]}}},
            "experiments.adam.models: unknown model 'vit_giant'",
        ),
        (
            {"plasticity": {"datasets": ["imagenet"]}},
            "plasticity.datasets: unknown dataset 'imagenet'",
        ),
        ({"plasticity": {"models": ["resnet"]}}, "plasticity.models: unknown model 'resnet'"),
        (
            {"experiments": {"sgd": {"lrs_by_dataset": {"svhn": [0.1]}}}},
            "experiments.sgd.lrs_by_dataset: unknown dataset 'svhn'",
        ),
        (
            {"reference": {"source": "dataset", "dataset": "nope"}},
            "reference.dataset: unknown dataset 'nope'",
        ),
        ({"experiments": {"sgd": {"lrs": []}}}, "experiments.sgd.lrs: empty grid"),
    ],
)
def test_cross_checks_name_the_key(paper_config: dict, override: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(merged(paper_config, override))


def test_disabled_experiment_is_not_checked(paper_config: dict) -> None:
    config = merged(
        paper_config, {"experiments": {"model_size": {"enabled": False, "models": ["x"]}}}
    )
    check_config(config)


def snakemake(*args: str, env: dict | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess:
    bindir = Path(sys.executable).parent
    full_env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    full_env.pop("VITPLASTICITY_IMAGENET", None) if env is None else None
    return subprocess.run(
        [str(bindir / "snakemake"), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def job_counts(output: str) -> dict[str, int]:
    table = output[output.index("Job stats:") :].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.slow
def test_dry_run_lists_the_whole_paper_without_imagenet(tmp_path: Path) -> None:
    """`snakemake -n all` on config.yaml: every job, no network, ImageNet path still unset."""
    result = snakemake(
        "-n",
        "all",
        "--directory",
        str(tmp_path),
        "--snakefile",
        str(REPO / "Snakefile"),
        "--configfile",
        str(REPO / "config.yaml"),
        env={"VITPLASTICITY_IMAGENET": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    counts = job_counts(result.stdout + result.stderr)
    assert counts["finetune"] >= 1356
    assert counts["plasticity"] == 3 * 11
    assert counts["prepare"] == 11
    assert counts["reference"] == 1


def test_unknown_name_stops_the_workflow_before_any_job(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"experiments": {"sgd": {"datasets": ["cifar11"]}}}))
    result = snakemake(
        "-n",
        "all",
        "--configfile",
        str(REPO / "config.yaml"),
        str(bad),
        "--directory",
        str(tmp_path),
        "--snakefile",
        str(REPO / "Snakefile"),
    )
    assert result.returncode != 0
    assert "experiments.sgd.datasets: unknown dataset 'cifar11'" in result.stderr + result.stdout
