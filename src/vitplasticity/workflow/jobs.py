"""The model of a job: the weights files it reads and the model spec JSON on its command line.

A `weights: hub` model is fetched once by the weights stage (workflow/rules/weights.smk);
every compute job of the model then reads the local copy, which is why it is the job's input
and why the spec the job gets names the local file or folder instead of the hub.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vitplasticity.models.weights import LOCAL_FILENAME, RECORD_FILENAME, SOURCE_KWARGS
from vitplasticity.workflow.params import Wildcards, as_json


@dataclass(frozen=True)
class FamilyWiring:
    """How the workflow wires the jobs of one model family.

    Attributes:
        weights_files: the weights stage's outputs a compute job reads (in its folder).
        spec_weights_file: whether the spec's ``weights`` names the first of them (timm's
            safetensors file) instead of the folder (a transformers snapshot).
        spec_family: whether the spec keeps ``family``: a timm spec leaves it out, which a
            spec without a family means (the paper's commands, and the specs its results
            record, are those of the timm-only layout).
        runtime_estimated: whether vitplasticity.workflow.runtime can estimate a job's wall
            time (it counts the FLOPs of timm architectures only; vitplasticity.workflow.costs).
    """

    weights_files: tuple[str, ...]
    spec_weights_file: bool
    spec_family: bool
    runtime_estimated: bool


FAMILY_WIRING: dict[str, FamilyWiring] = {
    # The one safetensors file timm loads, and its record.
    "timm": FamilyWiring((LOCAL_FILENAME, RECORD_FILENAME), True, False, True),
    # The record, written last, lists the snapshot's files beside it: the folder's sentinel.
    "transformers": FamilyWiring((RECORD_FILENAME,), False, True, False),
}


def names_pattern(names: Iterable[str]) -> str:
    """A wildcard constraint matching exactly ``names`` (none: a pattern that matches nothing)."""
    return "|".join(re.escape(name) for name in names) or "(?!)"


class ModelJobs:
    """The weights inputs and model specs of the config's models (``models.<name>``), the
    weights stage's files below ``<resources>/weights`` (config ``paths.resources``).

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.models: dict[str, dict[str, Any]] = config["models"]
        self.resources = config["paths"]["resources"]

    def of_family(self, family: str) -> str:
        """A wildcard constraint matching the names of the models of ``family``."""
        return names_pattern(
            name for name, entry in self.models.items() if entry["family"] == family
        )

    def wiring(self, model: str) -> FamilyWiring:
        """How the jobs of ``model``'s family are wired."""
        return FAMILY_WIRING[self.models[model]["family"]]

    def weights_folder(self, model: str) -> str:
        """Where the weights stage puts ``model``'s files: ``<resources>/weights/<model>``."""
        return f"{self.resources}/weights/{model}"

    def weights_files(self, model: str) -> list[str]:
        """The weights stage's outputs of a `weights: hub` model, which its compute jobs read
        (:data:`FAMILY_WIRING`); [] for random or local weights."""
        if self.models[model]["weights"] != "hub":
            return []
        return [f"{self.weights_folder(model)}/{name}" for name in self.wiring(model).weights_files]

    def compute_spec(self, model: str) -> str:
        """The model's config entry as a compute job gets it (JSON): `weights: hub` becomes the
        weights stage's local file (timm) or folder (transformers), and `revision` (which only
        the weights stage reads) is left out, so that models not fetched from the hub keep their
        spec. A timm entry also leaves out `family: timm` (:class:`FamilyWiring`)."""
        entry = self.models[model]
        wiring = self.wiring(model)
        left_out = ("revision",) if wiring.spec_family else ("revision", "family")
        spec = {k: v for k, v in entry.items() if k not in left_out}
        if entry["weights"] == "hub" and wiring.spec_weights_file:
            spec["weights"] = self.weights_files(model)[0]
        elif entry["weights"] == "hub":
            spec["weights"] = self.weights_folder(model)
        return as_json(spec)

    def weights(self, wildcards: Wildcards) -> list[str]:
        """Input function: the weights files of the job's model (:meth:`weights_files`)."""
        return self.weights_files(wildcards.model)

    def spec(self, wildcards: Wildcards) -> str:
        """Params function: the model spec JSON of the job's model (:meth:`compute_spec`)."""
        return self.compute_spec(wildcards.model)

    def source_kwargs(self, wildcards: Wildcards) -> str:
        """Params function: the model's kwargs that decide where its weights come from (JSON;
        usually {})."""
        kwargs = self.models[wildcards.model]["kwargs"]
        return as_json({k: kwargs[k] for k in SOURCE_KWARGS if k in kwargs})

    def entry_value(self, key: str) -> Callable[[Wildcards], Any]:
        """A params function giving the job's model's ``models.<name>.<key>``."""

        def value(wildcards: Wildcards) -> Any:
            return self.models[wildcards.model][key]

        return value
