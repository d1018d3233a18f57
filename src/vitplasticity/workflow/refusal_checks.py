"""The stages' refusals of a model that the config alone decides, named when the Snakefile is
parsed (:func:`refusal_problems`), not minutes or hours into a job: a Swin under the embedding
protocol, an encoder ranked by recommend --text, a decoder's bounds, a Falcon with ALiBi
(:mod:`vitplasticity.models.refusals`: the families' own reasons, torch-free). A refusal the
config does not decide (a hub checkpoint's config.json, fetched by the weights job) is the job's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vitplasticity.models.refusals import entry_architecture, entry_refusals
from vitplasticity.models.spec import known_family
from vitplasticity.workflow.config import enabled_experiments
from vitplasticity.workflow.recommend_jobs import recommend_text_models


@dataclass(frozen=True)
class Use:
    """The models a config key names for the stages its jobs run, and what to do instead."""

    key: str
    models: list[str]
    stages: tuple[str, ...]
    remedy: str
    protocols_key: str | None = None
    """For a plasticity stage's use: the key of its protocols, offered where the model's family
    takes another protocol."""


STAGE_NAMES: dict[str, str] = {
    "plasticity embedding": "the embedding protocol",
    "plasticity in_situ": "the in_situ protocol",
    "bounds": "the bounds",
    "recommend": "recommend",
    "recommend lm": "recommend by the next-token loss (unlabelled text)",
    "export": "recommend's export",
    "finetune": "finetuning",
    "lora": "LoRA",
}
"""How a message names each stage a family may refuse."""


PROTOCOLS = ("embedding", "in_situ")


def _protocols(block: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(f"plasticity {p}" for p in block.get("protocols") or ["embedding"])


def _remedy(use: Use, refusals: Mapping[str | None, str]) -> str:
    """What to do about a refusal of ``use``: for a protocol, the protocols the family takes
    (none: drop the model)."""
    if use.protocols_key is None:
        return use.remedy
    taken = [p for p in PROTOCOLS if f"plasticity {p}" not in refusals]
    if not taken:
        return "drop the model (it takes neither protocol)"
    return f"use {use.protocols_key}: [{', '.join(taken)}] or drop the model"


def image_uses(config: Mapping[str, Any]) -> list[Use]:
    """The image stages' uses: the plasticity models (their protocols, and the bounds every one
    gets), recommend's (with recommend enabled), the enabled experiments' (finetune, LoRA;
    a text experiment's too)."""
    plasticity = config["plasticity"]
    found = [
        Use(
            "plasticity.models",
            plasticity["models"],
            _protocols(plasticity),
            "",
            "plasticity.protocols",
        ),
        Use(
            "plasticity.models",
            plasticity["models"],
            ("bounds",),
            "the workflow computes the bounds of every plasticity.models entry: drop the model",
        ),
    ]
    recommend = config.get("recommend") or {}
    if recommend.get("enabled"):
        key = "recommend.models" if recommend.get("models") else "plasticity.models"
        found.append(
            Use(
                f"{key} (recommend.enabled)",
                recommend.get("models") or plasticity["models"],
                ("recommend", "export"),
                "rank other models in recommend.models, or set recommend.enabled: false",
            )
        )
    for name in enabled_experiments(dict(config)):
        exp = config["experiments"][name]
        lora = any("lora" in str(c).split("+") for c in exp.get("configurations") or [])
        stages = ("finetune", "lora") if lora else ("finetune",)
        found.append(
            Use(f"experiments.{name}.models", exp.get("models") or [], stages, "drop the model")
        )
    return found


def text_uses(config: Mapping[str, Any]) -> list[Use]:
    """The text stages' uses: text plasticity's models (its protocols; recommend --text with
    recommend enabled, of the models it ranks) and its bounds models (a text experiment's models are an experiment's:
    :func:`image_uses`)."""
    found = []
    text = config.get("text_plasticity") or {}
    if text.get("enabled"):
        run = text.get("run_models") or []
        found.append(
            Use(
                "text_plasticity.run_models", run, _protocols(text), "", "text_plasticity.protocols"
            )
        )
        found.append(
            Use(
                "text_plasticity.bounds_models",
                text.get("bounds_models") or [],
                ("bounds",),
                "drop it from text_plasticity.bounds_models",
            )
        )
        if (config.get("recommend") or {}).get("enabled"):
            found.append(
                Use(
                    "text_plasticity.run_models (recommend --text: recommend.enabled ranks every "
                    "text model)",
                    recommend_text_models(config),
                    ("recommend", "recommend lm"),
                    "drop the model from text_plasticity.run_models, or set "
                    "recommend.enabled: false; an encoder that recommend.models ranks on labelled "
                    "text of recommend.datasets is left to that",
                )
            )
    return found


def _described(name: str, entry: Mapping[str, Any]) -> str:
    """How a message names model ``name``: with its id (``'swin_t' (swin_tiny_...)``)."""
    spec = known_family(entry)
    return repr(name) if spec is None else f"{name!r} ({entry.get(spec.id_key)})"


def refusal_problems(config: Mapping[str, Any]) -> list[str]:
    """One message per (key, model, stage) that a model's architecture refuses, known from the
    config (:func:`vitplasticity.models.refusals.entry_refusals`), naming the key, the model,
    the architecture's reason and what to do; and one per model refused whatever the stage (a
    Falcon with ALiBi), at its ``models.<name>`` entry, when a stage uses it."""
    models = config["models"]
    problems: list[str] = []
    whole: dict[str, str] = {}
    for use in image_uses(config) + text_uses(config):
        for name in dict.fromkeys(use.models):
            entry = models.get(name)
            if not isinstance(entry, Mapping):
                continue  # an unknown name: named by the name checks
            refusals = entry_refusals(entry)
            if None in refusals:
                whole.setdefault(name, refusals[None])
            for stage in use.stages:
                if stage in refusals:
                    problems.append(
                        f"{use.key}: {_described(name, entry)}: {entry_architecture(entry)} refuses "
                        f"{STAGE_NAMES[stage]}: {refusals[stage]}; {_remedy(use, refusals)}"
                    )
    problems += [
        f"models.{name}: {_described(name, models[name])} is refused by every stage: {reason}; "
        "use another model"
        for name, reason in whole.items()
    ]
    return problems
