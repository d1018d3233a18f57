"""The ``verification`` record of an export (``PREFIX.json``, ``PREFIX_verified.json``): how
its configuration was chosen, so that a file found later says whether it was measured.

- recommend's export (:func:`.export.heuristic_record`): ``verified: false`` and the
  criterion whose ranking picked it; a heuristic, not a finetuning result.
- recommend-verify's (:func:`verified_record`, written by :func:`write_verified_export` as
  ``PREFIX_verified.json``): ``verified: true``, the measured accuracy of the chosen
  configuration (mean and spread over its seeds, at its selected learning rate), the
  verification's settings (criterion, top-k, baselines, eta, rungs, budget steps, learning
  rates, seeds, model, dataset) and the verified report it comes from.

The record is a key of the export beside the formats (:mod:`.export`), so every consuming
tool reads its own part as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplasticity.recommend.export import FORMAT, build_export
from vitplasticity.utils.io import write_json

if TYPE_CHECKING:
    from torch import nn

    from vitplasticity.finetune.settings import TrainingSettings
    from vitplasticity.recommend.verify_plan import VerifyPlan

VERIFIED_BY = "vitplasticity recommend-verify"
"""What verifies a recommendation: the budgeted finetuning of docs/recommend.md."""


def verified_record(
    chosen: Mapping[str, Any] | None,
    plan: VerifyPlan,
    training: TrainingSettings,
    rungs: Sequence[int],
    report: str | Path,
    budget: int | None,
) -> dict[str, Any]:
    """The record of a measured recommendation.

    Args:
        chosen: its row of the verified table (:func:`.verified_report.recommendation`);
            None when no verified configuration fits ``budget`` (``measured`` is None).
        plan, training: the verification's plan and finetuning settings.
        rungs: the step each rung of the halving ends at (the last is the full budget).
        report: the verified report (``PREFIX_verified.md``).
        budget: the trainable-parameter budget it was chosen within (None: none).
    """
    return {
        "verified": True,
        "by": VERIFIED_BY,
        "report": str(report),
        "measured": None if chosen is None else _measured(chosen, plan.seeds),
        "settings": {
            "model": plan.model,
            "dataset": plan.dataset,
            "experiment": plan.experiment,
            "criterion": plan.criterion,
            "top_k": plan.top_k,
            "baselines": list(plan.baselines),
            "eta": plan.eta,
            "rungs": list(rungs),
            "steps": training.steps,
            "lrs": list(plan.lrs),
            "seeds": list(plan.seeds),
            "optimizer": training.optimizer,
            "budget": budget,
        },
    }


def _measured(chosen: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """What the verification measured of the chosen configuration (its seeds: the first
    ``chosen["seeds"]`` of the plan's, which every verified configuration runs in order)."""
    return {
        "configuration": chosen["configuration"],
        "lr": chosen["lr"],
        "val_accuracy_mean": chosen["val_accuracy_mean"],
        "val_accuracy_std": chosen["val_accuracy_std"],
        "test_accuracy_mean": chosen["test_accuracy_mean"],
        "seeds": list(seeds[: chosen["seeds"]]),
        "trainable_parameters": chosen["trainable_parameters"],
    }


def write_verified_export(
    path: str | Path,
    record: Mapping[str, Any],
    training: TrainingSettings,
    build: Callable[[], nn.Module],
) -> dict[str, Any]:
    """Write and return the export of ``record``'s measured configuration at ``path``, whose
    names are those of the model ``build`` makes (the runs' model, its head drawn after the
    RNG is seeded with the first seed).

    A configuration of the five components, or ``head``, gets the whole export
    (:func:`.export.build_export`), as does no configuration (none fits the budget: the head
    alone); a winning baseline outside them (``full``, ``lora``, ``emb``) gets the record and
    the configuration's name, with ``usage`` saying so.
    """
    import torch

    from vitplasticity.recommend.criteria import configuration_components

    settings = record["settings"]
    configuration = None if record["measured"] is None else record["measured"]["configuration"]
    named = {"model_name": settings["model"], "model_entry": dict(training.model_spec)}
    try:
        if configuration not in (None, "head"):
            configuration_components(configuration)
    except ValueError:
        export = _baseline_export(configuration, record, named, settings["dataset"])
    else:
        torch.manual_seed(settings["seeds"][0])  # the head as the first verified run drew it
        model = build().eval()
        export = build_export(
            model, configuration, dataset=settings["dataset"], verification=record, **named
        )
    write_json(path, export)
    return export


def _baseline_export(
    configuration: str,
    record: Mapping[str, Any],
    named: Mapping[str, Any],
    dataset: str,
) -> dict[str, Any]:
    """The export of a winning baseline that is not made of the five components: no parameter
    names or PEFT configs (the component export describes components), the record."""
    return {
        "format": FORMAT,
        "model": {"name": named["model_name"], "entry": named["model_entry"]},
        "dataset": dataset,
        "configuration": configuration,
        "verification": dict(record),
        "usage": [
            f"{configuration!r} is one of vitplasticity's baselines (docs/protocol.md), not a "
            "combination of LN1, MHA, LN2, FC1, FC2: this file has no parameter names or PEFT "
            "configs for it; train it as the finetuning runs did (vitplasticity finetune "
            f"--configuration {configuration})."
        ],
    }
