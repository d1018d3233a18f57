"""Configurations that combine components ("mha+fc1") and the optional experiments of
config.yaml (combined, lora): what they train, the schema, the grid, a whole run, the
aggregation with trainable parameter counts, and the workflow's wiring of the LoRA settings."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml
from snakemake.utils import validate

from tests.helpers.repo import REPO
from tests.helpers.run_settings import finetune_settings
from vitplasticity.finetune.train import train
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import TimmSpec
from vitplasticity.report.accuracy_table import accuracy_table
from vitplasticity.report.aggregate import collect_runs, select_learning_rates
from vitplasticity.workflow.config import enabled_experiments, experiment_runs
from vitplasticity.workflow.config_check import check_config

SCHEMA = str(REPO / "workflow/schemas/config.schema.yaml")

# Per component, timm parameter names it trains (docs/protocol.md), written independently of
# the architecture registry; and what every configuration trains besides.
PATTERNS = {
    "ln1": r"blocks\.\d+\.norm1\.(weight|bias)",
    "mha": r"blocks\.\d+\.attn\.(qkv|proj)\.(weight|bias)",
    "ln2": r"blocks\.\d+\.norm2\.(weight|bias)",
    "fc1": r"blocks\.\d+\.mlp\.fc1\.(weight|bias)",
    "fc2": r"blocks\.\d+\.mlp\.fc2\.(weight|bias)",
}
ALWAYS = {"head.weight", "head.bias", "norm.weight", "norm.bias"}


@pytest.fixture
def paper_config() -> dict:
    return yaml.safe_load((REPO / "config/config.yaml").read_text())


@pytest.mark.parametrize("combination", ["mha+fc1", "ln1+ln2", "fc1+fc2", "ln1+mha+fc2"])
def test_combination_trains_the_union(tiny_spec: TimmSpec, combination: str) -> None:
    model = build_model(tiny_spec, num_classes=4)
    names = [name for name, _ in model.named_parameters()]
    parts = combination.split("+")
    expected = {n for n in names for p in parts if re.fullmatch(PATTERNS[p], n)} | ALWAYS
    assert parameter_map(model).trained_names(combination) == expected
    assert len(expected) == 3 * sum(4 if p == "mha" else 2 for p in parts) + len(ALWAYS)


def test_the_report_restates_the_configuration_order() -> None:
    """report/style.py restates the configurations' order to keep torch out of the report."""
    from vitplasticity.models.architectures import CONFIGURATIONS
    from vitplasticity.report import style

    assert CONFIGURATIONS[: len(style._COLUMN_ORDER)] == style._COLUMN_ORDER
    assert set(CONFIGURATIONS) - set(style._COLUMN_ORDER) == {"head", "lora"}
    assert style.configuration_order(list(reversed(CONFIGURATIONS)))[-1] == "head"


def test_unknown_part_of_a_combination_is_named(tiny_vit: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match=r"'mha\+attn'.*lora"):
        parameter_map(tiny_vit).trained_names("mha+attn")


def test_optional_experiments_are_off_by_default(paper_config: dict) -> None:
    experiments = paper_config["experiments"]
    assert experiments["combined"]["enabled"] is False
    assert experiments["lora"]["enabled"] is False
    assert "combined" not in enabled_experiments(paper_config)
    assert "lora" not in enabled_experiments(paper_config)
    assert paper_config["finetune"]["lora"] == {"rank": 8, "alpha": 16}
    assert "dinov3_base" not in paper_config["plasticity"]["models"]


def test_enabled_optional_experiments_validate_and_expand(paper_config: dict) -> None:
    config = copy.deepcopy(paper_config)
    config["experiments"]["combined"]["enabled"] = True
    config["experiments"]["lora"]["enabled"] = True
    validate(copy.deepcopy(config), SCHEMA)
    check_config(config)
    combined = experiment_runs(config, "combined")
    # 1 model x 2 datasets x 3 combinations x 4 LRs x 3 seeds
    assert len(combined) == 1 * 2 * 3 * 4 * 3
    assert {r.configuration for r in combined} == {"mha+fc1", "ln1+ln2", "fc1+fc2"}
    assert any("/mha+fc1/" in r.directory for r in combined)
    lora = experiment_runs(config, "lora")
    assert len(lora) == 1 * 1 * 3 * 4 * 3
    assert {r.configuration for r in lora} == {"lora", "ln1+ln2", "head"}


@pytest.mark.parametrize("configuration", ["mha+attn", "mha+", "LoRA", "lora,fc1"])
def test_schema_rejects_bad_configurations(paper_config: dict, configuration: str) -> None:
    config = copy.deepcopy(paper_config)
    config["experiments"]["combined"]["configurations"] = [configuration]
    with pytest.raises(Exception, match=r"configurations|does not match"):
        validate(config, SCHEMA)


def test_schema_rejects_a_bad_lora_rank(paper_config: dict) -> None:
    config = copy.deepcopy(paper_config)
    config["finetune"]["lora"]["rank"] = 0
    with pytest.raises(Exception, match=r"rank|minimum"):
        validate(config, SCHEMA)


@pytest.mark.usefixtures("one_torch_thread")
def test_combined_run_and_its_table_row(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    """A whole "mha+fc1" run: its summary, gradient groups, and the aggregated table with the
    trainable parameter count (3 blocks x (qkv + proj + fc1) + head and final norm)."""
    summaries = []
    for lr in (0.01, 0.05):
        settings = finetune_settings(
            experiment="combined",
            model="tiny",
            dataset="demo-stripes",
            model_spec=dataclasses.asdict(tiny_spec),
            configuration="mha+fc1",
            lr=lr,
            seed=0,
            steps=4,
            val_every=2,
            batch_size=8,
            micro_batch_size=8,
            warmup_steps=1,
            device="cpu",
            log_every=1,
            checkpoint_every=2,
        )
        out = tmp_path / f"lr{lr}"
        summary = train(settings.run, settings.training, demo_dataset, out)
        summaries.append(out / "summary.json")
    d, hidden, classes = 48, 4 * 48, 4
    per_block = (d * 3 * d + 3 * d) + (d * d + d) + (d * hidden + hidden)
    expected = 3 * per_block + d * classes + classes + 2 * d
    assert summary["configuration"] == "mha+fc1"
    assert summary["trainable_parameters"] == expected
    metrics = pl.read_parquet(out / "metrics.parquet").filter(pl.col("kind") == "train")
    assert metrics["grad_norm_mha"].drop_nulls().len() == metrics.height
    assert metrics["grad_norm_fc1"].drop_nulls().len() == metrics.height
    assert metrics["grad_norm_ln1"].drop_nulls().len() == 0

    selected = select_learning_rates(collect_runs(summaries), "val")
    row = selected.row(0, named=True)
    assert row["configuration"] == "mha+fc1" and row["trainable_parameters"] == expected
    assert "MHA+FC1" in accuracy_table(selected)


@pytest.mark.slow
def test_workflow_passes_lora_settings_to_lora_runs_only(tmp_path: Path) -> None:
    """Dry run with the optional experiments on: LoRA jobs get finetune.lora, others not."""
    override = tmp_path / "override.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "experiments": {"lora": {"enabled": True}, "combined": {"enabled": True}},
                "finetune": {"lora": {"rank": 4, "alpha": 12}},
            }
        )
    )
    results = "results"
    targets = [
        f"{results}/finetune/lora/vit_base/cifar100/lora/lr1e-05_seed0/summary.json",
        f"{results}/finetune/lora/vit_base/cifar100/ln1+ln2/lr1e-05_seed0/summary.json",
        f"{results}/finetune/combined/vit_base/cifar100/mha+fc1/lr0.001_seed0/summary.json",
    ]
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [
            str(bindir / "snakemake"),
            *targets,  # before --configfile, which takes every argument after it
            "-n",
            "-p",
            "--directory",
            str(tmp_path),
            "--snakefile",
            str(REPO / "workflow/Snakefile"),
            "--configfile",
            str(REPO / "config/config.yaml"),
            str(override),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    commands = [line for line in output.splitlines() if "vitplasticity finetune" in line]
    assert len(commands) == 3, output[-3000:]
    by_configuration = {
        re.search(r"--configuration '?([a-z0-9+]+)'?", c).group(1): c for c in commands
    }
    assert "--lora-rank 4 --lora-alpha 12" in by_configuration["lora"]
    assert "--lora-rank" not in by_configuration["ln1+ln2"]
    assert "--lora-rank" not in by_configuration["mha+fc1"]
