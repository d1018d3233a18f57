"""Issue 42: a ``recommend.verify`` block that recommend-verify would refuse, or that names
what the config does not define, is refused when the config is parsed (``check_config``),
one line naming the key, never a traceback after the recommend and candidates jobs. One row
per case; the last runs ``snakemake -n`` on the shape that crashed ``verify_report``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from snakemake.utils import update_config

from tests.helpers.configs import Configure
from tests.helpers.demo_workflow import workflow_args
from tests.helpers.slurm_harness import REPO, run_snakemake
from tests.helpers.verify_workflow import EXPERIMENT, VERIFY
from vitplasticity.workflow.config import ConfigError
from vitplasticity.workflow.config_check import check_config

FOUR_LRS = {"experiments": {EXPERIMENT: {"lrs": [0.001, 0.003, 0.01, 0.03]}}}


def verify_with(*edits: dict[str, Any]) -> dict[str, Any]:
    """The verification of tests/helpers/verify_workflow.py with ``edits`` merged over it."""
    config = copy.deepcopy(VERIFY)
    for edit in edits:
        update_config(config, copy.deepcopy(edit))
    return config


# (edit merged over the verification, what the one error line must say)
ROWS = [
    pytest.param(
        verify_with(FOUR_LRS, {"recommend": {"verify": {"eta": 8}}}),
        "recommend.verify on demo-stripes: datasets.demo-stripes.steps: 48 steps are too short "
        "to halve 4 learning rates (experiments.verify_demo.lrs) with recommend.verify.eta 8",
        id="eta-too-large-for-the-budget",
    ),
    pytest.param(
        verify_with({"datasets": {"demo-stripes": {"val_every": 48}}}),
        "no rung ends on a validation point (datasets.demo-stripes.val_every 48)",
        id="rung-longer-than-the-budget",
    ),
    pytest.param(
        verify_with(FOUR_LRS, {"datasets": {"demo-stripes": {"steps": 12}}}),
        "datasets.demo-stripes.steps: 12 steps are too short to halve 4 learning rates",
        id="four-lrs-on-a-short-run",
    ),
    pytest.param(
        verify_with(
            {"experiments": {EXPERIMENT: {"lrs_by_dataset": {"demo-stripes": [0.1, 0.2]}}}},
            {"datasets": {"demo-stripes": {"val_every": 48}}},
        ),
        "(experiments.verify_demo.lrs_by_dataset.demo-stripes)",
        id="short-budget-names-lrs-by-dataset",
    ),
    pytest.param(
        verify_with({"experiments": {EXPERIMENT: {"lrs": [0.01, 0.05, 0.01]}}}),
        "experiments.verify_demo.lrs: 0.01 given more than once",
        id="duplicate-lrs",
    ),
    pytest.param(
        verify_with({"recommend": {"verify": {"experiment": None}}}),
        "recommend.verify.experiment: required when recommend.verify.enabled is true",
        id="experiment-null",
    ),
    pytest.param(
        verify_with({"recommend": {"verify": {"models": ["demo_vit", "nope"]}}}),
        "recommend.verify.models: unknown model 'nope'",
        id="unknown-model",
    ),
    pytest.param(
        verify_with(
            {"experiments": {"bare": {"enabled": False}}},
            {"recommend": {"verify": {"experiment": "bare"}}},
        ),
        "recommend.verify.experiment: 'bare' gives no experiments.bare.optimizer, "
        "experiments.bare.lrs",
        id="experiment-without-a-grid",
    ),
    pytest.param(
        verify_with({"recommend": {"verify": {"criterion": "snr"}}}),
        "recommend.verify.criterion: 'snr' is not a criterion recommend ranks by",
        id="unknown-criterion",
    ),
]


@pytest.mark.parametrize(("edit", "message"), ROWS)
def test_a_verification_recommend_verify_would_refuse_is_refused_at_parse(
    demo_with: Configure, edit: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        check_config(demo_with(edit))
    assert message in str(error.value)
    assert "Traceback" not in str(error.value)


@pytest.mark.slow
def test_a_budget_too_short_to_halve_ends_the_dry_run_with_its_key(tmp_path: Path) -> None:
    # The mini preset's 8 steps, two learning rates, a validation every 48 steps: no rung.
    edit = verify_with({"datasets": {"demo-stripes": {"val_every": 48}}})
    result = run_snakemake(["-n", "verify_all", *workflow_args(tmp_path, edit)], REPO, check=False)
    assert result.returncode != 0, result.stdout
    assert "datasets.demo-stripes.steps: 8 steps are too short" in result.stdout, result.stdout
    assert "Traceback" not in result.stdout and "Exception" not in result.stdout
