"""recommend.verify's parse-time checks and the rungs the workflow asks for
(vitplasticity.workflow.verify_jobs); the jobs themselves run in
tests/pipeline/test_slurm_verify.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.helpers.configs import Configure
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config
from vitplasticity.workflow.verify_jobs import VerifyJobs, verify_problems

VERIFY_EXPERIMENT = {
    "enabled": False,
    "optimizer": "sgd",
    "models": ["demo_vit"],
    "datasets": ["demo-stripes"],
    "configurations": ["head"],
    "lrs": [0.001, 0.003, 0.01, 0.03],
    "seeds": [0, 42],
}


def verified(demo_with: Configure, **block: Any) -> dict[str, Any]:
    return demo_with(
        {
            "experiments": {"check": VERIFY_EXPERIMENT},
            "recommend": {"verify": {"enabled": True, "experiment": "check", **block}},
        }
    )


def test_a_sound_block_has_no_problem_and_off_is_never_checked(demo_with: Configure) -> None:
    assert verify_problems(verified(demo_with)) == []
    assert verify_problems(demo_with({"recommend": {"verify": {"experiment": "nope"}}})) == []


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"experiment": None}, "recommend.verify.experiment: required"),
        ({"experiment": "nope"}, "'nope' is not an experiment (known: adam, check"),
        (
            {"experiment": "sgd"},
            "'sgd' is enabled and its grid trains demo_vit on demo-stripes",
        ),
        ({"datasets": ["elsewhere"]}, "recommend.verify.datasets: unknown dataset 'elsewhere'"),
    ],
)
def test_a_bad_block_is_refused_naming_the_key(
    demo_with: Configure, block: dict[str, Any], message: str
) -> None:
    config = verified(demo_with, **block)
    with pytest.raises(ConfigError, match="invalid config") as error:
        check_config(config)
    assert message in str(error.value)


def test_verification_needs_recommend(demo_with: Configure) -> None:
    config = verified(demo_with)
    config["recommend"]["enabled"] = False
    assert verify_problems(config) == [
        "recommend.verify.enabled: verification needs recommend.enabled: true"
    ]
    assert VerifyJobs(config).report_files() == []


def test_the_rungs_of_four_learning_rates(demo_with: Configure) -> None:
    # The demo's 48 steps, validation every 12, four learning rates: rungs at 12 and 24.
    jobs = VerifyJobs(verified(demo_with))
    assert jobs.ends("demo-stripes") == [12, 24, 48]
    cell = {"model": "demo_vit", "dataset": "demo-stripes", "configuration": "mha"}
    first = SimpleNamespace(**cell, step="12", lr="0.01", seed="0")
    second = SimpleNamespace(**cell, step="24", lr="0.01", seed="0")
    assert jobs.keep(first) == 2 and jobs.keep(second) == 1
    assert jobs.rung_inputs(first) == []
    run = jobs.run_dir("demo_vit", "demo-stripes", "mha", 0.01, 0)
    assert jobs.rung_inputs(second) == [f"{run}/rung_step12.json"]
    assert jobs.rung_lr(first) == 0.01
    with pytest.raises(ConfigError, match="step 48 ends no rung"):
        jobs.keep(SimpleNamespace(**cell, step="48"))
    # recommend's three datasets, four files each (md, parquet, png, json)
    assert len(jobs.report_files()) == 3 * 4
