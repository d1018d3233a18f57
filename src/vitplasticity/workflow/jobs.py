"""The model of a job: the weights files it reads and the model spec JSON on its command line.

A `weights: hub` model is fetched once by the weights stage (workflow/rules/weights.smk);
every compute job of the model then reads the local copy, which is why it is the job's input
and why the spec the job gets names the local file or folder instead of the hub. A model of
local weights (`weights: <path>`) has its checksum record as the jobs' input instead
(:mod:`vitplasticity.models.local_weights`), so that replacing the weights reruns them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vitplasticity.models.local_weights import update_record
from vitplasticity.models.registry import models_of_family
from vitplasticity.models.spec import ModelSpec, spec_class
from vitplasticity.models.weights import SOURCE_KWARGS
from vitplasticity.workflow.params import Wildcards, as_json


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

    def of_family(self, name: str) -> str:
        """A wildcard constraint matching the names of the models of family ``name``."""
        return names_pattern(models_of_family(self.models, name))

    def spec_class(self, model: str) -> type[ModelSpec]:
        """The spec class of ``model``'s family: how its jobs are wired (its weights stage's
        files, what its compute spec keeps, whether its runtime is estimated)."""
        return spec_class(self.models[model])

    def weights_folder(self, model: str) -> str:
        """Where the weights stage puts ``model``'s files: ``<resources>/weights/<model>``."""
        return f"{self.resources}/weights/{model}"

    def weights_files(self, model: str) -> list[str]:
        """The weights stage's outputs of a `weights: hub` model, which its compute jobs read
        (:attr:`~vitplasticity.models.spec.ModelSpec.weights_stage_files`); [] for random or local weights."""
        if self.models[model]["weights"] != "hub":
            return []
        return [
            f"{self.weights_folder(model)}/{name}"
            for name in self.spec_class(model).weights_stage_files
        ]

    def compute_spec(self, model: str) -> str:
        """The model's config entry as a compute job gets it (JSON): `weights: hub` becomes the
        weights stage's local file (timm) or folder (transformers), and `revision` (which only
        the weights stage reads) is left out, so that models not fetched from the hub keep their
        spec. A timm entry also leaves out `family: timm`
        (:attr:`~vitplasticity.models.spec.ModelSpec.family_in_spec`)."""
        entry = self.models[model]
        declared = self.spec_class(model)
        left_out = ("revision",) if declared.family_in_spec else ("revision", "family")
        spec = {k: v for k, v in entry.items() if k not in left_out}
        if entry["weights"] == "hub" and declared.weights_file_in_spec:
            spec["weights"] = self.weights_files(model)[0]
        elif entry["weights"] == "hub":
            spec["weights"] = self.weights_folder(model)
        return as_json(spec)

    def local_weights_record(self, model: str) -> list[str]:
        """The checksum record of a model of local weights (``weights: <path>``), brought up to
        date with the file's or folder's content now
        (:func:`~vitplasticity.models.local_weights.update_record`): [] for hub or random
        weights, or a path that does not exist (the config check names it)."""
        weights = self.models[model]["weights"]
        if weights in ("hub", "random") or not Path(weights).exists():
            return []
        return [str(update_record(weights, self.weights_folder(model)))]

    def weights(self, wildcards: Wildcards) -> list[str]:
        """Input function: what the job's model's weights are to Snakemake: the weights stage's
        files (:meth:`weights_files`) or the local weights' checksum record
        (:meth:`local_weights_record`)."""
        return self.weights_files(wildcards.model) + self.local_weights_record(wildcards.model)

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
