"""What each architecture family refuses, by stage, without torch: the reasons the families'
``refusal(stage, model)`` and model checks give (they import them from here), and which family a
``models:`` entry is, as far as the entry alone tells, so that the Snakefile's config check
refuses at parse what a job would refuse hours later (docs/architectures.md, "Refused when the
config is parsed").

A family is known at parse from a timm entry's ``timm_id`` (its architecture name: ``swin_*``
is ``timm_swin``), and from a transformers entry's ``model_class``, its ``config.model_type``
(``weights: random``) or the config.json of its local weights folder. A ``weights: hub``
transformers entry without ``model_class`` has its config.json fetched by the weights job: its
family, and so its refusals, are known at job time only. Refusals that depend on the model's
config (Falcon's layout, DeBERTa-v2's convolution, a Swin's grid) are decided where the values
are known at parse: a random init's config (the config class's defaults filled in,
:data:`CONFIG_DEFAULTS`), a local folder's config.json with the entry's overrides, a timm
entry's ``kwargs``. tests/models/test_refusals.py keeps this table equal to the architectures'
own refusals on tiny models of every family.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vitplasticity.models.spec import known_family

# --- the reasons (the architectures raise these) ------------------------------------------------

SWIN_EMBEDDING_REASON = (
    "its stages have different widths: the embedding protocol, which feeds the patch embedding "
    "to every block, is undefined (use the in_situ protocol)"
)
"""Why the embedding protocol is refused for a Swin."""
SWIN_RECOMMEND_REASON = (
    "recommend ranks by the embedding protocol's plasticity, which is undefined for it: its "
    "stages have different widths"
)
"""Why recommend is refused for a Swin."""
SWIN_BOUNDS_REASON = (
    "its attention adds a learned relative position bias to the logits and attends within "
    "(shifted) windows: the paper's bounds are stated for softmax(x A x^T) over all tokens"
)
"""Why the bounds are refused for a Swin."""
SWIN_REFUSALS: dict[str, str] = {
    "plasticity embedding": SWIN_EMBEDDING_REASON,
    "bounds": SWIN_BOUNDS_REASON,
    "recommend": SWIN_RECOMMEND_REASON,
}
"""The stages every Swin refuses (the in-situ protocol is refused for some grids only:
:func:`swin_padding_reason`)."""

DECODER_BOUNDS_REASON = (
    "the paper's bounds are stated for LayerNorm (RMSNorm does not centre) and for attention "
    "without rotary positions (these models rotate queries and keys by position)"
)
DECODER_REFUSALS: dict[str, str] = {"bounds": DECODER_BOUNDS_REASON}
"""The stages a decoder language model with RMSNorm and rotary positions is refused by (plasticity,
lora, finetune and recommend on text are supported)."""

ENCODER_REFUSALS: dict[str, str] = {
    "recommend lm": (
        "recommend --text ranks a causal LM by its next-token loss, and an encoder attends to the "
        "tokens after each one: it has no next-token loss; rank it on labelled text "
        "(recommend --labelled-text), by the classification loss of a new head"
    ),
}
"""The stages a BERT-family (and DeBERTa-v2) encoder is refused by: recommend on unlabelled text
(``recommend lm``; plasticity, lora, the bounds on text, finetune on text with the masked-LM
loss or on labelled text, and recommend on labelled text are supported)."""

FALCON_SHARED_NORM = (
    "one norm (input_layernorm) feeds both the attention and the MLP, run in parallel "
    "(parallel_attn without new_decoder_architecture, Falcon-7B's layout, or "
    "num_ln_in_parallel_attn 1): no separate LN2, no LN1 and LN2 in the paper's sense"
)
FALCON_ALIBI = (
    "ALiBi (alibi) adds a per-head linear position bias to the attention logits through the "
    "attention mask, outside the attention module: no family maps that attention to MHA"
)
FALCON_NEW_SEQUENTIAL = (
    "new_decoder_architecture without parallel_attn: transformers' FalconDecoderLayer does not "
    "run that layout (its forward asks for norms the layer does not build)"
)
DEBERTA_CONV_REASON = (
    "encoder.conv adds a convolution of the embedding output to the first layer's output: a "
    "branch beside the layer that no component is"
)
"""Why a DeBERTa-v2 with ``conv_kernel_size`` > 0 is refused by every stage."""
BERT_DECODER_REASON = (
    "configured as a decoder (is_decoder: causal attention, cross-attention): not the "
    "bidirectional encoder this family describes"
)
"""Why a BERT or RoBERTa with ``is_decoder`` is refused by every stage."""
BERT_CHUNKS_REASON = "FC1 and FC2 run once per chunk, not once per forward pass"
"""Why a BERT or RoBERTa with ``chunk_size_feed_forward`` is refused by every stage."""

STAGE_REFUSALS: dict[str, dict[str, str]] = {
    "timm_swin": SWIN_REFUSALS,
    "hf_swin": SWIN_REFUSALS,
    "hf_llama": DECODER_REFUSALS,
    "hf_gemma": DECODER_REFUSALS,
    "hf_phi3": DECODER_REFUSALS,
    "hf_olmo2": DECODER_REFUSALS,
    "hf_moe": DECODER_REFUSALS,
    "hf_bert": ENCODER_REFUSALS,
    "hf_deberta_v2": ENCODER_REFUSALS,
}
"""Per architecture (its registry name), the stages it refuses whatever the model's config, and
why:
what ``Architecture.refusal(stage, model)`` answers for a model as the workflow builds it (a
vision tower in its classification class). An architecture not listed refuses no stage so."""


# --- config-dependent refusals -------------------------------------------------------------------


def falcon_reason(
    alibi: bool, parallel_attn: bool, new_decoder_architecture: bool, norms: int | None
) -> str | None:
    """Why a Falcon config's layers have no family layout (None: they are parallel with two
    norms, or sequential); ``norms`` is ``num_ln_in_parallel_attn`` (None: the layer's
    default, two with ``new_decoder_architecture``, as FalconDecoderLayer sets it)."""
    if alibi:
        return FALCON_ALIBI
    if not parallel_attn:
        return FALCON_NEW_SEQUENTIAL if new_decoder_architecture else None
    if norms is None and new_decoder_architecture:
        norms = 2
    if new_decoder_architecture and norms == 2:
        return None
    return FALCON_SHARED_NORM


def swin_padding_reason(index: int, grid: tuple[int, int], window: tuple[int, int]) -> str:
    """Why the in-situ protocol is undefined for a Swin whose block ``index`` attends a
    ``grid`` (H, W) that is not a whole number of ``window``s."""
    (h, w), (wh, ww) = grid, window
    return (
        f"block {index}'s {h} x {w} grid is not a whole number of {wh} x {ww} windows: its "
        "attention runs on zero-padded windows whose outputs the block drops, so MHA's in-situ "
        "plasticity is undefined (choose an image size whose grids the windows divide)"
    )


def swin_padding(
    image: tuple[int, int], patch: int, window: tuple[int, int], depths: list[int]
) -> str | None:
    """:func:`swin_padding_reason` of the first block whose grid the (clamped) window does not
    divide, for a Swin of ``image`` size, ``patch`` size and stages of ``depths`` blocks (the
    grid halved, an odd side padded, between two stages); None when every grid divides."""
    grid = (image[0] // patch, image[1] // patch)
    index = 0
    for stage, depth in enumerate(depths):
        if stage:
            grid = ((grid[0] + 1) // 2, (grid[1] + 1) // 2)
        clamped = (min(window[0], grid[0]), min(window[1], grid[1]))
        if depth and (grid[0] % clamped[0] or grid[1] % clamped[1]):
            return swin_padding_reason(index, grid, clamped)
        index += depth
    return None


# --- which architecture an entry is, at parse ----------------------------------------------------------

TIMM_ARCHITECTURES: dict[str, str] = {"swin": "timm_swin"}
"""timm architecture names (``timm_id`` before any ``.tag``) by their first word, for the
families that refuse a stage (Swin v2, ``swinv2_*``, is another word: no family knows it)."""

MODEL_TYPE_ARCHITECTURES: dict[str, str] = {
    "swin": "hf_swin",
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "gemma"), "hf_llama"),
    **dict.fromkeys(("gemma2", "gemma3_text"), "hf_gemma"),
    "phi3": "hf_phi3",
    "olmo2": "hf_olmo2",
    **dict.fromkeys(("mixtral", "qwen2_moe"), "hf_moe"),
    **dict.fromkeys(("bert", "roberta"), "hf_bert"),
    "deberta-v2": "hf_deberta_v2",
    "falcon": "hf_falcon",
}
"""config.json ``model_type`` -> architecture, for those with a refusal (each architecture's
``model_types``; tests/models/test_refusals.py checks the two agree)."""

CLASS_ARCHITECTURES: dict[str, str] = {
    "Swin": "hf_swin",
    **dict.fromkeys(("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma"), "hf_llama"),
    **dict.fromkeys(("Gemma2", "Gemma3"), "hf_gemma"),
    "Phi3": "hf_phi3",
    "Olmo2": "hf_olmo2",
    **dict.fromkeys(("Mixtral", "Qwen2Moe"), "hf_moe"),
    **dict.fromkeys(("Bert", "Roberta"), "hf_bert"),
    "DebertaV2": "hf_deberta_v2",
    "Falcon": "hf_falcon",
}
"""A transformers class name's model prefix (the longest that starts it: ``Qwen2Moe`` before
``Qwen2``) -> architecture, for those with a refusal."""

CONFIG_DEFAULTS: dict[str, dict[str, Any]] = {
    "hf_falcon": {
        "alibi": False,
        "parallel_attn": True,
        "new_decoder_architecture": False,
        "num_ln_in_parallel_attn": None,
    },
    "hf_deberta_v2": {"conv_kernel_size": 0},
    "hf_bert": {"is_decoder": False, "chunk_size_feed_forward": 0},
    "hf_swin": {"image_size": 224, "patch_size": 4, "window_size": 7, "depths": (2, 2, 6, 2)},
}
"""The defaults of the keys a config-dependent refusal reads, where the entry does not state
them: FalconConfig's and SwinConfig's, and what DebertaV2Model reads when its config has no
``conv_kernel_size`` (tests/models/test_refusals.py checks them against transformers)."""

TIMM_SWIN_DEPTHS: dict[str, tuple[int, ...]] = {
    "tiny": (2, 2, 6, 2),
    "small": (2, 2, 18, 2),
    "base": (2, 2, 18, 2),
    "large": (2, 2, 18, 2),
}
"""The blocks per stage of timm's ``swin_<size>_patch4_window<w>_<image>`` models (timm's
registered defaults; tests/models/test_refusals.py checks them)."""

_TIMM_SWIN_NAME = re.compile(r"swin_\w*?patch(\d+)_window(\d+)_(\d+)")


def class_architecture(name: str) -> str | None:
    """The architecture of a transformers class name (:data:`CLASS_ARCHITECTURES`); None for
    one that refuses nothing."""
    prefixes = [p for p in CLASS_ARCHITECTURES if name.startswith(p)]
    return CLASS_ARCHITECTURES[max(prefixes, key=len)] if prefixes else None


def folder_config(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The config.json of a transformers entry's local weights folder, None when it has none
    that reads as a JSON object (named by the weights path check)."""
    weights = entry.get("weights")
    if not isinstance(weights, str) or weights in ("hub", "random"):
        return None
    try:
        config = json.loads((Path(weights) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def known_config(entry: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The architecture of a transformers ``models:`` entry and the config its model is built
    with, as far as the entry tells at parse: ``model_class`` or the model_type decide it;
    the config is a random init's own or a local folder's config.json, with the entry's
    overrides (None for a hub checkpoint: its config.json is fetched by the weights job)."""
    overrides = entry.get("config") if isinstance(entry.get("config"), Mapping) else {}
    if entry.get("weights") == "random":
        config: dict[str, Any] | None = dict(overrides)
    else:
        saved = folder_config(entry)
        config = None if saved is None else {**saved, **overrides}
    model_class = entry.get("model_class")
    if not isinstance(model_class, str) and config is not None:
        architectures = config.get("architectures")
        if isinstance(architectures, list) and len(architectures) == 1:
            model_class = architectures[0]
    architecture = class_architecture(model_class) if isinstance(model_class, str) else None
    if architecture is None and config is not None:
        architecture = MODEL_TYPE_ARCHITECTURES.get(str(config.get("model_type")))
    return architecture, config


def _pair(value: Any) -> tuple[int, int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int) for v in value)
    ):
        return (value[0], value[1])
    return None


def timm_swin_padding(timm_id: str, kwargs: Mapping[str, Any]) -> str | None:
    """:func:`swin_padding` of a timm Swin from its name (``swin_tiny_patch4_window7_224``:
    :data:`TIMM_SWIN_DEPTHS`) and ``kwargs`` (``img_size``, ``patch_size``, ``window_size``,
    ``depths``); None where they do not tell (a name of another pattern, a value of another
    type)."""
    named = _TIMM_SWIN_NAME.match(timm_id)
    patch, window, image = (int(g) for g in named.groups()) if named else (None, None, None)
    image_pair = _pair(kwargs.get("img_size", image))
    window_pair = _pair(kwargs.get("window_size", window))
    patch = kwargs.get("patch_size", patch)
    size = timm_id.split("_")[1] if "_" in timm_id else ""
    depths = kwargs.get("depths", TIMM_SWIN_DEPTHS.get(size))
    if image_pair is None or window_pair is None or not isinstance(patch, int) or depths is None:
        return None
    return swin_padding(image_pair, patch, window_pair, list(depths))


Refusal = tuple[str | None, str]
"""A stage refused (``None``: every stage), and why."""


def _falcon(values: Mapping[str, Any]) -> Refusal | None:
    reason = falcon_reason(
        bool(values["alibi"]),
        bool(values["parallel_attn"]),
        bool(values["new_decoder_architecture"]),
        values["num_ln_in_parallel_attn"],
    )
    return None if reason is None else (None, reason)


def _deberta_v2(values: Mapping[str, Any]) -> Refusal | None:
    return (None, DEBERTA_CONV_REASON) if (values["conv_kernel_size"] or 0) > 0 else None


def _bert(values: Mapping[str, Any]) -> Refusal | None:
    if values["is_decoder"]:
        return (None, BERT_DECODER_REASON)
    return (None, BERT_CHUNKS_REASON) if values["chunk_size_feed_forward"] else None


def _hf_swin(values: Mapping[str, Any]) -> Refusal | None:
    image, window, patch = (
        _pair(values["image_size"]),
        _pair(values["window_size"]),
        values["patch_size"],
    )
    if image is None or window is None or not isinstance(patch, int):
        return None
    reason = swin_padding(image, patch, window, list(values["depths"]))
    return None if reason is None else ("plasticity in_situ", reason)


def _timm_swin(values: Mapping[str, Any]) -> Refusal | None:
    reason = timm_swin_padding(values["timm_id"], values)
    return None if reason is None else ("plasticity in_situ", reason)


CONFIG_REFUSALS: dict[str, Callable[[Mapping[str, Any]], Refusal | None]] = {
    "hf_falcon": _falcon,
    "hf_deberta_v2": _deberta_v2,
    "hf_bert": _bert,
    "hf_swin": _hf_swin,
    "timm_swin": _timm_swin,
}
"""Per architecture, the refusal its model's settings decide (a transformers config with
:data:`CONFIG_DEFAULTS` under it; a timm entry's ``kwargs`` and ``timm_id``)."""


def _timm_settings(entry: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The architecture of a timm entry (its ``timm_id``'s first word) and what it is built
    with: its kwargs and its id without a pretrained tag."""
    timm_id = entry.get("timm_id")
    if not isinstance(timm_id, str):
        return None, None
    name = timm_id.split(".")[0]
    kwargs = entry.get("kwargs") if isinstance(entry.get("kwargs"), Mapping) else {}
    return TIMM_ARCHITECTURES.get(name.split("_")[0]), {**kwargs, "timm_id": name}


SETTINGS_READERS: dict[str, Callable[[Mapping[str, Any]], tuple[str | None, Any]]] = {
    "timm": _timm_settings,
    "transformers": known_config,
}
"""Per ``family:`` of a ``models:`` entry, how its architecture and settings are read at
parse."""


def _read(entry: Mapping[str, Any]) -> tuple[str | None, Any]:
    """:data:`SETTINGS_READERS` of the entry's spec family; (None, None) for an unknown one."""
    spec = known_family(entry)
    reader = SETTINGS_READERS.get(spec.family) if spec is not None else None
    return (None, None) if reader is None else reader(entry)


def entry_architecture(entry: Mapping[str, Any]) -> str | None:
    """The architecture of a ``models:`` entry, where the entry tells and the architecture
    refuses a stage (a timm entry by its ``timm_id``'s first word; a transformers one by
    :func:`known_config`); None otherwise."""
    return _read(entry)[0]


def entry_refusals(entry: Mapping[str, Any]) -> dict[str | None, str]:
    """What the model of a ``models:`` entry refuses, known from the entry alone: per stage
    (``None``: every stage), why. Empty where the entry does not tell (a hub checkpoint's
    config.json is read by its job) or its architecture refuses nothing."""
    architecture, settings = _read(entry)
    if architecture is None:
        return {}
    found: dict[str | None, str] = dict(STAGE_REFUSALS.get(architecture, {}))
    check = CONFIG_REFUSALS.get(architecture)
    if check is not None and settings is not None:
        refused = check({**CONFIG_DEFAULTS.get(architecture, {}), **settings})
        if refused is not None:
            found[refused[0]] = refused[1]
    return found
