"""The model entries of config.yaml checked at parse time, without torch: what an entry lacks
for its weights, whether a local weights path is what its family loads, and which stages can
take its model, each family asked through its spec class
(:data:`vitplasticity.models.spec.FAMILIES`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vitplasticity.models.registry import FAMILY_KEY, family_inputs
from vitplasticity.models.spec import known_family


def model_inputs(entry: Mapping[str, Any]) -> str | None:
    """What the model of config entry ``entry`` takes: "images", "tokens", or None when the
    entry does not tell (a transformers model whose config.json only its job reads)."""
    spec = known_family(entry)
    return spec.declared_inputs(entry) if spec is not None else None


def takes(entry: Mapping[str, Any], inputs: str) -> bool:
    """Whether the model of config entry ``entry`` can take ``inputs`` ("images", "tokens"):
    its family takes them and the entry does not say it takes the other (a transformers entry
    whose ``config.model_type`` is a text model takes no images). A transformers entry that
    does not tell (a hub or folder checkpoint) takes both as far as the config knows; its job
    refuses what its model cannot take."""
    return inputs in family_inputs(entry) and model_inputs(entry) in (None, inputs)


def entry_problems(
    models: Mapping[str, Mapping[str, Any]],
    image_users: Mapping[str, Sequence[str]],
    text_models: Sequence[str],
) -> list[str]:
    """One message per model entry that lacks what its weights need (its family's
    ``entry_problems``: a random-init transformers model's config.model_type), and per model
    named by a stage that cannot take its inputs, where the entry tells (:func:`model_inputs`).

    Args:
        models: the config's ``models`` block.
        image_users: per config key of a stage that takes images, the models it names.
        text_models: the models text plasticity measures (``text_plasticity.run_models``).
    """
    problems = []
    for name, entry in models.items():
        spec = known_family(entry)
        problems.extend(spec.entry_problems(name, entry) if spec is not None else [])
    for key, names in image_users.items():
        for name in names:
            if name in models and model_inputs(models[name]) == "tokens":
                problems.append(
                    f"{key}: {name!r} is a text model (config.model_type "
                    f"{models[name]['config']['model_type']!r}): measure it with "
                    "text_plasticity.run_models, finetune it in an experiment of text datasets"
                )
    for name in text_models:
        if name not in models:
            problems.append(
                f"text_plasticity.run_models: unknown model {name!r} "
                f"(defined: {', '.join(sorted(models))})"
            )
        elif "tokens" not in family_inputs(models[name]):
            problems.append(
                f"text_plasticity.run_models: {name!r} is a {models[name].get(FAMILY_KEY)} "
                "model; text plasticity measures transformers text models (family: transformers)"
            )
        elif model_inputs(models[name]) == "images":
            problems.append(
                f"text_plasticity.run_models: {name!r} is a vision model (config.model_type "
                f"{models[name]['config']['model_type']!r}), not a text model"
            )
    return problems


def weights_path_problems(models: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """A local ``models.<name>.weights`` path must be what the entry's family loads (its
    spec's ``weights_path``): a weights file (timm), or a saved-model folder holding
    config.json (transformers)."""
    problems = []
    for name, entry in models.items():
        spec, weights = known_family(entry), entry.get("weights", "hub")
        if spec is None or not isinstance(weights, str) or weights in ("hub", "random"):
            continue
        key, path = f"models.{name}.weights", Path(weights)
        if spec.weights_path == "folder":
            problem = _weights_folder_problem(path)
        elif path.is_dir():
            problem = "is a folder: give the weights file in it (.safetensors, .pth or .bin)"
        else:
            problem = None if path.is_file() else "does not exist: give a weights file"
        if problem is not None:
            problems.append(f"{key}: {weights!r} {problem}, or hub or random")
    return problems


def _weights_folder_problem(path: Path) -> str | None:
    """What is wrong with ``path`` as a saved transformers model folder, None if nothing."""
    saved = "a saved-model folder (config.json and *.safetensors, as save_pretrained writes)"
    if path.is_file():
        return f"is a file: give {saved}"
    if not path.is_dir():
        return f"does not exist: give {saved}"
    if not (path / "config.json").is_file():
        return f"has no config.json: give {saved}"
    return None
