"""The budgeted verification (tests/pipeline/test_verify_workflow.py) through the local SLURM
and the shipped profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.demo_workflow import workflow_args
from tests.helpers.slurm_harness import (
    REPO,
    LocalSlurm,
    run_snakemake,
    run_uuids,
    shipped_profile_args,
    wait_for_accounting,
)
from tests.helpers.verify_workflow import EXPERIMENT, VERIFY

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_verification_runs_through_the_local_slurm(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    """The same verification on the local SLURM with the shipped profiles, one seed and two
    ranked configurations: every cluster job COMPLETED, the candidates and decisions run on
    the Snakemake host, the report written."""
    edit = {
        "finetune": {"pack_runs": False},
        "experiments": {EXPERIMENT: {"seeds": [0]}},
        "recommend": {"configurations": ["mha", "ln1"]},
    }
    args = [*workflow_args(tmp_path, VERIFY, edit), *shipped_profile_args(jobs=2), "verify_all"]
    proc = run_snakemake(args, REPO, timeout=1800)
    (uuid,) = run_uuids(proc.stdout)
    n_jobs = proc.stdout.count("has been submitted with SLURM jobid")
    rows = wait_for_accounting(uuid, n_jobs)
    assert {row["State"] for row in rows} == {"COMPLETED"}, rows
    # The plugin's comment: rule_<rule>_wildcards_<values>.
    rules = [row["Comment"].removeprefix("rule_").split("_wildcards_")[0] for row in rows]
    assert "verify_rung" in rules and "verify_report" in rules, rules
    assert "verify_decision" not in rules and "verify_candidates" not in rules, rules
    report = tmp_path / "results/recommend/demo_vit/demo-stripes_verified.md"
    assert "How well each criterion predicted it" in report.read_text()
    print(f"\nverification on the local SLURM: {len(rows)} jobs, {sorted(set(rules))}")
