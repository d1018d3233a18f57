"""Text models of ``models:`` entries: the spec of one a text stage measures, and its LM head.

The text stages (text plasticity, recommend --text) take a ``models`` entry whose family takes
token ids (``family: transformers``); they build it through the front door
(:func:`vitplasticity.models.build.build_model`), ``lm_head=True`` where the next-token loss
needs the head (:func:`causal_lm`). torch and transformers are imported when a model is built.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vitplasticity.models.registry import family_inputs
from vitplasticity.models.spec import spec_class

if TYPE_CHECKING:
    from torch import nn

    from vitplasticity.models.spec import HFModelSpec, ModelSpec

POSITION_KEYS: tuple[str, ...] = ("n_positions", "max_position_embeddings")
"""The config keys that bound a sequence's length, in the order they are read (GPT2's first),
as :func:`max_positions` reads a built model's config."""


def stated_positions(entry: Mapping[str, Any]) -> int | None:
    """The positions a random-init text model's entry states in its config (the longest
    sequence it takes), known before it is built, torch-free (the workflow checks it at
    parse); None for a checkpoint (its own config.json says) or a config that states none
    (its model type's default, which transformers knows)."""
    config = entry.get("config")
    if entry.get("weights") != "random" or not isinstance(config, Mapping):
        return None
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def check_stated_positions(model_name: str, entry: Any, sequence_length: int) -> None:
    """Refuse a ``sequence_length`` beyond the positions a random init's entry states
    (:func:`stated_positions`), before the model is built.

    Raises:
        ValueError: naming --sequence-length, the positions and the model.
    """
    limit = stated_positions(entry) if isinstance(entry, Mapping) else None
    if limit is not None and sequence_length > limit:
        raise ValueError(
            f"--sequence-length {sequence_length} exceeds the {limit} positions of model "
            f"{model_name!r} (its --model-spec config)"
        )


LM_HEAD_CLASSES: tuple[str, ...] = ("ForCausalLM", "LMHeadModel", "DoubleHeadsModel")
"""How the names of the text classes with an LM head end (a bare ``<Type>Model`` and a task
class such as ``<Type>ForSequenceClassification`` have none)."""


def untied_bare_model(entry: Any) -> str | None:
    """The class of a text model without an LM head (a bare model, or a classifier) whose
    entry's config unties the head (``tie_word_embeddings: false``), which :func:`causal_lm`
    refuses: known from the entry alone, torch-free. That is the default class (no
    ``model_class``) or any class but a causal LM's (:data:`LM_HEAD_CLASSES`). None otherwise
    (also when the config leaves the tie to the model type's default)."""
    config = entry.get("config") if isinstance(entry, Mapping) else None
    if not isinstance(config, Mapping) or config.get("tie_word_embeddings") is not False:
        return None
    model_class = entry.get("model_class")
    if model_class is None:
        return f"the bare model of model_type {config.get('model_type', '?')}"
    if isinstance(model_class, str) and not model_class.endswith(LM_HEAD_CLASSES):
        return model_class
    return None


def text_model_spec(model_name: str, entry: Any) -> ModelSpec:
    """The spec of text model ``model_name``'s ``models:`` entry (a family that takes token
    ids: ``family: transformers``).

    Raises:
        ValueError: when ``entry`` is not a mapping, is of a family of image models, carries
            the old text-model key ``source``, or has an unknown key (naming it).
    """
    if not isinstance(entry, dict):
        raise ValueError(f"--model-spec: expected a JSON object, got {entry!r}")
    if "source" in entry:
        raise ValueError(
            f"--model-spec of model {model_name!r}: 'source' is the old text-model key; "
            "write weights: hub | random | <saved model folder> (with family: transformers)"
        )
    if "tokens" not in family_inputs(entry):
        raise ValueError(
            f"--model-spec of model {model_name!r}: family {entry.get('family', 'timm')!r}; "
            "text plasticity measures transformers text models (family: transformers)"
        )
    return spec_class(entry).parse(entry)


def text_model_entry(model_name: str, entry: Any) -> ModelSpec:
    """The spec of a text model's entry, refusing an image family's entry first as
    recommend --text does (:func:`text_model_spec` otherwise).

    Raises:
        UnsupportedModel: for the entry of a family of image models (timm), naming the model.
        ValueError: for an entry :func:`text_model_spec` refuses.
    """
    from vitplasticity.models.architectures.base import UnsupportedModel

    if isinstance(entry, dict) and family_inputs(entry) == {"images"}:
        family = spec_class(entry).family
        raise UnsupportedModel(
            f"model {model_name!r} is a {family} model (family: {family}), an image model: the "
            "text recommend ranks a causal language model on text; rank it with `vitplasticity "
            "recommend`"
        )
    return text_model_spec(model_name, entry)


def causal_lm(model: nn.Module) -> nn.Module:
    """``model`` when it is a causal LM (it has an LM head), else the causal-LM counterpart
    (transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING`` for its config) of its base model (a
    classifier's, ``LlamaForSequenceClassification.model``; a bare model is its own) built
    around the same modules, the head tied to the token embedding. The counterpart is built
    on the meta device and takes the base model whole: no weight is copied or drawn; its
    names are those the classifier gives the base model (both hold it under the family's
    ``base_model_prefix``), and the classifier's own head is not in it.

    Raises:
        UnsupportedModel: naming the class, for a model without an LM head whose config
            unties it (``tie_word_embeddings`` false: its weights are not in the model), one
            without a causal-LM class, or a counterpart that holds more than the base model
            and a tied head.
    """
    import torch

    from vitplasticity.models.architectures.base import UnsupportedModel

    if model.get_output_embeddings() is not None:
        return model
    name = type(model).__name__
    model, lm_class = _lm_counterpart(model, "MODEL_FOR_CAUSAL_LM_MAPPING", "causal-LM")
    config = model.config
    if not getattr(config, "tie_word_embeddings", False):
        raise UnsupportedModel(
            f"{name} has no LM head and its config unties it (tie_word_embeddings false): the "
            "head's weights are not in the model, and the next-token loss needs them; name "
            f"the causal-LM class in the model entry (model_class: {lm_class.__name__})"
        )
    with torch.device("meta"):
        lm = lm_class(config)
    setattr(lm, lm.base_model_prefix, model)
    lm.get_output_embeddings().weight = model.get_input_embeddings().weight
    # By identity, not by device: a streamed model's own tensors are on the meta device too.
    own = _tensor_ids(model)
    left = [n for n, t in (*lm.named_parameters(), *lm.named_buffers()) if id(t) not in own]
    if left:
        raise UnsupportedModel(
            f"{name}: its causal LM {lm_class.__name__} holds {', '.join(left[:4])} beyond the "
            "base model and the tied head; name the causal-LM class in the model entry "
            f"(model_class: {lm_class.__name__})"
        )
    return lm.train(model.training)


def causal_lm_for_finetuning(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """(the causal LM a finetuning run trains, the names of the head's tensors initialised,
    not loaded): :func:`causal_lm`, but a bare model whose config unties the head (its
    checkpoint holds no head) gets a new LM head drawn as :func:`_around_base` draws it, from
    the torch RNG, which the run seeds with its seed, as an image run's new classifier.

    Raises:
        UnsupportedModel: naming the class, for a config without a causal-LM class, or a
            counterpart that holds more than the base model and its head.
    """
    if model.get_output_embeddings() is not None or getattr(
        model.config, "tie_word_embeddings", False
    ):
        return causal_lm(model), []
    base, lm_class = _lm_counterpart(model, "MODEL_FOR_CAUSAL_LM_MAPPING", "causal-LM")
    from vitplasticity.models.architectures.base import UnsupportedModel

    lm, drawn = _around_base(lm_class, base.config, base)
    head = {id(t) for t in lm.get_output_embeddings().parameters()}
    tensors = dict((*lm.named_parameters(), *lm.named_buffers()))
    if any(id(tensors[name]) not in head for name in drawn):
        raise UnsupportedModel(
            f"{type(model).__name__}: its causal LM {lm_class.__name__} holds "
            f"{', '.join(drawn[:4])} beyond the base model and the LM head; name the causal-LM "
            f"class in the model entry (model_class: {lm_class.__name__})"
        )
    return lm.train(model.training), drawn


def masked_lm(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """(``model`` when it is a masked LM, else its ``...ForMaskedLM`` counterpart, the names
    of the head's tensors initialised, not loaded).

    The counterpart (transformers' ``MODEL_FOR_MASKED_LM_MAPPING`` for its config) takes the
    base model whole (a bare encoder is its own; the pooler, which a masked LM has none of,
    is left out, as :func:`_around_base` leaves out what the class does not hold), its decoder tied to the word embedding; the head's own tensors (BERT's
    transform and output bias) are drawn as :func:`_around_base` draws them.

    Raises:
        UnsupportedModel: naming the class, for a config without a masked-LM class.
    """
    if model.get_output_embeddings() is not None:
        return model, []
    base, lm_class = _lm_counterpart(model, "MODEL_FOR_MASKED_LM_MAPPING", "masked-LM")
    lm, _ = _around_base(lm_class, base.config, base)
    # Tied after the draw, so that the draw never touches the pretrained word embedding.
    embedding = base.get_input_embeddings().weight
    lm.get_output_embeddings().weight = embedding
    prefix = f"{lm.base_model_prefix}."
    drawn = [
        name
        for name, tensor in (*lm.named_parameters(), *lm.named_buffers())
        if not name.startswith(prefix) and tensor is not embedding
    ]
    return lm.train(model.training), sorted(drawn)


def sequence_classifier(
    model: nn.Module, num_classes: int, pad_token_id: int
) -> tuple[nn.Module, list[str]]:
    """(``model``'s base model inside its ``...ForSequenceClassification`` class with a new
    ``num_classes``-way head, the names of the tensors initialised, not loaded).

    The class (transformers' ``MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING`` for its config)
    pools the sequence as the family does: BERT the first token through its pooler, RoBERTa
    and DeBERTa-v2 the first token through their own head, a decoder the last token that is
    not ``pad_token_id`` (written into the config: transformers finds it there). It takes the
    base model whole (a bare model is its own; a classifier's old head is not kept): every
    backbone weight is the checkpoint's. What the class holds beyond it, the classifier and a
    pooler the checkpoint did not hold, is drawn as :func:`_around_base` draws it, from the
    torch RNG, which a run seeds with its seed as it does an image run's new head.

    Raises:
        UnsupportedModel: naming the class, for a config without a sequence-classification
            class.
    """
    base, classifier_class = _lm_counterpart(
        model, "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING", "sequence-classification"
    )
    config = copy.deepcopy(base.config)
    config.num_labels = num_classes
    config.pad_token_id = pad_token_id  # the class's own config: its forward reads it
    return _around_base(classifier_class, config, base)


def _around_base(task_class: type, config: Any, base: nn.Module) -> tuple[nn.Module, list[str]]:
    """(``task_class`` built around ``base``, the names of its tensors drawn, sorted).

    The class is built on the meta device (no second backbone in memory, no draw), then holds
    ``base`` under its ``base_model_prefix``. A part of the base model the class has and
    ``base`` lacks (BERT's pooler, absent from a checkpoint without one) is the class's own;
    a part the class leaves out (the pooler of a masked LM, or of RoBERTa's classifier, which
    pools with its own head) is removed from ``base``: it would get no gradient.
    Every tensor still on the meta device, the task head's and such a part's, is then made
    real and drawn as transformers initialises it (``_init_weights``), module by module, from
    the torch RNG; a tensor two modules share (BERT's MLM output bias) stays shared.
    """
    import torch
    from torch import nn

    # The base's own tensors, by identity (a streamed base keeps them on the meta device too),
    # before it takes a part of the class's (a pooler), which is drawn.
    own = _tensor_ids(base)
    with torch.device("meta"):
        built = task_class(config)
    prefix = built.base_model_prefix
    own_base = getattr(built, prefix)
    for name, part in own_base.named_children():
        if getattr(base, name, None) is None:
            setattr(base, name, part)  # e.g. a pooler the checkpoint held none of
    for name, _ in list(base.named_children()):
        if hasattr(own_base, name) and getattr(own_base, name) is None:
            setattr(base, name, None)  # a part the class leaves out (a masked LM's pooler)
    setattr(built, prefix, base)
    made: dict[int, torch.Tensor] = {}
    drawn_modules: list[nn.Module] = []  # each once, in order: one draw per module
    for module in built.modules():
        for slots in (module._parameters, module._buffers):
            for key, tensor in slots.items():
                if tensor is not None and tensor.is_meta and id(tensor) not in own:
                    if id(tensor) not in made:
                        real = torch.empty_like(tensor, device=base.device)
                        is_parameter = isinstance(tensor, nn.Parameter)
                        made[id(tensor)] = nn.Parameter(real) if is_parameter else real
                    slots[key] = made[id(tensor)]
                    if not drawn_modules or drawn_modules[-1] is not module:
                        drawn_modules.append(module)
    for module in drawn_modules:
        built._init_weights(module)
    made_ids = {id(tensor) for tensor in made.values()}
    drawn = [
        name
        for name, tensor in (*built.named_parameters(), *built.named_buffers())
        if id(tensor) in made_ids
    ]
    return built.to(base.dtype), sorted(drawn)


def _tensor_ids(module: nn.Module) -> set[int]:
    """The identities of ``module``'s parameters and buffers."""
    return {id(t) for t in (*module.parameters(), *module.buffers())}


def _lm_counterpart(model: nn.Module, mapping: str, kind: str) -> tuple[nn.Module, type]:
    """(``model``'s base model, a classifier's or a bare model itself, and the class of
    transformers' auto ``mapping`` for its config: the LM that can take it whole).

    Raises:
        UnsupportedModel: naming ``model``'s class, when the mapping has no class for it.
    """
    from vitplasticity.models.architectures.base import UnsupportedModel, base_model_of
    from vitplasticity.utils.optional import require_transformers

    base = base_model_of(model) or model
    require_transformers()
    from transformers.models.auto import modeling_auto

    try:
        return base, getattr(modeling_auto, mapping)[type(base.config)]
    except KeyError:
        raise UnsupportedModel(
            f"{type(model).__name__}: transformers has no {kind} class for "
            f"{type(base.config).__name__}"
        ) from None


AUTO_TOKENIZER = "auto"
"""Tokenizer setting: ``bytes`` for a random-init model, else the model's own tokenizer (its
weights folder, or its hub id)."""


def tokenizer_name(requested: str, spec: HFModelSpec) -> str:
    """The tokenizer to load: ``auto`` resolves to ``bytes`` for random-init weights, else
    to the model's own (its weights folder; for ``weights: hub``, its hub id)."""
    from vitplasticity.data.text import BYTE_TOKENIZER

    if requested != AUTO_TOKENIZER:
        return requested
    if spec.weights == "random":
        return BYTE_TOKENIZER
    return spec.hf_id if spec.weights == "hub" else spec.weights


def check_sequence_length(config: Any, sequence_length: int, model_name: str) -> None:
    """Refuse a ``sequence_length`` beyond the positions of a built model's ``config``
    (:func:`max_positions`; a model that states none takes any).

    Raises:
        ValueError: naming --sequence-length, the positions and the model.
    """
    limit = max_positions(config)
    if limit is not None and sequence_length > limit:
        raise ValueError(
            f"--sequence-length {sequence_length} exceeds the {limit} positions of model "
            f"{model_name!r}"
        )


def max_positions(config: Any) -> int | None:
    """The longest sequence the model's config allows (GPT2's n_positions, else
    max_position_embeddings); None when it states none."""
    for key in POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None
