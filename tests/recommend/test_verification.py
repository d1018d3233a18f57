"""A budgeted verification on the tiny ViT and synthetic data: the runs successive halving
takes, its rung decisions, the verified report, and a rerun that trains nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.helpers.rankings import ranking_file
from tests.helpers.run_settings import finetune_settings
from vitplasticity.models.spec import TimmSpec
from vitplasticity.recommend.verification import VerifyPlan, report_verification, verify
from vitplasticity.workflow.runtime import finetune_step_seconds

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS, VAL_EVERY, LRS, SEEDS = 12, 3, (0.02, 0.1), (0, 1)


def ranking(folder: Path, spec: TimmSpec) -> Path:
    """recommend's table of the tiny ViT: plasticity ranks mha, fc2, ln1; rgn ranks fc2 first."""
    rows = [
        ("mha", "plasticity", 1),
        ("fc2", "plasticity", 2),
        ("ln1", "plasticity", 3),
        ("fc2", "rgn", 1),
        ("mha", "rgn", 2),
        ("ln1", "rgn", 3),
    ]
    return ranking_file(folder / "ranking.parquet", rows, "tiny", dataclasses.asdict(spec))


def training(spec: TimmSpec):
    return finetune_settings(
        experiment="verify",
        model="tiny",
        dataset="demo-stripes",
        model_spec=dataclasses.asdict(spec),
        configuration="mha",
        lr=0.02,
        seed=0,
        steps=STEPS,
        val_every=VAL_EVERY,
        batch_size=8,
        micro_batch_size=8,
        warmup_steps=2,
        device="cpu",
        log_every=3,
        checkpoint_every=100,
        num_workers=0,
    ).training


PLAN = VerifyPlan(
    "verify", "tiny", "demo-stripes", LRS, SEEDS, criterion="plasticity", top_k=1,
    baselines=("head",),
)  # fmt: skip


def test_verification_runs_the_halving_and_reports_what_it_measured(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    prefix = tmp_path / "report" / "demo-stripes"
    settings = training(tiny_spec)
    step_seconds = finetune_step_seconds(8, tiny_spec.timm_id, settings.precision)
    result = verify(
        ranking(tmp_path, tiny_spec), PLAN, settings, demo_dataset, runs, prefix, None, step_seconds
    )

    # Candidates: plasticity's top 1 (mha), the baseline (head), rgn's first pick (fc2).
    # Each: both lrs to step 6, the better one on to 12, then seed 1 for 12 steps.
    assert result["compute"]["verify_steps"] == 3 * (2 * 6 + 6 + 12)
    assert result["compute"]["grid_steps"] == 3 * len(LRS) * len(SEEDS) * STEPS
    assert result["compute"]["verify_gpu_hours"] < result["compute"]["grid_gpu_hours"]

    summaries: dict[str, list[dict]] = {}
    for name in ("mha", "head", "fc2"):
        decision = json.loads((runs / name / "decision_step6.json").read_text())
        (kept,), (dropped,) = decision["continue"], decision["stop"]
        # The survivor's score is its best val accuracy up to step 6, from its own metrics.
        survivor = runs / name / f"lr{kept!r}_seed0"
        metrics = pl.read_parquet(survivor / "metrics.parquet")
        early = metrics.filter((pl.col("kind") == "val") & (pl.col("step") <= 6))
        assert decision["best_val_accuracy"][repr(kept)] == early["val_accuracy"].max()
        assert decision["best_val_accuracy"][repr(kept)] >= (
            decision["best_val_accuracy"][repr(dropped)] or 0.0
        )
        # The dropped lr stays paused at the rung; only the survivor ran every seed.
        paused = runs / name / f"lr{dropped!r}_seed0"
        assert (paused / "checkpoint.pt").exists() and not (paused / "summary.json").exists()
        summaries[name] = [
            json.loads((runs / name / f"lr{kept!r}_seed{seed}" / "summary.json").read_text())
            for seed in SEEDS
        ]
        assert all(s["final_step"] == STEPS for s in summaries[name])

    table = pl.read_parquet(prefix.parent / "demo-stripes_verified.parquet")
    assert set(table["configuration"]) == {"mha", "head", "fc2"}
    for row in table.iter_rows(named=True):
        val = np.array([s["best_val_accuracy"] for s in summaries[row["configuration"]]])
        assert row["val_accuracy_mean"] == pytest.approx(val.mean(), abs=1e-15)
        assert row["val_accuracy_std"] == pytest.approx(val.std(ddof=1), abs=1e-15)
    ranks = dict(zip(table["configuration"], table["rank_plasticity"], strict=True))
    assert ranks == {"mha": 1, "fc2": 2, "head": None}

    # Spearman over the two verified configurations plasticity ranks: +1 when mha (rank 1)
    # measured higher than fc2, -1 when lower.
    accuracy = dict(zip(table["configuration"], table["val_accuracy_mean"], strict=True))
    report = (prefix.parent / "demo-stripes_verified.md").read_text()
    if accuracy["mha"] != accuracy["fc2"]:
        sign = "1.000" if accuracy["mha"] > accuracy["fc2"] else "-1.000"
        assert f"| plasticity | 2 | {sign} |" in report
    best = max(accuracy, key=lambda name: (accuracy[name], -table.filter(
        pl.col("configuration") == name)["trainable_parameters"].item()))  # fmt: skip
    assert result["recommendation"]["configuration"] == best
    assert f"**{best}**" in report
    assert (prefix.parent / "demo-stripes_verified.png").stat().st_size > 0
    # The measured recommendation's export says it was verified, with the chosen row's numbers.
    export = json.loads((prefix.parent / "demo-stripes_verified.json").read_text())
    chosen = table.filter(pl.col("configuration") == best).row(0, named=True)
    measured = export["verification"]["measured"]
    assert export["verification"]["verified"] is True and export["configuration"] == best
    assert measured["val_accuracy_mean"] == chosen["val_accuracy_mean"]
    assert measured["seeds"] == list(SEEDS) and measured["lr"] == chosen["lr"]
    assert export["verification"]["settings"]["rungs"] == [6, 12]

    # A rerun reads every run back: nothing is trained again, the report is the same (the
    # candidates and decisions, taken again from the same ranking and records, are rewritten).
    before = {p: p.stat().st_mtime_ns for p in runs.rglob("*") if p.is_file()}
    again = verify(
        ranking(tmp_path, tiny_spec), PLAN, settings, demo_dataset, runs, prefix, None, step_seconds
    )
    assert again["compute"] == result["compute"]
    after = {p: p.stat().st_mtime_ns for p in runs.rglob("*") if p.is_file()}
    rewritten = ("candidates.json", "decision_step6.json")
    changed = [p for p in after if before.get(p) != after[p] and p.name not in rewritten]
    assert changed == []

    # The report reads the decisions, it takes none again: without the runs' rung records it
    # is the same; without a decision it names the file.
    for record in runs.rglob("rung_step*.json"):
        record.unlink()
    report = report_verification(
        ranking(tmp_path, tiny_spec), PLAN, settings, demo_dataset, runs, runs, prefix, None,
        step_seconds,
    )  # fmt: skip
    assert report == again
    (runs / "fc2" / "decision_step6.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"fc2/decision_step6\.json"):
        report_verification(
            ranking(tmp_path, tiny_spec), PLAN, settings, demo_dataset, runs, runs, prefix
        )


def test_an_unknown_criterion_is_refused_before_any_run(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    plan = dataclasses.replace(PLAN, criterion="snr")
    with pytest.raises(ValueError, match="'snr' is not in the ranking"):
        verify(
            ranking(tmp_path, tiny_spec), plan, training(tiny_spec), demo_dataset, tmp_path / "runs",
            tmp_path / "p",
        )  # fmt: skip
    assert not (tmp_path / "runs").exists()
