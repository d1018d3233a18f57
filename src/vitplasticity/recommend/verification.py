"""Budgeted verification of a recommendation: the one driver of its successive halving
(:func:`verify`), and the verified report from what the halving decided
(:func:`report_verification`).

:func:`verify` (``recommend-verify``) takes, in one process, the steps the workflow's verify
rules take as jobs (workflow/rules/verify.smk): it writes the candidates
(:func:`vitplasticity.recommend.verify_plan.candidates`, ``<runs-dir>/candidates.json``),
finetunes them on the user's dataset with successive halving over the learning rates
(:mod:`vitplasticity.recommend.halving`), writing each rung's decision once as
``<runs-dir>/<configuration>/decision_step<s>.json``, then the other seeds of each one's best
learning rate. :func:`report_verification` then writes the verified report
(:mod:`vitplasticity.recommend.verified_report`) and the export of the measured
recommendation, ``PREFIX_verified.json``, recording that it was verified and how
(:mod:`vitplasticity.recommend.verification_record`), from the candidates, the decision files
and the survivors' summaries: the workflow's report job (``recommend-verify --no-train``) calls
it on the files its own jobs wrote.

Every run goes through :func:`vitplasticity.finetune.train.train` (a rung pauses it with a
checkpoint; a survivor continues it), so a verified run's numbers are those of the same run
of the full grid, and an interrupted verification resumes: a finished run's summary.json is
read back, a paused one continues from its checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import polars as pl
from torch import nn

from vitplasticity.data.store import read_meta
from vitplasticity.finetune.run import Run, lr_label
from vitplasticity.finetune.rungs import rung_record_path
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.finetune.setup import RunSource
from vitplasticity.finetune.train import train
from vitplasticity.models.architectures import parse_configuration
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import ModelSpec
from vitplasticity.recommend.halving import (
    Compute,
    decide_rung,
    decision_path,
    halving_problems,
    read_decision,
    rung_steps,
    survivors_at,
)
from vitplasticity.recommend.verification_record import verified_record, write_verified_export
from vitplasticity.recommend.verified_report import measured_table, write_report
from vitplasticity.recommend.verify_plan import (
    CANDIDATES_NAME,
    Candidate,
    VerifyPlan,
    candidates,
    read_candidates,
    write_candidates,
)
from vitplasticity.utils.io import (
    read_parquet_metadata,
    read_parquet_table,
    unreadable,
    write_json,
)

log = logging.getLogger(__name__)

RANK_COLUMNS = ("configuration", "criterion", "rank")


RANKING_REMEDY = (
    "--ranking takes recommend's PREFIX.parquet (vitplasticity recommend; the workflow's "
    "results/recommend/<model>/<dataset>.parquet)"
)


def read_ranks(path: str | Path) -> pl.DataFrame:
    """recommend's table at ``path`` (its ``configuration, criterion, rank`` columns).

    Raises:
        FileNotFoundError: no file at ``path``.
        UnreadableFileError: not a Parquet file, or one without those columns (naming the
            file and what it should be).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--ranking {path}: no such file (run vitplasticity recommend)")
    table = read_parquet_table(path, list(RANK_COLUMNS), RANKING_REMEDY)
    return pl.from_arrow(table).select(RANK_COLUMNS)


def check_ranked_model(ranking: str | Path, model: str, model_spec: dict[str, Any]) -> None:
    """Raise unless ``ranking`` ranked the model verified: ``model`` by name and
    ``model_spec`` by spec (the family, id, weights and build options that fix its
    components and their parameter counts), as recommend recorded them in its footer.

    Raises:
        UnreadableFileError: a ranking without that record (not recommend's).
        ValueError: another model's ranking, naming both.
    """
    record = read_parquet_metadata(ranking, RANKING_REMEDY)
    settings = (record.get("provenance") or {}).get("settings") or {}
    ranked, ranked_spec = record.get("model"), settings.get("model_spec")
    if not isinstance(ranked, str) or not isinstance(ranked_spec, dict):
        raise unreadable(
            ranking, "no record of the model it ranks in its footer (model, model_spec)",
            RANKING_REMEDY,
        )  # fmt: skip
    # recommend records the parsed spec's fields (asdict: no family, every default filled
    # in), as JSON: the verified spec is compared in that form.
    parsed = json.loads(json.dumps(asdict(ModelSpec.from_config(model_spec)), default=str))
    verified = {key: value for key, value in parsed.items() if key != "family"}
    recorded = {key: value for key, value in ranked_spec.items() if key != "family"}
    if recorded != verified:
        raise ValueError(
            f"--model-spec: not the model --ranking {ranking} ranked ({ranked}; "
            f"{_differences(recorded, verified)}): verify the model that was ranked, or rank "
            "this one first (vitplasticity recommend)"
        )
    if ranked != model:
        raise ValueError(
            f"--model {model}: --ranking {ranking} ranks {ranked!r}; name the model it ranked"
        )


def _differences(ranked: dict[str, Any], verified: dict[str, Any]) -> str:
    """Where two recorded specs differ: ``key ranked -> given``, each key once."""
    keys = [key for key in {**ranked, **verified} if ranked.get(key) != verified.get(key)]
    return ", ".join(
        f"{key} {json.dumps(ranked.get(key), sort_keys=True)} -> "
        f"{json.dumps(verified.get(key), sort_keys=True)}"
        for key in keys
    )


def _run_dir(out_root: Path, configuration: str, lr: float, seed: int) -> Path:
    # The folder Run names (the workflow's runs are the experiment's own).
    return Path(out_root) / configuration / f"lr{lr_label(lr)}_seed{seed}"


class _Runner:
    """Trains the runs of one verification, or reads back those an earlier attempt did."""

    def __init__(self, plan: VerifyPlan, training: TrainingSettings, source, out_root):
        self.plan, self.training = plan, training
        self.source, self.out_root = source, Path(out_root)

    def run(self, configuration: str, lr: float, seed: int, stop_at: int | None) -> dict:
        """The summary (full budget) or rung record (``stop_at``) of one run."""
        out = _run_dir(self.out_root, configuration, lr, seed)
        done = out / "summary.json"
        rung = rung_record_path(out, stop_at) if stop_at is not None else None
        # Done by an earlier attempt: read back (a rung's record, not the later summary,
        # so that a rerun takes the same decisions), not retrained.
        if rung is not None and rung.is_file():
            return json.loads(rung.read_text())
        if rung is None and done.is_file():
            return json.loads(done.read_text())
        identity = Run(
            self.plan.experiment, self.plan.model, self.plan.dataset, configuration, lr, seed
        )
        return train(identity, self.training, self.source, out, stop_at)


def check_plan(
    ranking: str | Path, plan: VerifyPlan, training: TrainingSettings
) -> tuple[pl.DataFrame, list[Candidate]]:
    """The ranking and the candidates, every input checked before any run starts.

    Raises:
        ValueError, FileNotFoundError: naming the bad ranking file (or another model's),
            criterion, top-k, eta, configuration, learning rate (one given twice) or seed,
            or a budget too short to halve (:func:`.halving.halving_problems`).
    """
    problems = halving_problems(training.steps, training.val_every, plan.lrs, plan.eta)
    if problems:
        raise ValueError(problems[0])
    if not plan.seeds or len(set(plan.seeds)) != len(plan.seeds):
        raise ValueError(f"--seeds: give each seed once, at least one (got {list(plan.seeds)})")
    ranks = read_ranks(ranking)
    check_ranked_model(ranking, plan.model, training.model_spec)
    chosen = candidates(ranks.to_dicts(), plan.criterion, plan.top_k, plan.baselines)
    for candidate in chosen:
        parse_configuration(candidate.configuration)
    return ranks, chosen


def verify(
    ranking: str | Path,
    plan: VerifyPlan,
    training: TrainingSettings,
    source: RunSource | str | Path,
    out_root: str | Path,
    report_prefix: str | Path,
    budget: int | None = None,
    step_seconds: Fraction | None = None,
) -> dict[str, Any]:
    """Verify the recommendation of ``ranking`` (see the module docstring): write the
    candidates, run the halving, write each rung's decision, run every seed of each
    survivor; then :func:`report_verification` on the files written in ``out_root``.
    ``source`` is what the runs train on: an image dataset's prepared folder, or a
    labelled text dataset (:class:`~vitplasticity.finetune.text_run.TextSource`).

    Raises:
        ValueError, FileNotFoundError: for a bad ranking file, criterion, top-k, eta,
            configuration, learning rate or seed, before any run starts.
    """
    _, chosen = check_plan(ranking, plan, training)
    write_candidates(Path(out_root) / CANDIDATES_NAME, chosen)
    ends = rung_steps(training.steps, training.val_every, len(plan.lrs), plan.eta)
    counts = survivors_at(len(plan.lrs), len(ends), plan.eta)
    runner = _Runner(plan, training, source, out_root)
    first = plan.seeds[0]
    for candidate in chosen:
        name, alive = candidate.configuration, sorted(plan.lrs)
        for j, end in enumerate(ends[:-1]):
            records = {lr: runner.run(name, lr, first, end) for lr in alive}
            decision = decide_rung(name, end, records, keep=counts[j + 1])
            write_json(decision_path(out_root, name, end), decision.record())
            log.info("%s rung %d (step %d): continue %s", name, j + 1, end, decision.keep)
            alive = list(decision.keep)
        for seed in plan.seeds:
            runner.run(name, alive[0], seed, None)
    return report_verification(
        ranking, plan, training, source, out_root, out_root, report_prefix, budget,
        step_seconds,
    )  # fmt: skip


def report_verification(
    ranking: str | Path,
    plan: VerifyPlan,
    training: TrainingSettings,
    source: RunSource | str | Path,
    runs_dir: str | Path,
    decisions_dir: str | Path,
    report_prefix: str | Path,
    budget: int | None = None,
    step_seconds: Fraction | None = None,
) -> dict[str, Any]:
    """Write the verified report and export of a verification whose runs are done: its
    candidates (``<decisions_dir>/candidates.json``), each one's survivor as its last rung
    decision names it (``<decisions_dir>/<configuration>/decision_step<s>.json``; the only
    learning rate when there is no rung), and that survivor's summary.json of every seed in
    ``runs_dir``. Return the compute spent and the measured recommendation.

    Args:
        step_seconds: seconds of one finetuning step by the runtime model, to give the
            compute in GPU-hours too (None: steps only).

    Raises:
        FileNotFoundError: naming the candidates, decision or summary file not written yet.
    """
    ranks = read_ranks(ranking)
    chosen = read_candidates(Path(decisions_dir) / CANDIDATES_NAME)
    ends = rung_steps(training.steps, training.val_every, len(plan.lrs), plan.eta)
    summaries, spent = _survivors(chosen, plan, ends, runs_dir, decisions_dir)
    compute = _compute(spent, len(chosen), plan, training, step_seconds)
    table = measured_table(summaries, {c.configuration: c.reasons for c in chosen}, ranks)
    title = f"{plan.model} on {plan.dataset}"
    recommendation = write_report(
        report_prefix, table, compute, budget, title=title, demo=training.demo
    )
    record = verified_record(
        recommendation, plan, training, ends, _verified(report_prefix, ".md"), budget
    )
    write_verified_export(
        _verified(report_prefix, ".json"),
        record,
        training,
        lambda: _run_model(source, plan, training),
    )
    return {"compute": compute, "recommendation": recommendation}


def _run_model(
    source: RunSource | str | Path, plan: VerifyPlan, training: TrainingSettings
) -> nn.Module:
    """The model the runs trained (the caller seeds the head's draw): an image model with a
    head of the prepared dataset's classes, or a labelled text dataset's sequence classifier."""
    from vitplasticity.finetune.text_run import TextSource

    if isinstance(source, TextSource):
        return source.classifier(plan.model, training)
    num_classes = int(read_meta(source)["num_classes"])
    return build_model(training.spec, num_classes=num_classes)


def _survivors(
    chosen: Sequence[Candidate],
    plan: VerifyPlan,
    ends: Sequence[int],
    runs_dir: str | Path,
    decisions_dir: str | Path,
) -> tuple[list[dict[str, Any]], int]:
    """The summaries of every seed of each candidate's survivor (the learning rate its last
    decision keeps), and the steps the verification spent: the step each run reached, as
    the decisions and the summaries record it."""
    first, summaries = plan.seeds[0], []
    reached: dict[Path, int] = {}

    def reach(run_dir: Path, step: int) -> None:
        reached[run_dir] = max(reached.get(run_dir, 0), step)

    for candidate in chosen:
        name, alive = candidate.configuration, sorted(plan.lrs)
        for end in ends[:-1]:
            decision = read_decision(decision_path(decisions_dir, name, end))
            for lr, step in decision["final_step"].items():
                reach(_run_dir(runs_dir, name, lr, first), step)
            alive = decision["continue"]
        for seed in plan.seeds:
            summary = _summary(_run_dir(runs_dir, name, alive[0], seed))
            reach(_run_dir(runs_dir, name, alive[0], seed), summary["final_step"])
            summaries.append(summary)
    return summaries, sum(reached.values())


def _summary(run_dir: Path) -> dict[str, Any]:
    """A survivor's summary.json, which the report needs finished."""
    done = run_dir / "summary.json"
    if not done.is_file():
        raise FileNotFoundError(f"{done}: not written yet, and the report reads finished runs only")
    return json.loads(done.read_text())


def _verified(report_prefix: str | Path, suffix: str) -> Path:
    """``PREFIX_verified<suffix>``, the verified report's file of that suffix."""
    prefix = Path(report_prefix)
    return prefix.parent / f"{prefix.name}_verified{suffix}"


def _compute(
    spent_steps: int,
    n_verified: int,
    plan: VerifyPlan,
    training: TrainingSettings,
    step_seconds: Fraction | None,
) -> dict[str, Any]:
    """Steps the runs reached beside the full grid's, and both in GPU-hours where the
    runtime model's ``step_seconds`` is known."""
    grid = n_verified * len(plan.lrs) * len(plan.seeds) * training.steps
    spent = Compute(spent_steps, grid)
    hours: Sequence[float | None] = (None, None)
    if step_seconds is not None:
        hours = tuple(float(h) for h in spent.gpu_hours(step_seconds))
    return {
        "verify_steps": spent.verify_steps,
        "grid_steps": spent.grid_steps,
        "verify_gpu_hours": hours[0],
        "grid_gpu_hours": hours[1],
    }
