"""vitplasticity.workflow.finetune_jobs: the finetune rules' params, each a value of the
config, for one run and for a pack of runs, on the paper's and the demo's configs."""

from __future__ import annotations

import json
from typing import Any

from snakemake.iocontainers import Wildcards

from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.settings.declaration import rule_params
from vitplasticity.workflow.finetune_jobs import FinetuneJobs
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.packs import finetune_packs

RUN = {"experiment": "sgd", "model": "vit_base", "dataset": "pet", "configuration": "mha"}


def of(**wildcards: str) -> Wildcards:
    return Wildcards(fromdict=wildcards)


def evaluated(params: dict[str, Any], wildcards: Wildcards) -> dict[str, Any]:
    return {k: v(wildcards) if callable(v) else v for k, v in params.items()}


def test_a_run_gets_its_model_experiment_dataset_and_the_finetune_block(
    paper: dict[str, Any],
) -> None:
    job = of(**RUN)
    values = evaluated(FinetuneJobs(paper).params(), job)
    block = rule_params(TrainingSettings, paper["finetune"], "finetune")
    assert values == {
        "model_spec": ModelJobs(paper).spec(job),
        "optimizer": "sgd",
        "steps": paper["datasets"]["pet"]["steps"],
        "val_every": paper["datasets"]["pet"]["val_every"],
        **block,
        "demo_flag": "",
        # An image dataset's prepared folder, and no text flags.
        "data_flag": "--dataset-dir",
        "text_flags": "",
    }
    # The command's flags follow this order (workflow/rules/common.smk's FINETUNE_COMMAND).
    assert list(values)[:4] == ["model_spec", "optimizer", "steps", "val_every"]
    assert list(values)[-3:] == ["demo_flag", "data_flag", "text_flags"]


def test_a_run_trains_with_the_grids_exact_lr(paper: dict[str, Any]) -> None:
    paper["experiments"]["sgd"]["lrs"] = [0.0123456789]
    assert FinetuneJobs(paper).lr(of(**RUN, lr="0.0123457")) == 0.0123456789


def test_only_lora_configurations_get_the_lora_flags(paper: dict[str, Any]) -> None:
    jobs = FinetuneJobs(paper)
    lora = paper["finetune"]["lora"]
    flags = f"--lora-rank {lora['rank']} --lora-alpha {lora['alpha']}"
    assert jobs.lora_flags(of(configuration="lora")) == flags
    assert jobs.lora_flags(of(configuration="mha+lora")) == flags
    assert jobs.lora_flags(of(configuration="mha")) == ""
    assert jobs.lora_flags(of(configuration="loraish")) == ""


def test_a_pack_lists_its_runs_output_folders(demo: dict[str, Any]) -> None:
    pack = finetune_packs(demo)[0]
    jobs = FinetuneJobs(demo)
    job = of(experiment=pack.experiment, model="demo_vit", dataset=pack.datasets[0])
    runs = json.loads(jobs.pack_runs(pack)(job))
    cell = f"results/demo/finetune/{pack.experiment}/demo_vit/{pack.datasets[0]}"
    assert [run["out_dir"] for run in runs] == [f"{cell}/{d}" for d in pack.run_dirs]
    assert [(r["configuration"], r["lr"], r["seed"]) for r in runs] == list(pack.runs)
    assert jobs.pack_lora_flags(pack)(job) == ""  # the demo trains no LoRA


def test_a_pack_with_a_lora_run_gets_the_lora_flags(demo: dict[str, Any]) -> None:
    demo["experiments"]["adam"]["configurations"] = ["mha", "lora"]
    pack = next(p for p in finetune_packs(demo) if p.experiment == "adam")
    flags = FinetuneJobs(demo).pack_lora_flags(pack)(of())
    assert flags.startswith("--lora-rank ")
