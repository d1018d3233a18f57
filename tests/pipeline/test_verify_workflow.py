"""The budgeted verification through Snakemake (config recommend.verify, workflow/rules/verify.smk)
on the tiny demo model and synthetic data: candidates, rungs and decisions as jobs and
checkpoints, the survivors' full-budget runs, the verified report; the survivor's numbers
equal its never-paused twin's; a rerun has nothing to do."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.helpers.demo_workflow import CIRCUMSTANTIAL, workflow_args
from tests.helpers.slurm_harness import REPO, run_snakemake
from tests.helpers.verify_workflow import CELL, VERIFY

pytestmark = pytest.mark.slow


def same_run(summary: Path) -> dict:
    return {k: v for k, v in json.loads(summary.read_text()).items() if k not in CIRCUMSTANTIAL}


def test_a_verification_runs_through_snakemake(tmp_path: Path) -> None:
    args = [*workflow_args(tmp_path, VERIFY), "--cores", "2", "verify_all"]
    run_snakemake(args, REPO, timeout=1200)
    results = tmp_path / "results"
    report = results / "recommend/demo_vit/demo-stripes_verified"
    for ext in ("md", "parquet", "png"):
        assert report.with_suffix(f".{ext}").stat().st_size > 0
    verify = results / "verify/demo_vit/demo-stripes"
    candidates = [
        row["configuration"] for row in json.loads((verify / "candidates.json").read_text())
    ]
    assert "head" in candidates and len(candidates) >= 2
    table = pl.read_parquet(report.with_suffix(".parquet"))
    assert sorted(table["configuration"].to_list()) == sorted(candidates)
    survivors = {}
    for configuration in candidates:
        # Steps 8, validation every 4, two learning rates: one rung, at step 4.
        decision = json.loads((verify / configuration / "decision_step4.json").read_text())
        assert len(decision["continue"]) == 1 and len(decision["stop"]) == 1, decision
        assert "best validation accuracy up to step 4" in decision["why"]
        kept, dropped = decision["continue"][0], decision["stop"][0]
        survivors[configuration] = kept
        runs = results / CELL / configuration
        for seed in (0, 1):
            assert (runs / f"lr{kept:g}_seed{seed}/summary.json").is_file()
        # The dropped learning rate stopped at the rung: its record and checkpoint, no more.
        stopped = runs / f"lr{dropped:g}_seed0"
        assert json.loads((stopped / "rung_step4.json").read_text())["status"] == "paused"
        assert not (stopped / "summary.json").exists()
        assert not (runs / f"lr{dropped:g}_seed1").exists()
    compute = json.loads(pl.read_parquet_metadata(report.with_suffix(".parquet"))["compute"])
    # Per configuration: 2 x 4 rung steps, 4 more for the survivor, 8 for its second seed,
    # against 2 learning rates x 2 seeds x 8 steps.
    assert compute["verify_steps"] == 20 * len(candidates)
    assert compute["grid_steps"] == 32 * len(candidates)

    # The survivor, paused at the rung and continued, equals the same run never paused (the
    # finetune rule alone, in a fresh folder): the same metrics, to the bit.
    configuration, lr = next(iter(survivors.items()))
    run = f"{CELL}/{configuration}/lr{lr:g}_seed0"
    twin = tmp_path / "twin"
    twin.mkdir()
    twin_args = [
        *workflow_args(twin, VERIFY),
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
