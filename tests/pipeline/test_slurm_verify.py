"""The budgeted verification through Snakemake (config recommend.verify, workflow/rules/verify.smk)
on the local SLURM with the shipped profiles, on the tiny demo model and synthetic data:
candidates, rungs and decisions as jobs and checkpoints (the rungs and the report as cluster
jobs, the candidates and decisions on the Snakemake host), the survivors' full-budget runs,
the verified report; the survivor's numbers equal its never-paused twin's; a rerun has nothing
to do."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from tests.helpers.demo_workflow import CIRCUMSTANTIAL, merged_config, workflow_args
from tests.helpers.slurm_harness import (
    REPO,
    LocalSlurm,
    run_snakemake,
    run_uuids,
    shipped_profile_args,
    wait_for_accounting,
)
from tests.helpers.verify_workflow import CELL, EXPERIMENT, LRS, VERIFY

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# One configuration ranked (the demo ranks eight): with head, the baseline, two candidates, each
# trained as cluster jobs (its rungs and runs).
RANKED = {"recommend": {"configurations": ["mha"]}}


def same_run(summary: Path) -> dict:
    return {k: v for k, v in json.loads(summary.read_text()).items() if k not in CIRCUMSTANTIAL}


def test_a_verification_runs_through_the_local_slurm(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    """Every cluster job COMPLETED, one per rung of each candidate's learning rates and one
    per full-budget run; the decisions, the dropped learning rate paused at its rung, the steps
    spent, the report; the survivor equal to its never-paused twin; nothing to do again."""
    config = merged_config(VERIFY, RANKED)
    seeds = config["experiments"][EXPERIMENT]["seeds"]
    steps = config["datasets"]["demo-stripes"]["steps"]
    # Two learning rates, eta 2: one halving, its rung at half the budget (a validation point).
    rung = steps // 2
    assert len(LRS) == 2 and rung % config["datasets"]["demo-stripes"]["val_every"] == 0
    args = [*workflow_args(tmp_path, VERIFY, RANKED), *shipped_profile_args(jobs=2), "verify_all"]
    proc = run_snakemake(args, REPO, timeout=1800)
    results = tmp_path / "results"
    report = results / "recommend/demo_vit/demo-stripes_verified"
    for ext in ("md", "parquet", "png"):
        assert report.with_suffix(f".{ext}").stat().st_size > 0
    assert "How well each criterion predicted it" in report.with_suffix(".md").read_text()
    verify = results / "verify/demo_vit/demo-stripes"
    candidates = [
        row["configuration"] for row in json.loads((verify / "candidates.json").read_text())
    ]
    assert "head" in candidates and len(candidates) >= 2
    table = pl.read_parquet(report.with_suffix(".parquet"))
    assert sorted(table["configuration"].to_list()) == sorted(candidates)

    # The accounting: every job the plugin submitted COMPLETED; the rungs (each learning rate
    # of each candidate), the full-budget runs (the one-run rule finetune's, finetune.pack_runs
    # notwithstanding: only an enabled experiment's runs are packed) and the report are cluster
    # jobs; the candidates and the decisions ran on the Snakemake host.
    (uuid,) = run_uuids(proc.stdout)
    n_jobs = proc.stdout.count("has been submitted with SLURM jobid")
    rows = wait_for_accounting(uuid, n_jobs)
    assert len(rows) == n_jobs and {row["State"] for row in rows} == {"COMPLETED"}, rows
    # The plugin's comment: rule_<rule>_wildcards_<values>.
    rules = Counter(row["Comment"].removeprefix("rule_").split("_wildcards_")[0] for row in rows)
    assert rules["verify_rung"] == len(LRS) * len(candidates), rules
    assert rules["finetune"] == len(seeds) * len(candidates), rules
    assert rules["verify_report"] == 1, rules
    assert "verify_decision" not in rules and "verify_candidates" not in rules, rules

    survivors = {}
    for configuration in candidates:
        # One rung: each learning rate trains to it, the better one goes on.
        decision = json.loads((verify / configuration / f"decision_step{rung}.json").read_text())
        assert len(decision["continue"]) == 1 and len(decision["stop"]) == 1, decision
        assert f"best validation accuracy up to step {rung}" in decision["why"]
        kept, dropped = decision["continue"][0], decision["stop"][0]
        survivors[configuration] = kept
        runs = results / CELL / configuration
        for seed in seeds:
            assert (runs / f"lr{kept:g}_seed{seed}/summary.json").is_file()
        # The dropped learning rate stopped at the rung: its record and checkpoint, no more.
        stopped = runs / f"lr{dropped:g}_seed{seeds[0]}"
        assert json.loads((stopped / f"rung_step{rung}.json").read_text())["status"] == "paused"
        assert not (stopped / "summary.json").exists()
        for seed in seeds[1:]:
            assert not (runs / f"lr{dropped:g}_seed{seed}").exists()
    compute = json.loads(pl.read_parquet_metadata(report.with_suffix(".parquet"))["compute"])
    # Per configuration: each learning rate to the rung, the survivor on to the full budget,
    # its other seeds the full budget; against every learning rate and seed the full budget
    # (2 x 4 + 4 + 8 = 20 steps against 2 x 2 x 8 = 32).
    verify_steps = len(LRS) * rung + (steps - rung) + (len(seeds) - 1) * steps
    assert compute["verify_steps"] == verify_steps * len(candidates)
    assert compute["grid_steps"] == len(LRS) * len(seeds) * steps * len(candidates)

    # The survivor, paused at the rung and continued, equals the same run never paused (the
    # finetune rule alone, in a fresh folder, here on the host): the same metrics, to the bit.
    configuration, lr = next(iter(survivors.items()))
    run = f"{CELL}/{configuration}/lr{lr:g}_seed{seeds[0]}"
    twin = tmp_path / "twin"
    twin.mkdir()
    twin_args = [
        *workflow_args(twin, VERIFY, RANKED),
        "--cores",
        "2",
        str(twin / "results" / run / "summary.json"),
    ]
    run_snakemake(twin_args, REPO, timeout=600)
    assert not list((twin / "results" / run).glob("rung_step*.json"))
    assert same_run(results / run / "summary.json") == same_run(
        twin / "results" / run / "summary.json"
    )
    assert pl.read_parquet(results / run / "metrics.parquet").equals(
        pl.read_parquet(twin / "results" / run / "metrics.parquet")
    )

    # Cached: the same command again has nothing to do.
    again = run_snakemake(args, REPO, timeout=600)
    assert "Nothing to be done" in again.stdout, again.stdout[-2000:]
    print(f"\nverification on the local SLURM: {len(rows)} jobs, {dict(rules)}")
