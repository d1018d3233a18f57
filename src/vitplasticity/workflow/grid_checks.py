"""What the run grid plans, checked when the Snakefile is parsed: no parameter set planned
twice under two spellings, and learning rates within a sane range. Plain Python (no torch);
called by :func:`vitplasticity.workflow.config.check_config`, one message per problem."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The learning rates a grid may hold (the paper's grids span 1e-5 to 0.06; the schema's
# learning_rates description and docs/configuration.md state the range).
LR_RANGE = (1e-8, 10.0)
# What a configuration's parts add to the parameters every run trains: "head" nothing (the
# head and final norm are always trained), "full" everything but LoRA adapters, which only a
# configuration naming lora injects (vitplasticity.models.architectures.ParameterMap.trained_names).
ALWAYS_TRAINED = "head"
EVERYTHING = "full"
ADAPTERS = "lora"


def trained_parts(configuration: str) -> frozenset[str]:
    """The parts of ``configuration`` that decide what it trains: two configurations with the
    same parts train the same parameters (``fc1+mha`` and ``mha+fc1``; ``mha+mha`` and
    ``mha``; ``mha+head`` and ``mha``; ``full+fc1`` and ``full``)."""
    parts = set(configuration.split("+"))
    if EVERYTHING in parts:
        parts &= {EVERYTHING, ADAPTERS}
    if len(parts) > 1:
        parts.discard(ALWAYS_TRAINED)
    return frozenset(parts)


def duplicate_configurations(key: str, configurations: Iterable[str]) -> list[str]:
    """One message per configuration of the list at ``key`` that trains what an earlier one
    trains, naming both spellings."""
    first: dict[frozenset[str], str] = {}
    problems = []
    for configuration in configurations:
        parts = trained_parts(str(configuration))
        earlier = first.setdefault(parts, str(configuration))
        if earlier != configuration:
            problems.append(
                f"{key}: {earlier!r} and {configuration!r} train the same parameters "
                f"({'+'.join(sorted(parts))}): list that configuration once"
            )
    return problems


def configuration_problems(config: Mapping[str, Any], experiments: Iterable[str]) -> list[str]:
    """The configurations of each enabled experiment (whose runs would repeat) and of
    recommend (whose ranking would list one component twice), each parameter set once."""
    problems = []
    for name in experiments:
        configurations = config["experiments"][name].get("configurations") or []
        problems += duplicate_configurations(f"experiments.{name}.configurations", configurations)
    recommend = config.get("recommend") or {}
    problems += duplicate_configurations(
        "recommend.configurations", recommend.get("configurations") or []
    )
    return problems


def lr_range_problems(config: Mapping[str, Any], experiments: Iterable[str]) -> list[str]:
    """Every learning rate of each enabled experiment within :data:`LR_RANGE` (one outside it
    is a typo: 1e300, or 5 for 5e-5); non-numbers, non-finite and non-positive values are
    named by :func:`vitplasticity.workflow.checks.grid_problems`."""
    low, high = LR_RANGE
    problems = []
    for name in experiments:
        exp = config["experiments"][name]
        grids = {"lrs": exp.get("lrs") or []}
        grids |= {f"lrs_by_dataset.{d}": v for d, v in (exp.get("lrs_by_dataset") or {}).items()}
        for field, lrs in grids.items():
            for index, lr in enumerate(lrs):
                number = isinstance(lr, int | float) and not isinstance(lr, bool)
                if number and 0 < lr < float("inf") and not low <= lr <= high:
                    problems.append(
                        f"experiments.{name}.{field}[{index}]: {lr!r} is outside the learning "
                        f"rates a run can use ({low:g} to {high:g}): check its exponent"
                    )
    return problems
