"""Finetuning configurations that train the same parameters under two spellings
(``mha+fc1`` and ``fc1+mha``), refused when the Snakefile is parsed: an experiment would
plan the same runs twice, recommend rank one component twice. Plain Python (no torch);
called by :func:`vitplasticity.workflow.config.check_config`, one message per problem."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

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
    """The configurations of each enabled experiment (whose runs would repeat) and of recommend (whose ranking would list one component twice), each parameter
    set once."""
    problems = []
    for name in experiments:
        configurations = config["experiments"][name].get("configurations") or []
        problems += duplicate_configurations(f"experiments.{name}.configurations", configurations)
    recommend = config.get("recommend") or {}
    problems += duplicate_configurations(
        "recommend.configurations", recommend.get("configurations") or []
    )
    return problems
