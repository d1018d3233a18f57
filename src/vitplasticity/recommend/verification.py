"""Budgeted verification of a recommendation, in one process: finetune the candidates of
:func:`vitplasticity.workflow.verify.candidates` on the user's dataset with successive halving
over the learning rates, then the other seeds of each one's best learning rate, and write the
verified report (:mod:`vitplasticity.recommend.verified_report`) and the export of the measured
recommendation, ``PREFIX_verified.json``, recording that it was verified and how
(:mod:`vitplasticity.recommend.verification_record`).

Every run goes through :func:`vitplasticity.finetune.train.train` (a rung pauses it with a
checkpoint; a survivor continues it), so a verified run's numbers are those of the same run
of the full grid, and an interrupted verification resumes: a finished run's summary.json is
read back, a paused one continues from its checkpoint. Each rung's decision is written as
``<out_root>/<configuration>/rung<j>_step<s>.json`` (which learning rates continue and why).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from vitplasticity.data.store import read_meta
from vitplasticity.finetune.rungs import rung_record_path
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.train import train
from vitplasticity.models.architectures import parse_configuration
from vitplasticity.recommend.verification_record import verified_record, write_verified_export
from vitplasticity.recommend.verified_report import measured_table, write_report
from vitplasticity.recommend.verify_plan import VerifyPlan
from vitplasticity.utils.io import write_json
from vitplasticity.workflow.config import Run, lr_label
from vitplasticity.workflow.verify import (
    Candidate,
    Compute,
    candidates,
    decide,
    rung_steps,
    survivors_at,
)

log = logging.getLogger(__name__)

RANK_COLUMNS = ("configuration", "criterion", "rank")


def read_ranks(path: str | Path) -> pl.DataFrame:
    """recommend's table at ``path`` (its ``configuration, criterion, rank`` columns).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: a column is missing (naming the file and the columns).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--ranking {path}: no such file (run vitplasticity recommend)")
    table = pl.read_parquet(path)
    missing = [c for c in RANK_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"--ranking {path}: not recommend's table, no column {missing}")
    return table.select(RANK_COLUMNS)


def _run_dir(out_root: Path, configuration: str, lr: float, seed: int) -> Path:
    # The folder config.Run names (the workflow's runs are the experiment's own).
    return out_root / configuration / f"lr{lr_label(lr)}_seed{seed}"


class _Runner:
    """Trains the runs of one verification and counts the steps each reached."""

    def __init__(
        self, plan: VerifyPlan, training: TrainingSettings, dataset_dir, out_root, trains: bool
    ):
        self.plan, self.training = plan, training
        self.dataset_dir, self.out_root = dataset_dir, Path(out_root)
        self.trains = trains
        self.reached: dict[Path, int] = {}

    def run(self, configuration: str, lr: float, seed: int, stop_at: int | None) -> dict:
        """The summary (full budget) or rung record (``stop_at``) of one run."""
        out = _run_dir(self.out_root, configuration, lr, seed)
        done = out / "summary.json"
        rung = rung_record_path(out, stop_at) if stop_at is not None else None
        # Done by an earlier attempt: read back (a rung's record, not the later summary,
        # so that a rerun takes the same decisions), not retrained.
        if rung is not None and rung.is_file():
            result = json.loads(rung.read_text())
        elif rung is None and done.is_file():
            result = json.loads(done.read_text())
        elif not self.trains:
            missing = rung if rung is not None else done
            raise FileNotFoundError(
                f"{missing}: not written yet, and --no-train reads finished runs only"
            )
        else:
            identity = Run(
                self.plan.experiment, self.plan.model, self.plan.dataset, configuration, lr, seed
            )
            result = train(identity, self.training, self.dataset_dir, out, stop_at)
        self.reached[out] = max(self.reached.get(out, 0), result["final_step"])
        return result


def _rung_score(result: dict[str, Any]) -> float | None:
    """A run's score at a rung: its best validation accuracy; None when it diverged."""
    return None if result.get("status") == "diverged" else result["best_val_accuracy"]


def check_plan(
    ranking: str | Path, plan: VerifyPlan, training: TrainingSettings
) -> tuple[pl.DataFrame, list[Candidate]]:
    """The ranking and the candidates, every input checked before any run starts.

    Raises:
        ValueError, FileNotFoundError: naming the bad ranking file, criterion, top-k, eta,
            configuration, learning rate or seed.
    """
    ranks = read_ranks(ranking)
    chosen = candidates(ranks.to_dicts(), plan.criterion, plan.top_k, plan.baselines)
    for candidate in chosen:
        parse_configuration(candidate.configuration)
    if not plan.lrs or not plan.seeds:
        raise ValueError("recommend.verify: at least one learning rate and one seed")
    bad_lrs = [lr for lr in plan.lrs if not lr > 0]
    if bad_lrs:
        raise ValueError(f"--lrs: every learning rate must be > 0, got {bad_lrs}")
    rung_steps(training.steps, training.val_every, len(plan.lrs), plan.eta)
    return ranks, chosen


def verify(
    ranking: str | Path,
    plan: VerifyPlan,
    training: TrainingSettings,
    dataset_dir: str | Path,
    out_root: str | Path,
    report_prefix: str | Path,
    budget: int | None = None,
    trains: bool = True,
) -> dict[str, Any]:
    """Verify the recommendation of ``ranking`` (see the module docstring); return the
    compute spent and the measured recommendation.

    With ``trains`` False (the workflow's report job, whose rungs and decisions are jobs of
    their own), every run must be there already: nothing is trained and no decision file is
    written, the same decisions are taken again from the same records.

    Raises:
        ValueError, FileNotFoundError: for a bad ranking file, criterion, top-k, eta,
            configuration, learning rate or seed, before any run starts.
    """
    ranks, chosen = check_plan(ranking, plan, training)
    ends = rung_steps(training.steps, training.val_every, len(plan.lrs), plan.eta)
    counts = survivors_at(len(plan.lrs), len(ends), plan.eta)
    runner = _Runner(plan, training, dataset_dir, out_root, trains)
    first, summaries = plan.seeds[0], []
    for candidate in chosen:
        name, alive = candidate.configuration, sorted(plan.lrs)
        for j, end in enumerate(ends[:-1]):
            scores = {lr: _rung_score(runner.run(name, lr, first, end)) for lr in alive}
            decision = decide(name, end, scores, keep=counts[j + 1])
            if trains:
                write_json(Path(out_root) / name / f"rung{j + 1}_step{end}.json", decision.record())
            log.info("%s rung %d (step %d): continue %s", name, j + 1, end, decision.keep)
            alive = list(decision.keep)
        best_lr = alive[0]
        summaries += [runner.run(name, best_lr, seed, None) for seed in plan.seeds]
    compute = _compute(runner, len(chosen), plan, training)
    table = measured_table(summaries, {c.configuration: c.reasons for c in chosen}, ranks)
    title = f"{plan.model} on {plan.dataset}"
    recommendation = write_report(
        report_prefix, table, compute, budget, title=title, demo=training.demo
    )
    record = verified_record(
        recommendation, plan, training, ends, _verified(report_prefix, ".md"), budget
    )
    num_classes = int(read_meta(dataset_dir)["num_classes"])
    write_verified_export(_verified(report_prefix, ".json"), record, training, num_classes)
    return {"compute": compute, "recommendation": recommendation}


def _verified(report_prefix: str | Path, suffix: str) -> Path:
    """``PREFIX_verified<suffix>``, the verified report's file of that suffix."""
    prefix = Path(report_prefix)
    return prefix.parent / f"{prefix.name}_verified{suffix}"


def _compute(
    runner: _Runner, n_verified: int, plan: VerifyPlan, training: TrainingSettings
) -> dict[str, Any]:
    """Steps the runs reached beside the full grid's, and both in GPU-hours where the
    runtime model knows the model (a timm id)."""
    grid = n_verified * len(plan.lrs) * len(plan.seeds) * training.steps
    spent = Compute(sum(runner.reached.values()), grid)
    hours: Sequence[float | None] = (None, None)
    timm_id = training.model_spec.get("timm_id")
    if timm_id:
        hours = tuple(
            float(h) for h in spent.gpu_hours(training.batch_size, timm_id, training.precision)
        )
    return {
        "verify_steps": spent.verify_steps,
        "grid_steps": spent.grid_steps,
        "verify_gpu_hours": hours[0],
        "grid_gpu_hours": hours[1],
    }
