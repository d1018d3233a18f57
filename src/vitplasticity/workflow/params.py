"""What the rules' params are made of: canonical JSON, the demo switch, a stage's settings one
entry per key, and the folders and prefixes a command writes to, taken from its outputs.

A param must be a plain builtin value (a str, a number, a list of them) for Snakemake to track
it: a job reruns when one of its params changes, and only then.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeAlias

from vitplasticity.settings.declaration import rule_params

Wildcards: TypeAlias = Any
"""A job's wildcards as Snakemake gives them to an input, params or resources function: each
wildcard an attribute (``wildcards.model``)."""
ParamFunction = Callable[..., str]
"""A params function: Snakemake calls it with the job's wildcards (and ``output``)."""


def as_json(value: Any) -> str:
    """``value`` as a canonical JSON string (keys sorted): a str param Snakemake tracks."""
    return json.dumps(value, sort_keys=True)


def demo_flag(config: dict[str, Any]) -> str:
    """``--demo`` when the config is the demo's (config ``demo``), else ``""``."""
    return "--demo" if config["demo"] else ""


def config_block(config: dict[str, Any], block: str) -> dict[str, Any]:
    """The config block at the dotted path ``block`` (``report.criteria``)."""
    values = config
    for part in block.split("."):
        values = values[part]
    return values


def stage_params(config: dict[str, Any], settings: type, block: str) -> dict[str, Any]:
    """One params entry per setting of ``settings`` (a stage's settings class) that the config
    block ``block`` holds, in field order, and the demo switch: each value the config's own,
    so that editing one key reruns only its jobs."""
    params = rule_params(settings, config_block(config, block), block)
    return {**params, "demo_flag": demo_flag(config)}


def output_folder(name: str) -> ParamFunction:
    """A params function giving the folder of the job's output ``name``."""

    def folder(wildcards: Wildcards, output: Any) -> str:
        return os.path.dirname(getattr(output, name))

    return folder


def output_prefix(name: str, suffix: str) -> ParamFunction:
    """A params function giving the job's output ``name`` without its ``suffix``: the prefix
    a command that writes several files beside it is given."""

    def prefix(wildcards: Wildcards, output: Any) -> str:
        return getattr(output, name).removesuffix(suffix)

    return prefix
