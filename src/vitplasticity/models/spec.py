"""What a ``models:`` entry of config.yaml is: one spec type per model family, parsed once.

:meth:`ModelSpec.from_config` reads an entry into the spec of its ``family:``, the key of
:data:`FAMILIES`; an entry without ``family`` is a timm entry (the workflow's command lines
carry a compute job's timm spec without it). Two families are built in: timm
(:class:`TimmSpec`) and transformers (:class:`HFModelSpec`); another registers with
:func:`register_family` (tests register a toy one).

A spec is data: its family names the functions that build its model and give its
preprocessing (``builder``, ``preprocessor``: ``module:function``), which the front door,
:mod:`vitplasticity.models.build`, imports when a model is built. Its classmethods answer what
the Snakefile's parse-time checks ask of an entry (which inputs its model takes, what is
missing from it, what a meta-device build would check). Nothing here imports torch.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from vitplasticity.models.weights import LOCAL_FILENAME, RECORD_FILENAME

if TYPE_CHECKING:
    from vitplasticity.models.hub_file import HubFile


class ModelSpec:
    """The spec of one ``models`` entry; each family is a subclass (a frozen dataclass)."""

    family: ClassVar[str] = ""
    """The ``family:`` value that selects the subclass."""
    id_key: ClassVar[str] = ""
    """The entry key that names the model (``timm_id``, ``hf_id``)."""
    inputs: ClassVar[frozenset[str]] = frozenset({"images"})
    """What the family's models can take: "images", "tokens"."""
    builder: ClassVar[str] = ""
    """``module:function`` building the model: ``function(spec, num_classes)``."""
    preprocessor: ClassVar[str] = ""
    """``module:function`` giving the built model's eval preprocessing:
    ``function(model, spec)``."""
    weights_stage_files: ClassVar[tuple[str, ...]] = (RECORD_FILENAME,)
    """What the weights stage leaves in a ``weights: hub`` model's folder and its compute jobs
    read (:mod:`vitplasticity.models.weights`); the record, written last, is the sentinel."""
    weights_file_in_spec: ClassVar[bool] = False
    """Whether a compute job's spec names the first of :attr:`weights_stage_files` (timm's one
    safetensors file) rather than the folder (a transformers snapshot)."""
    family_in_spec: ClassVar[bool] = True
    """Whether a compute job's spec keeps ``family``. A timm spec leaves it out (a spec without
    one is timm's): the paper's command lines, and the specs its results record, are those of
    the timm-only layout, and must not change (Snakemake would rerun every job)."""
    runtime_estimated: ClassVar[bool] = False
    """Whether :mod:`vitplasticity.workflow.runtime` estimates a job's wall time from the
    model's FLOPs (it counts timm architectures only)."""
    weights_path: ClassVar[str] = "file"
    """What a local ``weights:`` path of the family names: a weights "file" or a saved-model
    "folder" (the workflow checks it when the config is parsed)."""

    @classmethod
    def from_config(cls, entry: Mapping[str, Any]) -> ModelSpec:
        """The spec of a ``models`` entry, in the class of its ``family`` (timm without one),
        rejecting unknown keys by name.

        Raises:
            ValueError: naming an unknown family or key, or a missing id key.
        """
        return spec_class(entry).parse(dict(entry))

    @classmethod
    def parse(cls, entry: dict[str, Any]) -> ModelSpec:
        """The spec of an entry of this family (:meth:`from_config` picks the family).

        Raises:
            ValueError: naming an unknown key or a missing one.
        """
        raise NotImplementedError(f"family {cls.family!r} does not parse entries")

    @property
    def model_id(self) -> str:
        """What names the model in messages (the entry's :attr:`id_key`)."""
        return str(getattr(self, self.id_key))

    @classmethod
    def declared_inputs(cls, entry: Mapping[str, Any]) -> str | None:
        """What the model of ``entry`` takes ("images", "tokens"), or None when the entry
        alone does not tell (its job reads the checkpoint)."""
        return next(iter(cls.inputs)) if len(cls.inputs) == 1 else None

    @classmethod
    def entry_problems(cls, name: str, entry: Mapping[str, Any]) -> list[str]:
        """What ``models.<name>`` lacks for its weights, found without torch."""
        return []

    @classmethod
    def meta_build_key(cls, entry: Mapping[str, Any]) -> str | None:
        """What a parse-time meta-device build of ``entry`` depends on (a cache key); None
        when the family builds nothing at parse time for it."""
        return None

    @classmethod
    def meta_build_problem(cls, name: str, entry: Mapping[str, Any]) -> str | None:
        """The message of a meta-device build of ``models.<name>`` that fails (imports torch),
        None when it builds."""
        return None

    @classmethod
    def hub_weights_file(cls, entry: Mapping[str, Any]) -> HubFile | None:
        """The one hub file a ``weights: hub`` entry's model loads, for its provenance; None
        when its weights are a folder (the weights stage records its files)."""
        return None


# --- timm ---------------------------------------------------------------------------------------

TIMM_KEYS = frozenset(
    {"timm_id", "weights", "normalize", "crop_pct", "init_seed", "kwargs", "revision"}
)
"""Keys of a timm model entry beside ``family``."""


@dataclass(frozen=True)
class TimmSpec(ModelSpec):
    """One ``family: timm`` entry of config.yaml's ``models``.

    ``timm_id``; ``weights``: "hub", "random", or a local .safetensors / .pth / .bin file;
    ``normalize``: "pretrained" (the checkpoint's pretrained_cfg), "imagenet" (ImageNet
    mean/std, as the reference code did) or ``{mean: [...], std: [...]}``; ``kwargs`` for
    ``timm.create_model`` (a tiny architecture for tests and the demo); ``crop_pct``, the eval
    crop fraction (1.0 is the reference code's Resize(224) + CenterCrop(224)); ``init_seed``, a
    random-init backbone's; ``revision``, the hub revision of ``weights: hub`` (the weights
    stage, :mod:`vitplasticity.models.weights`, fetches it for the workflow).
    """

    family = "timm"
    id_key = "timm_id"
    builder = "vitplasticity.models.timm_build:build_timm_model"
    preprocessor = "vitplasticity.models.timm_build:timm_preprocessing"
    # The one safetensors file timm loads, and its record.
    weights_stage_files = (LOCAL_FILENAME, RECORD_FILENAME)
    weights_file_in_spec = True
    family_in_spec = False
    runtime_estimated = True

    timm_id: str
    weights: str = "hub"
    normalize: str | dict[str, list[float]] = "pretrained"
    crop_pct: float | None = None
    init_seed: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)
    revision: str = "main"

    @classmethod
    def parse(cls, entry: dict[str, Any]) -> TimmSpec:
        """The spec of a timm entry (``family`` optional: a compute job's spec of a timm
        model leaves it out, workflow/rules/common.smk).

        Raises:
            ValueError: naming an unknown key, or a missing ``timm_id``.
        """
        entry = {key: value for key, value in entry.items() if key != "family"}
        unknown = set(entry) - TIMM_KEYS
        if unknown:
            raise ValueError(
                f"unknown model keys {sorted(unknown)} (family: {cls.family}); "
                f"known: {sorted(TIMM_KEYS | {'family'})}"
            )
        if "timm_id" not in entry:
            raise ValueError(f"model entry (family: {cls.family}) lacks 'timm_id'")
        return cls(**entry)

    @classmethod
    def meta_build_key(cls, entry: Mapping[str, Any]) -> str | None:
        """An entry with ``kwargs`` is built on the meta device at parse time; the build
        depends on timm's version, the id and the kwargs."""
        if not entry.get("kwargs"):
            return None
        identity = [importlib.metadata.version("timm"), entry["timm_id"], entry["kwargs"]]
        return json.dumps(identity, sort_keys=True, default=str)

    @classmethod
    def meta_build_problem(cls, name: str, entry: Mapping[str, Any]) -> str | None:
        """``timm.create_model`` of the entry on the meta device (no memory, no weights): a
        wrong id or keyword named before any job."""
        import timm
        import torch

        timm_id = entry["timm_id"]
        if not timm.is_model(timm_id):
            return (
                f"models.{name}.timm_id: {timm_id!r} is not a timm model (timm.list_models() "
                "lists them)"
            )
        try:
            with torch.device("meta"):
                timm.create_model(
                    timm_id, pretrained=False, **{**entry["kwargs"], "num_classes": 0}
                )
        # A bad keyword or value; not an op that the meta device lacks (the job tells those).
        except (TypeError, ValueError, AssertionError, KeyError) as error:
            return (
                f"models.{name}.kwargs: timm.create_model({timm_id!r}) refuses them "
                f"({type(error).__name__}: {error}): fix or remove the key"
            )
        return None

    @classmethod
    def hub_weights_file(cls, entry: Mapping[str, Any]) -> HubFile:
        """The hub file timm loads for a ``weights: hub`` entry
        (:func:`vitplasticity.models.hub_file.hub_file`).

        Raises:
            KeyError: for an entry without ``timm_id``.
            ValueError: when the hub has no safetensors file for it.
        """
        from vitplasticity.models.hub_file import hub_file

        return hub_file(
            str(entry["timm_id"]), str(entry.get("revision", "main")), entry.get("kwargs")
        )


# --- transformers -------------------------------------------------------------------------------

HF_FAMILY = "transformers"
"""The ``family`` of a transformers model's config entry."""

HF_MODEL_KEYS = frozenset(
    {
        "family",
        "hf_id",
        "revision",
        "weights",
        "config",
        "model_class",
        "init_seed",
        "normalize",
        "crop_pct",
    }
)
"""Keys of a transformers model's config entry (``family: transformers``)."""


TRANSFORMERS_MODEL_TYPES: dict[str, frozenset[str]] = {
    "tokens": frozenset(
        {
            *("gpt2", "llama", "mistral", "qwen2", "qwen3"),
            *("gemma", "gemma2", "gemma3_text", "phi3", "gpt_neox", "falcon", "olmo2"),
            *("mixtral", "qwen2_moe", "bert", "roberta", "deberta-v2"),
        }
    ),
    "images": frozenset(
        {
            "vit",
            "deit",
            "beit",
            "data2vec-vision",
            "vit_mae",
            "dinov2",
            "dinov2_with_registers",
            "dinov3_vit",
            "clip",
            "clip_vision_model",
            "siglip",
            "siglip_vision_model",
            "swin",
        }
    ),
}
"""The transformers ``model_type`` values of the registered architectures, by what they take:
how an entry tells a text model from a vision one without torch. Each architecture declares
its own (``Architecture.model_types``); this is their torch-free copy for the Snakefile, and
tests/models/test_registry.py checks the two agree."""

_DECODER_TASKS = (
    "ForCausalLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)
"""The task classes transformers puts around each of Llama, Mistral, Qwen2, Qwen3, GPT-NeoX,
Falcon, Mixtral and Qwen2-MoE."""

_ENCODER_TASKS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
)
"""The task classes around BERT, RoBERTa and DeBERTa-v2 measured (a multiple-choice class takes
(N, C, L) ids; a causal LM or pretraining class is a decoder or has two heads)."""

TRANSFORMERS_MODEL_CLASSES = frozenset(
    {
        "GPT2Model",
        *("GPT2LMHeadModel", "GPT2DoubleHeadsModel", "GPT2ForSequenceClassification"),
        *("GPT2ForTokenClassification", "GPT2ForQuestionAnswering"),
        *(
            f"{bare}{task}"
            for bare in ("Llama", "Mistral", "Qwen2", "Qwen3")
            for task in ("Model", *_DECODER_TASKS)
        ),
        *("GemmaModel", "GemmaForCausalLM", "GemmaForSequenceClassification"),
        "GemmaForTokenClassification",
        *("Gemma2Model", "Gemma2ForCausalLM", "Gemma2ForSequenceClassification"),
        "Gemma2ForTokenClassification",
        *("Phi3Model", "Phi3ForCausalLM", "Phi3ForSequenceClassification"),
        "Phi3ForTokenClassification",
        *("Olmo2Model", "Olmo2ForCausalLM", "Olmo2ForSequenceClassification"),
        *(
            f"{bare}{task}"
            for bare in ("Mixtral", "Qwen2Moe")
            for task in ("Model", *_DECODER_TASKS)
        ),
        *("Gemma3TextModel", "Gemma3ForCausalLM", "Gemma3TextForSequenceClassification"),
        *(f"{bare}{task}" for bare in ("GPTNeoX", "Falcon") for task in ("Model", *_DECODER_TASKS)),
        *(
            f"{bare}{task}"
            for bare in ("Bert", "Roberta", "DebertaV2")
            for task in ("Model", *_ENCODER_TASKS)
        ),
        *("ViTModel", "ViTForImageClassification", "ViTForMaskedImageModeling"),
        *("DeiTModel", "DeiTForImageClassification", "DeiTForImageClassificationWithTeacher"),
        "DeiTForMaskedImageModeling",
        *("BeitModel", "BeitForImageClassification", "BeitForMaskedImageModeling"),
        *("Data2VecVisionModel", "Data2VecVisionForImageClassification"),
        *("ViTMAEModel", "ViTMAEForPreTraining"),
        "DINOv3ViTModel",
        *("Dinov2Model", "Dinov2ForImageClassification"),
        *("Dinov2WithRegistersModel", "Dinov2WithRegistersForImageClassification"),
        *("CLIPVisionModel", "CLIPVisionModelWithProjection", "CLIPForImageClassification"),
        *("SiglipVisionModel", "SiglipForImageClassification"),
        *("SwinModel", "SwinForImageClassification", "SwinForMaskedImageModeling"),
    }
)
"""The transformers classes a ``model_class:`` (or a checkpoint's config.json
``architectures``) can name: those the registered architectures measure (their bare models
and vision towers, and the task classes around them: causal LMs, classifiers, ...). A
torch-free copy for the Snakefile; tests/models/test_bad_weights.py checks it against the
architectures, tests/models/test_wrapped_models.py measures every task class."""


@dataclass(frozen=True)
class HFModelSpec(ModelSpec):
    """One ``family: transformers`` entry of config.yaml's ``models``: a checkpoint (``hf_id``
    at ``revision``), where its weights come from, and the class to build (by default the
    bare model of the checkpoint's ``model_type``; the vision tower for CLIP and SigLIP, as
    their architectures declare).
    """

    id_key = "hf_id"
    inputs = frozenset({"images", "tokens"})
    weights_path = "folder"
    builder = "vitplasticity.models.hf_build:build_hf_model"
    preprocessor = "vitplasticity.models.hf_preprocessing:hf_preprocessing"

    hf_id: str
    """The hub repo (e.g. ``facebook/dinov2-base``); with ``weights: random``, a name only."""
    family: str = HF_FAMILY
    revision: str = "main"
    """Hub revision of ``weights: hub`` (branch, tag or commit)."""
    weights: str = "hub"
    """"hub", "random" (``init_seed``, no download) or a local folder (config.json and
    *.safetensors, maybe preprocessor_config.json)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Config overrides; with ``weights: random`` the whole config, ``model_type`` included."""
    model_class: str | None = None
    """A transformers class name; default: the bare model of the ``model_type``."""
    init_seed: int = 0
    """The seed a random-init model is drawn from (its only source of randomness)."""
    normalize: str | dict[str, list[float]] = "pretrained"
    """"pretrained" (the image processor's), "imagenet", or ``{mean: [...], std: [...]}``."""
    crop_pct: float | None = None
    """Overrides the image processor's eval crop fraction."""

    @classmethod
    def parse(cls, entry: dict[str, Any]) -> HFModelSpec:
        """Build from a config mapping, checking it without touching the disk or the hub.

        Raises:
            ValueError: naming an unknown key, a missing ``hf_id``, a ``config`` that is not
                a mapping, or ``weights: random`` without ``config.model_type``.
        """
        unknown = set(entry) - HF_MODEL_KEYS
        if unknown:
            raise ValueError(
                f"unknown model keys {sorted(unknown)} (family: {HF_FAMILY}); "
                f"known: {sorted(HF_MODEL_KEYS)}"
            )
        if not isinstance(entry.get("hf_id"), str) or not entry["hf_id"]:
            raise ValueError(f"model entry (family: {HF_FAMILY}) lacks 'hf_id'")
        spec = cls(**entry)
        if not isinstance(spec.config, dict):
            raise ValueError(f"model {spec.hf_id!r}: config must be a mapping, got {spec.config!r}")
        if spec.weights == "random" and "model_type" not in spec.config:
            raise ValueError(
                f"model {spec.hf_id!r}: weights: random builds the model from its config alone: "
                "config needs model_type (e.g. dinov2) and the sizes"
            )
        return spec

    @property
    def source(self) -> str:
        """Where the weights come from, for messages: the folder, or hf_id at its revision."""
        if self.weights == "hub":
            return self.hf_id if self.revision == "main" else f"{self.hf_id}@{self.revision}"
        return self.weights

    @classmethod
    def declared_inputs(cls, entry: Mapping[str, Any]) -> str | None:
        """What the entry's ``config.model_type`` takes among the registered architectures'
        model types (:data:`TRANSFORMERS_MODEL_TYPES`)."""
        model_type = (entry.get("config") or {}).get("model_type")
        for inputs, model_types in TRANSFORMERS_MODEL_TYPES.items():
            if model_type in model_types:
                return inputs
        return None

    @classmethod
    def entry_problems(cls, name: str, entry: Mapping[str, Any]) -> list[str]:
        """A random init is built from its config alone: it needs ``config.model_type``, one
        of the registered architectures' (:data:`TRANSFORMERS_MODEL_TYPES`); a
        ``model_class`` must be one they measure (:data:`TRANSFORMERS_MODEL_CLASSES`)."""
        problems = []
        model_class = entry.get("model_class")
        if model_class is not None and model_class not in TRANSFORMERS_MODEL_CLASSES:
            problems.append(
                f"models.{name}.model_class: {model_class!r} is not a class of the registered "
                f"architectures: one of {', '.join(sorted(TRANSFORMERS_MODEL_CLASSES))}, or "
                "leave it out (the bare model of the checkpoint's model_type)"
            )
        if entry.get("weights") != "random":
            return problems
        model_type = (entry.get("config") or {}).get("model_type")
        known = sorted(set().union(*TRANSFORMERS_MODEL_TYPES.values()))
        if not model_type:
            problems.append(
                f"models.{name}.config.model_type: missing (weights: random builds the model "
                "from its config alone, e.g. model_type: dinov2)"
            )
        elif model_type not in known:
            problems.append(
                f"models.{name}.config.model_type: {model_type!r} is not a model type of the "
                f"registered architectures: one of {', '.join(known)}"
            )
        return problems


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set now (huggingface_hub reads it
    once, at import)."""
    values = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any(str(v).upper() in {"1", "ON", "YES", "TRUE"} for v in values if v is not None)


# --- the families -------------------------------------------------------------------------------

DEFAULT_FAMILY = TimmSpec.family
"""The family of an entry without ``family``."""

FAMILIES: dict[str, type[ModelSpec]] = {spec.family: spec for spec in (TimmSpec, HFModelSpec)}
"""Every known family's spec class, by its ``family:`` value."""


def known_family(entry: Mapping[str, Any]) -> type[ModelSpec] | None:
    """The spec class of a ``models`` entry's family (timm without ``family``); None for an
    unknown family (the config's schema check names it)."""
    family = entry.get("family", DEFAULT_FAMILY)
    return FAMILIES.get(family) if isinstance(family, str) else None


def spec_class(entry: Mapping[str, Any]) -> type[ModelSpec]:
    """The spec class of a ``models`` entry's family (timm without ``family``).

    Raises:
        ValueError: naming an unknown family and the known ones.
    """
    spec = known_family(entry)
    if spec is None:
        raise ValueError(
            f"model entry family {entry.get('family')!r}: "
            f"expected {' or '.join(map(repr, FAMILIES))}"
        )
    return spec


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
