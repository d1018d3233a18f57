"""``recommend-verify``: check a recommendation by finetuning, on a budget (successive
halving over the learning rates; docs/recommend.md, "Verifying the recommendation")."""

from __future__ import annotations

import argparse
import logging

from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.settings.declaration import add_settings_arguments, settings_from_args
from vitplasticity.utils.io import check_writable

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``recommend-verify`` subcommand."""
    parser = subparsers.add_parser(
        "recommend-verify",
        help="finetune a recommendation's top configurations and baselines on a budget",
        description="Verify what `vitplasticity recommend` ranked: finetune its top-k "
        "configurations, the baselines (head, full, lora) and each criterion's first pick, "
        "with successive halving over --lrs (the first seed), then every seed of each one's "
        "best learning rate; write PREFIX_verified.{md,parquet,png}.",
    )
    what = parser.add_argument_group("what to verify")
    what.add_argument("--ranking", required=True, help="recommend's PREFIX.parquet")
    what.add_argument("--experiment", default="verify", help="labels the runs")
    what.add_argument("--model", required=True, help="model name (labels the runs)")
    what.add_argument("--dataset", required=True, help="dataset name (labels the runs)")
    what.add_argument("--dataset-dir", required=True, help="the prepared dataset folder")
    what.add_argument("--lrs", type=float, nargs="+", required=True, help="learning rates")
    what.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of the best lr")
    what.add_argument("--criterion", default="plasticity", help="whose top-k are verified")
    what.add_argument("--top-k", type=int, default=2, help="configurations of --criterion")
    what.add_argument("--eta", type=int, default=2, help="halving factor (>= 2)")
    what.add_argument("--budget", help="trainable-parameter budget: 28000, 28K, 1.5M")
    what.add_argument("--runs-dir", required=True, help="folder of the verification's runs")
    what.add_argument("--out-prefix", required=True, help="writes PREFIX_verified.*")
    training = parser.add_argument_group("training (defaults: the config schema's)")
    add_settings_arguments(training, TrainingSettings)
    parser.set_defaults(handler=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    """Verify the recommendation; log the measured one."""
    from vitplasticity.recommend.settings import parse_budget
    from vitplasticity.recommend.verification import VerifyPlan, check_plan, verify

    training = settings_from_args(TrainingSettings, args)
    training.validate(args.model)
    budget = parse_budget(args.budget)
    plan = VerifyPlan(
        args.experiment,
        args.model,
        args.dataset,
        tuple(args.lrs),
        tuple(args.seeds),
        args.criterion,
        args.top_k,
        args.eta,
    )
    check_plan(args.ranking, plan, training)  # every input, before a folder is made
    check_writable(args.runs_dir, "--runs-dir", folder=True)
    result = verify(
        args.ranking, plan, training, args.dataset_dir, args.runs_dir, args.out_prefix, budget
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
