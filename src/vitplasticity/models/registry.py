"""The model families of config.yaml's ``models`` entries, selected by ``family:``.

One entry per family: its spec class (:class:`vitplasticity.models.spec.ModelSpec`), which
knows the entry's keys, how its model is built and what the parse-time checks ask of it. An
entry without ``family`` is a timm entry (:data:`DEFAULT_FAMILY`): the workflow's command lines
carry a timm spec without it. A family outside this package registers itself with
:func:`register_family` (tests register a toy one).

Nothing here imports torch: the Snakefile's checks read it at parse time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.spec_hf import HFModelSpec
from vitplasticity.models.spec_timm import TimmSpec

FAMILY_KEY = "family"
"""The key a model entry's family is chosen by."""

DEFAULT_FAMILY = TimmSpec.family
"""The family of an entry without ``family``."""

FAMILIES: dict[str, type[ModelSpec]] = {spec.family: spec for spec in (TimmSpec, HFModelSpec)}
"""Every known family's spec class, by its ``family:`` value."""

TRANSFORMERS_MODEL_TYPES: dict[str, frozenset[str]] = {
    "tokens": frozenset({"gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text"}),
    "images": frozenset(
        {
            "vit",
            "dinov2",
            "dinov2_with_registers",
            "dinov3_vit",
            "clip",
            "clip_vision_model",
            "siglip",
            "siglip_vision_model",
        }
    ),
}
"""The transformers ``model_type`` values of the registered architectures, by what they take:
how an entry tells a text model from a vision one without torch. Each architecture declares
its own (``Architecture.model_types``); this is their torch-free copy for the Snakefile, and
tests/models/test_registry.py checks the two agree."""


def model_id_keys() -> dict[str, str]:
    """Per family, the entry key that names its model (``timm_id``, ``hf_id``)."""
    return {name: spec.id_key for name, spec in FAMILIES.items()}


def known_family(entry: Mapping[str, Any]) -> type[ModelSpec] | None:
    """The spec class of a ``models`` entry's family (timm without ``family``); None for an
    unknown family (the config's schema check names it)."""
    family = entry.get(FAMILY_KEY, DEFAULT_FAMILY)
    return FAMILIES.get(family) if isinstance(family, str) else None


def spec_class(entry: Mapping[str, Any]) -> type[ModelSpec]:
    """The spec class of a ``models`` entry's family (timm without ``family``).

    Raises:
        ValueError: naming an unknown family and the known ones.
    """
    spec = known_family(entry)
    if spec is None:
        raise ValueError(
            f"model entry family {entry.get(FAMILY_KEY)!r}: "
            f"expected {' or '.join(map(repr, FAMILIES))}"
        )
    return spec


def family_inputs(entry: Mapping[str, Any]) -> frozenset[str]:
    """What the models of an entry's family can take ("images", "tokens"); nothing for an
    unknown family."""
    spec = known_family(entry)
    return spec.inputs if spec is not None else frozenset()


def register_family(spec: type[ModelSpec]) -> None:
    """Make ``spec``'s family selectable by ``family: <spec.family>``.

    Raises:
        ValueError: when a family of that name is registered.
    """
    if spec.family in FAMILIES:
        raise ValueError(f"model family {spec.family!r} is registered already")
    FAMILIES[spec.family] = spec


def unregister_family(name: str) -> None:
    """Forget the family ``name`` (one :func:`register_family` added)."""
    del FAMILIES[name]


def entry_family(
    value: Mapping[str, Any], families: Mapping[str, Any], where: str, problems: list[str]
) -> str | None:
    """The family of the model entry ``value`` at ``where`` among the config schema's
    ``families``; appends the message when it has none or an unknown one (guessing it from
    the id key, so that its keys are still checked)."""
    ids = model_id_keys()
    family = value.get(FAMILY_KEY)
    if isinstance(family, str) and family in families:
        return family
    if family is not None:
        problems.append(
            f"{where}.{FAMILY_KEY}: unknown family {family!r} (families: {', '.join(families)})"
        )
        return None
    guessed = [name for name, key in ids.items() if key in value]
    if "source" in value:  # an entry of the old text_plasticity.models block
        guessed = [HFModelSpec.family]
    if len(guessed) == 1:
        problems.append(
            f"{where}: no {FAMILY_KEY}: key (every model entry names its family now): add "
            f"{FAMILY_KEY}: {guessed[0]} (its {ids[guessed[0]]} names a {guessed[0]} model)"
        )
        return guessed[0]
    options = " or ".join(f"{FAMILY_KEY}: {f} (with {k})" for f, k in ids.items())
    problems.append(f"{where}: no {FAMILY_KEY}: key; add {options}")
    return None
