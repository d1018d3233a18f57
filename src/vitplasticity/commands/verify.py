"""``recommend-verify``: check a recommendation by finetuning, on a budget (successive
halving over the learning rates; docs/recommend.md, "Verifying the recommendation")."""

from __future__ import annotations

import argparse
import logging
from fractions import Fraction

from vitplasticity.commands import check_out_prefix, run_source
from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
from vitplasticity.recommend.verify_plan import BASELINES, VERIFIED_FORMATS, VerifyPlan
from vitplasticity.settings.declaration import add_settings_arguments, settings_from_args
from vitplasticity.utils.io import check_writable, write_json

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``recommend-verify`` subcommand."""
    parser = subparsers.add_parser(
        "recommend-verify",
        help="finetune a recommendation's top configurations and baselines on a budget",
        description="Verify what `vitplasticity recommend` ranked: finetune its top-k "
        "configurations, the baselines (head, full, lora) and each criterion's first pick, "
        "with successive halving over --lrs (the first seed), then every seed of each one's "
        "best learning rate; write PREFIX_verified.{md,parquet,png} and the measured "
        "recommendation's export, PREFIX_verified.json (verified: true, and by what).",
    )
    what = parser.add_argument_group("what to verify")
    what.add_argument("--ranking", required=True, help="recommend's PREFIX.parquet")
    what.add_argument("--experiment", default="verify", help="labels the runs")
    what.add_argument("--model", required=True, help="model name (labels the runs)")
    what.add_argument("--dataset", required=True, help="dataset name (labels the runs)")
    data = what.add_mutually_exclusive_group(required=True)
    data.add_argument("--dataset-dir", help="an image dataset's prepared folder")
    data.add_argument(
        "--labelled-text",
        help="a text model's labelled text dataset (as finetune --labelled-text takes it)",
    )
    what.add_argument("--lrs", type=float, nargs="+", required=True, help="learning rates")
    what.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the best lr")
    what.add_argument("--criterion", default="plasticity", help="whose top-k are verified")
    what.add_argument("--top-k", type=int, default=2, help="configurations of --criterion")
    what.add_argument("--eta", type=int, default=2, help="halving factor (>= 2)")
    what.add_argument(
        "--baselines",
        nargs="*",
        default=list(BASELINES),
        help="configurations verified whatever the ranking says (default: head full lora)",
    )
    what.add_argument(
        "--no-train",
        action="store_true",
        help="write the report from a finished verification only (the workflow's report "
        "job): its candidates, rung decisions and survivors' runs, read back; a file not "
        "there yet is an error naming it",
    )
    what.add_argument(
        "--decisions-dir",
        help="folder of candidates.json and each configuration's decision_step<s>.json "
        "(default: --runs-dir, where recommend-verify writes them)",
    )
    what.add_argument("--budget", help="trainable-parameter budget: 28000, 28K, 1.5M")
    what.add_argument("--runs-dir", required=True, help="folder of the verification's runs")
    what.add_argument("--out-prefix", required=True, help="writes PREFIX_verified.*")
    training = parser.add_argument_group("training (defaults: the config schema's)")
    add_settings_arguments(training, TrainingSettings)
    text = parser.add_argument_group("text, with --labelled-text (defaults: the config schema's)")
    add_settings_arguments(text, TextFinetuneSettings)
    parser.set_defaults(handler=run_verify)
    _register_candidates(subparsers)
    _register_rung(subparsers)


def _register_candidates(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify-candidates",
        help="the configurations a verification finetunes (the workflow's first step)",
        description="Read recommend's ranking; write the configurations to verify (the top-k "
        "of --criterion, the baselines, each criterion's first pick) with why, as JSON.",
    )
    parser.add_argument("--ranking", required=True, help="recommend's PREFIX.parquet")
    parser.add_argument("--criterion", default="plasticity", help="whose top-k are verified")
    parser.add_argument("--top-k", type=int, default=2, help="configurations of --criterion")
    parser.add_argument("--baselines", nargs="*", default=list(BASELINES), help="always verified")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.set_defaults(handler=run_candidates)


def run_candidates(args: argparse.Namespace) -> int:
    """Write the candidates of a verification."""
    from vitplasticity.models.architectures import parse_configuration
    from vitplasticity.recommend.verification import read_ranks
    from vitplasticity.recommend.verify_plan import candidates, write_candidates

    ranks = read_ranks(args.ranking)
    chosen = candidates(ranks.to_dicts(), args.criterion, args.top_k, tuple(args.baselines))
    for candidate in chosen:
        parse_configuration(candidate.configuration)
    write_candidates(args.out, chosen)
    log.info("verify: %s", ", ".join(c.configuration for c in chosen))
    return 0


def _register_rung(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify-rung",
        help="a rung's decision: which learning rates continue (the workflow's halving step)",
        description="Read the rung records (rung_step<s>.json) of one configuration's "
        "learning rates; write which --keep continue and why, as JSON.",
    )
    parser.add_argument("--configuration", required=True)
    parser.add_argument("--rung-step", type=int, required=True, help="the rung's last step")
    parser.add_argument("--keep", type=int, required=True, help="learning rates that continue")
    parser.add_argument(
        "--record",
        nargs="+",
        required=True,
        metavar="LR=PATH",
        help="each learning rate (exact) and its run's rung record",
    )
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.set_defaults(handler=run_rung)


def run_rung(args: argparse.Namespace) -> int:
    """Write a rung's decision from its records."""
    import json
    from pathlib import Path

    from vitplasticity.recommend.halving import decide_rung

    records: dict[float, dict] = {}
    for item in args.record:
        lr_text, sep, path = item.partition("=")
        if not sep:
            raise ValueError(f"--record {item!r}: expected LR=PATH")
        record = json.loads(Path(path).read_text())
        if record.get("rung_step") != args.rung_step:
            raise ValueError(
                f"--record {path}: a record of step {record.get('rung_step')}, "
                f"not of --rung-step {args.rung_step}"
            )
        records[float(lr_text)] = record
    decision = decide_rung(args.configuration, args.rung_step, records, keep=args.keep)
    write_json(args.out, decision.record())
    log.info("%s rung at step %d: continue %s", args.configuration, args.rung_step, decision.keep)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Verify the recommendation; log the measured one."""
    from vitplasticity.recommend.settings import parse_budget
    from vitplasticity.recommend.verification import check_plan, report_verification, verify

    training = settings_from_args(TrainingSettings, args)
    training.validate(args.model)
    source = run_source(args)
    budget = parse_budget(args.budget)
    plan = _plan(args)
    check_plan(args.ranking, plan, training)  # every input, before a folder is made
    check_writable(args.runs_dir, "--runs-dir", folder=True)
    check_out_prefix(args.out_prefix, [f"_verified.{ext}" for ext in VERIFIED_FORMATS])
    if args.no_train:
        result = report_verification(
            args.ranking,
            plan,
            training,
            source,
            args.runs_dir,
            args.decisions_dir or args.runs_dir,
            args.out_prefix,
            budget,
            _step_seconds(training),
        )
    else:
        result = verify(
            args.ranking,
            plan,
            training,
            source,
            args.runs_dir,
            args.out_prefix,
            budget,
            _step_seconds(training),
        )
    chosen = result["recommendation"]
    compute = result["compute"]
    log.info(
        "verified: %s (%d steps against %d for the full grid)",
        chosen["configuration"] if chosen else "nothing fits the budget",
        compute["verify_steps"],
        compute["grid_steps"],
    )
    return 0


def _plan(args: argparse.Namespace) -> VerifyPlan:
    """The verification's plan from its flags."""
    return VerifyPlan(
        args.experiment,
        args.model,
        args.dataset,
        tuple(args.lrs),
        tuple(args.seeds),
        args.criterion,
        args.top_k,
        args.eta,
        tuple(args.baselines),
    )


def _step_seconds(training: TrainingSettings) -> Fraction | None:
    """Seconds of one finetuning step by the workflow's runtime model, which gives the
    report's GPU-hours; None where it does not know the model (no timm id)."""
    from vitplasticity.workflow.runtime import finetune_step_seconds

    timm_id = training.model_spec.get("timm_id")
    if not timm_id:
        return None
    return finetune_step_seconds(training.batch_size, timm_id, training.precision)
