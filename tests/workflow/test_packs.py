"""vitplasticity.workflow.packs: which runs a packed finetuning job does, and its rule's name; and the
packed rules the workflow plans from them (`snakemake -n`)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers.workflow import PRESETS, REPO, merged, snakemake
from vitplasticity.workflow import packs as packs_module
from vitplasticity.workflow.config import ConfigError, enabled_experiments, experiment_runs
from vitplasticity.workflow.packs import FinetunePack, finetune_packs

LONG_LR = 0.0123456789  # its path label lr0.0123457 is another float


@pytest.fixture
def demo() -> dict:
    return merged(REPO / "config/config.yaml", REPO / "config/demo.yaml")


def by_content(packs: list[FinetunePack]) -> dict[tuple, str]:
    return {(pack.experiment, pack.runs): pack.name for pack in packs}


def test_datasets_with_one_run_list_share_a_pack(demo: dict) -> None:
    packs = finetune_packs(demo)
    assert [(p.experiment, p.datasets) for p in packs] == [
        ("sgd", ("demo-stripes",)),  # its own two learning rates
        ("sgd", ("demo-blobs", "demo-palette")),
        ("adam", ("demo-stripes", "demo-blobs", "demo-palette")),
    ]
    for pack in packs:
        assert pack.models == ("demo_vit",)
        for dataset in pack.datasets:
            grid = [
                (run.configuration, run.lr, run.seed)
                for run in experiment_runs(demo, pack.experiment)
                if run.dataset == dataset
            ]
            assert list(pack.runs) == grid  # the grid's runs, in its order
    assert len(packs[0].runs) == 8 * 2 and len(packs[1].runs) == 8


def test_packs_cover_every_run_of_the_paper_grid_once() -> None:
    """Each run of every enabled experiment is an output of exactly one packed job: the
    paper's 1,356 runs and the head baseline of every (model, dataset, lr, seed)."""
    paper = yaml.safe_load((REPO / "config/config.yaml").read_text())
    outputs = [
        f"{pack.experiment}/{model}/{dataset}/{run_dir}"
        for pack in finetune_packs(paper)
        for model in pack.models
        for dataset in pack.datasets
        for run_dir in pack.run_dirs
    ]
    runs = [
        run.directory for name in enabled_experiments(paper) for run in experiment_runs(paper, name)
    ]
    # SGD: 11 datasets x 4 LRs x 3 seeds x (7 components + head); Adam: 4 datasets;
    # model size: ViT-L and ViT-H on one dataset.
    assert len(outputs) == len(set(outputs)) == 11 * 4 * 3 * 8 + 4 * 4 * 3 * 7 + 2 * 4 * 3 * 7
    assert set(outputs) == set(runs)


def test_names_stay_put_when_the_rest_of_the_config_changes(demo: dict) -> None:
    before = by_content(finetune_packs(demo))
    edited = copy.deepcopy(demo)
    experiments = edited["experiments"]
    # Other experiments reordered, added and removed; datasets reordered; a dataset with an
    # LR grid of its own added ahead of the others.
    experiments["sgd"]["datasets"] = [
        "demo-reference",
        "demo-palette",
        "demo-stripes",
        "demo-blobs",
    ]
    experiments["sgd"]["lrs_by_dataset"]["demo-reference"] = [0.3]
    experiments["ablation"] = {**experiments["sgd"], "seeds": [1, 2]}
    edited["experiments"] = {name: experiments[name] for name in ("ablation", "adam", "sgd")}
    edited["experiments"]["adam"]["enabled"] = False
    after = by_content(finetune_packs(edited))
    kept = {key: name for key, name in after.items() if key in before}
    assert kept == {key: name for key, name in before.items() if key[0] == "sgd"}
    assert len(set(after.values())) == len(after) == 6  # sgd and ablation: 3 each


def test_name_is_the_experiment_and_a_digest_of_the_run_list() -> None:
    runs = (("mha", 0.01, 0), ("head", LONG_LR, 42))
    pack = FinetunePack("sgd", ("vit_base",), ("cifar10",), runs)
    assert re.fullmatch(r"finetune_pack_sgd_[0-9a-f]{8}", pack.name)
    # Models and datasets do not enter the name: they are the rule's wildcards.
    assert FinetunePack("sgd", ("vit_large",), ("pet", "flowers102"), runs).name == pack.name
    assert FinetunePack("adam", ("vit_base",), ("cifar10",), runs).name.startswith(
        "finetune_pack_adam_"
    )
    others = [
        runs[::-1],  # the order the job runs them in
        (("mha", 0.01, 0), ("head", 0.0123457, 42)),  # the label's float, not the grid's
        (("mha", 0.01, 0), ("head", LONG_LR, 43)),
        (("mha", 0.01, 0),),
    ]
    names = {FinetunePack("sgd", ("vit_base",), ("cifar10",), other).name for other in others}
    assert pack.name not in names and len(names) == len(others)


def test_a_name_clash_is_an_error(demo: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packs_module, "DIGEST_LENGTH", 0)  # every name the same
    with pytest.raises(
        ConfigError, match=r"rule name\(s\) finetune_pack_sgd_; raise .*DIGEST_LENGTH"
    ):
        finetune_packs(demo)


def test_runs_argument_gives_each_run_its_exact_lr_and_folder() -> None:
    runs = (("mha+fc1", LONG_LR, 3), ("lora", 0.1, 0))
    pack = FinetunePack("combined", ("demo_vit",), ("demo-stripes",), runs)
    cell = "results/finetune/combined/demo_vit/demo-stripes"
    assert pack.runs_argument(cell) == [
        {
            "configuration": "mha+fc1",
            "lr": LONG_LR,
            "seed": 3,
            "out_dir": f"{cell}/mha+fc1/lr0.0123457_seed3",
        },
        {"configuration": "lora", "lr": 0.1, "seed": 0, "out_dir": f"{cell}/lora/lr0.1_seed0"},
    ]
    assert pack.configurations == ["mha+fc1", "lora"]


def test_patterns_match_exactly_the_packs_names() -> None:
    pack = FinetunePack("sgd", ("vit.b", "vit_l"), ("c10c-motion_blur", "pet"), ())
    for name in ("vit.b", "vit_l"):
        assert re.fullmatch(pack.models_pattern, name)
    for name in ("vitxb", "vit.bb", "vit_"):
        assert not re.fullmatch(pack.models_pattern, name)
    assert re.fullmatch(pack.datasets_pattern, "c10c-motion_blur")
    assert not re.fullmatch(pack.datasets_pattern, "pets")


def planned(result_text: str) -> list[dict[str, str]]:
    """The finetuning jobs of a `snakemake -n` output: rule, wildcards, runtime, log."""
    jobs = []
    for block in re.split(r"\n(?=rule )", result_text):
        head = re.match(r"rule (finetune|finetune_pack_\w+):", block)
        if head:
            fields = dict(re.findall(r"^\s+(wildcards|resources|log): (.*)$", block, re.M))
            wildcards = dict(re.findall(r"(\w+)=([^,\s]+)", fields["wildcards"]))
            jobs.append(
                {
                    "rule": head.group(1),
                    **wildcards,
                    "runtime": re.search(r"runtime=(\d+)", fields["resources"]).group(1),
                    "log": fields["log"],
                }
            )
    return jobs


@pytest.mark.slow
def test_the_workflow_plans_one_job_per_pack_and_cell(tmp_path: Path) -> None:
    """`snakemake -n` with finetune.pack_runs: the rules of finetune_packs, one job per
    (model, dataset) each, asking for runs x the one-run estimate; datasets reordered, the
    same rule names."""
    names = []
    for order in (["demo-stripes", "demo-blobs"], ["demo-blobs", "demo-stripes"]):
        edit = {
            "finetune": {"pack_runs": True},
            "experiments": {
                "sgd": {"datasets": order, "lrs_by_dataset": {"demo-stripes": [0.05, LONG_LR]}}
            },
        }
        edit_file = tmp_path / "edit.yaml"
        edit_file.write_text(yaml.safe_dump(edit))
        config = merged(*PRESETS, edit=edit)
        result = snakemake(tmp_path, "-n", "finetune_all", extra_configfiles=(edit_file,))
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        jobs = planned(result.stdout + result.stderr)
        expected = [
            (pack.name, model, dataset, pack)
            for pack in finetune_packs(config)
            for model in pack.models
            for dataset in pack.datasets
        ]
        assert len(expected) == 3  # sgd: stripes alone, blobs; adam: stripes
        assert sorted((j["rule"], j["model"], j["dataset"]) for j in jobs) == sorted(
            e[:3] for e in expected
        )
        for name, _model, dataset, pack in expected:
            (job,) = [j for j in jobs if (j["rule"], j["dataset"]) == (name, dataset)]
            # One start-up allowance and the runs' compute, 1.06 s each (48 steps of 32
            # images at ViT-Ti/16's 7.46 GFLOP, +30%, at 14 TFLOP/s): under a minute.
            assert len(pack.runs) * 1.07 < 60
            assert int(job["runtime"]) == 15
            assert job["log"].endswith(f"/{dataset}/{name}.log")
        names.append(sorted(job["rule"] for job in jobs))
    assert names[0] == names[1]
