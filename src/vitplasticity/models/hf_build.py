"""Building the transformers model of a config entry (``family: transformers``), strictly.

The class built from a checkpoint (``weights: hub`` or a saved folder) is the entry's
``model_class``; without one, the class its config.json's ``architectures`` names (what
``save_pretrained`` wrote: a saved ``LlamaForCausalLM`` loads as one, its ``lm_head`` with
it), unless it names a dual encoder whose tower the family measures (CLIP, SigLIP: the family's
declared default class); without either, the bare model of its ``model_type``. A class no
architecture measures is an error naming the folder and the class.

Loading is strict. transformers loads a Llama folder into a GPT2Model, or a checkpoint that
lacks a tensor into its class, with a warning, and leaves every weight it cannot place at its
random init: a random model would be measured or finetuned. Here the checkpoint's config.json
must have the class's ``model_type``, and every weight of the model must come from the
checkpoint with its shape and nothing else be in it; otherwise the error names the folder (or
hub id) and the first keys. Two kinds of left-over tensors are dropped (and logged), as timm's
path drops a checkpoint's classifier: a vision tower's checkpoint head (its architecture's
``checkpoint_heads``: ``classifier``; ViT's ``pooler``, which neither
ViTForImageClassification nor any stage uses), and the rest of a CLIP or SigLIP dual encoder
(its architecture's ``other_tower_keys``: its text tower, projections and logit scale).

Attention is eager unless the entry's ``config`` says otherwise (``attn_implementation``): the
float64 plasticity and the architectures' contract compute attention as the eager kernel does.
Weights load in float32 (``config: {dtype: ...}`` overrides it); the stages cast. What is built
for which class (the default class of a model type, a tower's keyword arguments, its
classification class) is declared by the families' architectures
(:func:`vitplasticity.models.architectures.declared`).

``transformers`` is the optional extra ``vitplasticity[extras]``
(:func:`vitplasticity.utils.optional.require_transformers`); it is imported only when a model is built.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitplasticity.models.architectures import declared
from vitplasticity.models.checked_weights import check_finite, check_safetensors_folder
from vitplasticity.models.hf_classifier import shown_keys, with_classifier
from vitplasticity.models.spec import TRANSFORMERS_MODEL_CLASSES, HFModelSpec, hub_offline
from vitplasticity.utils.optional import require_transformers

log = logging.getLogger(__name__)


def build_hf_model(spec: HFModelSpec, num_classes: int = 0) -> nn.Module:
    """The model of ``spec``, in eval mode: the bare model (``num_classes`` 0), or a vision
    tower in its classification class with a new ``num_classes``-way head.

    The model (``weights: random``: from ``init_seed`` alone; else loaded strictly) is built
    leaving the caller's RNG as it was; the new head is then drawn from it, so a run's seed
    sets the head and nothing else.

    Raises:
        ImportError: naming the optional extra when transformers is missing.
        FileNotFoundError: for weights that are neither "hub", "random" nor a folder, a
            folder without config.json, or hub files that cannot be fetched (offline: not in
            the cache), naming the hub id and revision.
        ValueError: for a checkpoint of another model type than the class's (naming the folder
            and both types); missing, unexpected or differently shaped weights (naming the
            folder and the first keys); an unknown model class, or a checkpoint whose
            config.json names a class no architecture measures (naming the folder and the
            class); ``num_classes`` on a class
            that is not a known vision tower; a folder's safetensors file that is not whole,
            or a loaded weight that is not finite (naming the file, or the folder and weight).
    """
    if spec.weights not in ("hub", "random") and not Path(spec.weights).is_dir():
        raise FileNotFoundError(
            f"model weights {spec.weights!r} ({spec.hf_id}): not 'hub', 'random' nor a saved "
            "model folder"
        )
    transformers = require_transformers()
    overrides = dict(spec.config)
    overrides.setdefault("attn_implementation", "eager")
    dtype = _dtype(overrides.pop("dtype", "float32"), spec)
    with torch.random.fork_rng(devices=[]):
        if spec.weights == "random":
            torch.manual_seed(spec.init_seed)
            model = random_model(transformers, spec, overrides).to(dtype)
        else:
            if spec.weights != "hub":
                check_safetensors_folder(spec.weights)
            model = load_strict(transformers, spec, overrides, dtype)
            check_finite(model.named_parameters(), spec.source)
    if num_classes:
        model = with_classifier(transformers, model, num_classes)
    return model.eval()


def _dtype(name: Any, spec: HFModelSpec) -> torch.dtype:
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"model {spec.hf_id!r}: config.dtype {name!r} is not a float dtype")
    return dtype


def model_class_for(transformers: Any, name: str | None, model_type: Any, source: str) -> type:
    """The class to build: ``name``, or the bare model of ``model_type``.

    Raises:
        ValueError: naming ``source`` when the class is not a transformers model class or no
            bare model is known for the model type.
    """
    if name is None:
        from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

        name = declared("default_classes").get(model_type) or MODEL_MAPPING_NAMES.get(model_type)
        if name is None:
            raise ValueError(
                f"model {source!r}: no transformers model class for model_type {model_type!r}: "
                "name one (model_class)"
            )
    found = getattr(transformers, name, None)
    if not (isinstance(found, type) and issubclass(found, transformers.PreTrainedModel)):
        raise ValueError(f"model {source!r}: model_class {name!r} is not a transformers model")
    return found


def saved_class(config: dict[str, Any], source: str) -> str | None:
    """The class a checkpoint's config.json names (``architectures``, one entry, as
    ``save_pretrained`` writes it); None when it names none, or names a class the
    architectures do not measure while its ``model_type`` has a class its family declares
    (a CLIP or SigLIP dual encoder: its vision tower).

    Raises:
        ValueError: naming ``source`` and the class(es), for an ``architectures`` that is not
            one class name, or a class no registered architecture measures.
    """
    names = config.get("architectures")
    if names is None or names == []:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            f"model {str(source)!r}: its config.json's architectures is {names!r}, not a list "
            "of class names"
        )
    if len(names) > 1:
        raise ValueError(
            f"model {str(source)!r}: its config.json names the classes {names} "
            "(architectures): name the one to build (model_class)"
        )
    (name,) = names
    if name in TRANSFORMERS_MODEL_CLASSES:
        return name
    if config.get("model_type") in declared("default_classes"):
        return None
    raise ValueError(
        f"model {str(source)!r}: its config.json names the class {name!r} (architectures), "
        "which no vitplasticity architecture measures; the classes that load: "
        f"{', '.join(sorted(TRANSFORMERS_MODEL_CLASSES))}"
    )


def expected_model_types(model_class: type) -> tuple[str, ...]:
    """The config.json ``model_type`` values that load into ``model_class``: its config's,
    and that of the dual encoder whose checkpoint holds it (CLIP, SigLIP vision towers)."""
    own = model_class.config_class.model_type
    dual_encoders = declared("dual_encoders")
    return (own, dual_encoders[own]) if own in dual_encoders else (own,)


def check_model_type(model_type: Any, model_class: type, source: str) -> None:
    """Raise unless ``model_type`` (from ``source``'s config) loads into ``model_class``.

    Raises:
        ValueError: naming the source, both model types and the class.
    """
    expected = expected_model_types(model_class)
    if model_type not in expected:
        shown = " or ".join(repr(t) for t in expected)
        raise ValueError(
            f"model {str(source)!r}: its config.json has model_type {model_type!r}, not "
            f"{shown}: only such checkpoints load into a {model_class.__name__}"
        )


def random_model(transformers: Any, spec: HFModelSpec, overrides: dict[str, Any]) -> nn.Module:
    """``model_class(config)`` from the config overrides alone (the caller seeds the RNG).

    Raises:
        ValueError: for a model type the class does not take, or an unknown class.
    """
    settings = dict(overrides)
    model_type = settings.pop("model_type")
    model_class = model_class_for(transformers, spec.model_class, model_type, spec.hf_id)
    own = model_class.config_class.model_type
    if model_type != own:
        check_model_type(model_type, model_class, spec.hf_id)
        raise ValueError(
            f"model {spec.hf_id!r}: weights: random builds {model_class.__name__} from its own "
            f"config: give config.model_type {own!r} (and the tower's sizes), not {model_type!r}"
        )
    config = model_class.config_class(**settings)
    return model_class(config, **declared("tower_kwargs").get(model_class.__name__, {}))


def saved_config(spec: HFModelSpec) -> dict[str, Any]:
    """The config.json of ``spec``'s weights: a folder's, or the hub repo's at its revision.

    Raises:
        FileNotFoundError: naming a folder without config.json.
        ValueError: naming a config.json that is not a JSON object.
    """
    if spec.weights == "hub":
        transformers = require_transformers()
        with _named_hub_errors(spec):
            config, _ = transformers.PretrainedConfig.get_config_dict(
                spec.hf_id, revision=spec.revision, local_files_only=hub_offline()
            )
        return config
    path = Path(spec.weights) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"model folder {spec.weights!r} has no config.json: not a saved transformers model "
            "(save_pretrained writes one beside the weights)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a JSON file ({error})") from error
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


@contextmanager
def _named_hub_errors(spec: HFModelSpec) -> Iterator[None]:
    """transformers' errors for a hub file it cannot get (its OSError names the endpoint,
    not the repo), as FileNotFoundError naming the model, its revision and HF_HUB_OFFLINE."""
    try:
        yield
    except OSError as error:
        if spec.weights != "hub":
            raise
        offline = " with HF_HUB_OFFLINE set (the cache only)" if hub_offline() else ""
        raise FileNotFoundError(
            f"model {spec.source!r} (hf_id {spec.hf_id}, revision {spec.revision}): its files "
            f"could not be fetched{offline}: {error}"
        ) from error


def saved_model_class(transformers: Any, spec: HFModelSpec) -> tuple[type, Any]:
    """The class ``spec``'s checkpoint loads into (the entry's ``model_class``, else the one
    its config.json names) and the checkpoint's model type, checked to agree.

    Raises:
        ValueError: for an unknown class, or a model type the class does not take.
    """
    config = saved_config(spec)
    model_type = config.get("model_type")
    name = spec.model_class or saved_class(config, spec.source)
    model_class = model_class_for(transformers, name, model_type, spec.source)
    check_model_type(model_type, model_class, spec.source)
    return model_class, model_type


def load_strict(
    transformers: Any, spec: HFModelSpec, overrides: dict[str, Any], dtype: torch.dtype
) -> nn.Module:
    """``model_class.from_pretrained`` of ``spec``'s weights, refusing a checkpoint of another
    model type or one that does not fill the model exactly.

    Raises:
        ValueError: naming the source and both model types, or the first few missing,
            unexpected or differently shaped weights (a tower's checkpoint head and a dual
            encoder's other tower dropped first).
    """
    source = spec.source
    model_class, model_type = saved_model_class(transformers, spec)
    where: dict[str, Any] = {}
    if spec.weights == "hub":
        where = {"revision": spec.revision, "local_files_only": hub_offline()}
    with _named_hub_errors(spec), _checked_warnings_quiet():
        model, info = model_class.from_pretrained(
            spec.hf_id if spec.weights == "hub" else spec.weights,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # reported below, by name
            dtype=dtype,
            **where,
            **declared("tower_kwargs").get(model_class.__name__, {}),
            **overrides,
        )
    droppable = declared("checkpoint_heads").get(model_class.__name__, ()) + declared(
        "other_tower_keys"
    ).get(model_type, ())
    unexpected = sorted(str(key) for key in info.get("unexpected_keys") or ())
    dropped = [key for key in unexpected if key.startswith(droppable)]
    if dropped:
        log.info("%s: checkpoint tensors dropped (%s)", source, ", ".join(dropped))
    missing = sorted(str(key) for key in info.get("missing_keys") or ())
    missing = _without_unused_module(model, missing, source)
    found = {
        "missing": missing,
        "unexpected": [key for key in unexpected if key not in dropped],
        "mismatched": sorted(_mismatch(item) for item in info.get("mismatched_keys") or ()),
    }
    problems = [
        f"{len(keys)} {kind} weight(s): {shown_keys(keys)}" for kind, keys in found.items() if keys
    ]
    if problems:
        raise ValueError(
            f"model {str(source)!r}: the checkpoint does not match {model_class.__name__}: "
            f"{'; '.join(problems)}"
        )
    return model


def _without_unused_module(model: nn.Module, missing: list[str], source: object) -> list[str]:
    """``missing`` without the tensors of the model's unused module (``unused_modules``, e.g.
    BERT's pooler) when the checkpoint holds none of them: the module is removed from the
    model, and the log says so. A module the checkpoint holds in part stays missing."""
    name = declared("unused_modules").get(type(model).__name__)
    module = getattr(model, name, None) if name else None
    if module is None:
        return missing
    own = {f"{name}.{key}" for key in module.state_dict()}
    if not own or not own <= set(missing):
        return missing
    setattr(model, name, None)
    log.info(
        "%s: the checkpoint holds no %s (%d tensors); no stage uses it, so %s is built without it",
        source,
        name,
        len(own),
        type(model).__name__,
    )
    return [key for key in missing if key not in own]


class _CheckedLoadWarnings(logging.Filter):
    """Drops transformers' load warnings about what :func:`load_strict` checks itself: the
    LOAD REPORT table of missing, unexpected and mismatched keys (refused by name, or a
    checkpoint head dropped and logged) and "This checkpoint seem corrupted" (tied weights
    both absent: they stay missing keys, refused by name). A report with CONVERSION rows is
    kept: the project does not check the conversion, and transformers' error points to it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("This checkpoint seem corrupted"):
            return False
        return "LOAD REPORT" not in message or "CONVERSION" in message


@contextmanager
def _checked_warnings_quiet() -> Iterator[None]:
    """transformers' modeling_utils logger without :class:`_CheckedLoadWarnings`' warnings."""
    logger = logging.getLogger("transformers.modeling_utils")
    quiet = _CheckedLoadWarnings()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _mismatch(item: Any) -> str:
    if isinstance(item, tuple) and len(item) == 3:
        key, saved, wanted = item
        return f"{key} ({tuple(saved)} in the checkpoint, {tuple(wanted)} in the model)"
    return str(item)
