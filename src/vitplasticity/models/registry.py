"""What the Snakefile's parse-time checks ask of the model families, without torch: the key
an entry's family is chosen by, each family's id key and inputs, and the family of an entry
the config schema walks (:mod:`vitplasticity.workflow.config`). The families themselves are
:data:`vitplasticity.models.spec.FAMILIES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vitplasticity.models.spec import FAMILIES, HFModelSpec, known_family, spec_class

FAMILY_KEY = "family"
"""The key a model entry's family is chosen by."""


def model_id_keys() -> dict[str, str]:
    """Per family, the entry key that names its model (``timm_id``, ``hf_id``)."""
    return {name: spec.id_key for name, spec in FAMILIES.items()}


def family_inputs(entry: Mapping[str, Any]) -> frozenset[str]:
    """What the models of an entry's family can take ("images", "tokens"); nothing for an
    unknown family."""
    spec = known_family(entry)
    return spec.inputs if spec is not None else frozenset()


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


def models_of_family(models: Mapping[str, Mapping[str, Any]], family: str) -> list[str]:
    """The names of the ``models`` entries of ``family`` (an entry without one is timm's)."""
    return [name for name, entry in models.items() if spec_class(entry).family == family]
