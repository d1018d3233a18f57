"""What recommend ranks and the recommend rules' params.

recommend ranks each model of ``recommend.models`` on each dataset of ``recommend.datasets``
of a kind it takes (:func:`recommend_cells`): an image dataset with a model that takes images,
a labelled text dataset (``source: labelled_text``) with a text model, ranked as a sequence
classifier with a new head against text plasticity's reference text
(``text_plasticity.reference``) cut as the labelled dataset is cut. Text files are ranked by
recommend --text (rule ``recommend_text``) on text plasticity's cells instead
(:func:`recommend_text_models`). recommend's settings that are null (their schema default)
fall back on the measuring stage's: ``plasticity.<key>`` for an image dataset,
``text_plasticity.n_pairs`` for text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from vitplasticity.models.refusals import entry_refusals
from vitplasticity.settings.sequences import LABELLED_SOURCE
from vitplasticity.workflow.dataset_kinds import IMAGES, dataset_kind, position_problems
from vitplasticity.workflow.datasets import text_reference_sequences
from vitplasticity.workflow.model_entries import model_inputs, takes
from vitplasticity.workflow.params import Wildcards, stage_params

RANKED_INPUTS: dict[str, str] = {IMAGES: "images", LABELLED_SOURCE: "tokens"}
"""Per kind of dataset recommend ranks on, what its models must take (a text file is
recommend --text's, through text_plasticity: no kind of recommend's)."""

NEXT_TOKEN_STAGE = "recommend lm"
"""The stage of recommend --text (the next-token loss) in the architectures' refusals."""


def recommend_value(config: Mapping[str, Any], key: str) -> Any:
    """``recommend.<key>``, or ``plasticity.<key>`` where it is null (read with ``get``: the
    parse-time checks see configs the schema has not filled in)."""
    value = (config.get("recommend") or {}).get(key)
    return (config.get("plasticity") or {}).get(key) if value is None else value


def recommend_text_n_pairs(config: dict[str, Any]) -> int:
    """``recommend.n_pairs``, or ``text_plasticity.n_pairs`` where it is null."""
    value = config["recommend"]["n_pairs"]
    return config["text_plasticity"]["n_pairs"] if value is None else value


def ranks(config: Mapping[str, Any], model: str, dataset: str) -> bool:
    """Whether recommend ranks ``model`` on ``dataset``: both defined, the dataset of a kind
    recommend ranks on (:data:`RANKED_INPUTS`) and the model one that takes its inputs
    (:func:`vitplasticity.workflow.model_entries.takes`)."""
    entry = (config.get("models") or {}).get(model)
    data = (config.get("datasets") or {}).get(dataset)
    if not (isinstance(entry, Mapping) and isinstance(data, Mapping)):
        return False
    inputs = RANKED_INPUTS.get(dataset_kind(data))
    return inputs is not None and takes(entry, inputs)


def recommend_cells(
    config: Mapping[str, Any],
    models: list[str] | None = None,
    datasets: list[str] | None = None,
) -> list[tuple[str, str]]:
    """The (model, dataset) pairs recommend ranks: each of ``models`` (default: recommend's,
    :func:`recommend_value`) with each of ``datasets`` (default: recommend's) that
    :func:`ranks` pairs it with. The one crossing of recommend's models and datasets: the
    targets, the bill and the verification's cells are these."""
    models = recommend_value(config, "models") if models is None else models
    datasets = recommend_value(config, "datasets") if datasets is None else datasets
    return [(m, d) for m in models or [] for d in datasets or [] if ranks(config, m, d)]


def recommend_text_models(config: Mapping[str, Any]) -> list[str]:
    """The ``text_plasticity.run_models`` that recommend --text ranks on text plasticity's
    text files: every one but an encoder that recommend ranks on labelled text instead (an
    architecture that refuses the next-token loss, as far as its entry tells, and that
    :func:`recommend_cells` pairs with a labelled dataset). Any other model the next-token
    ranking refuses stays, for the parse-time refusal to name."""
    datasets = config.get("datasets") or {}
    labelled = {
        model
        for model, dataset in recommend_cells(config)
        if dataset_kind(datasets[dataset]) == LABELLED_SOURCE
    }
    models = config.get("models") or {}
    return [
        name
        for name in (config.get("text_plasticity") or {}).get("run_models") or []
        if not (name in labelled and NEXT_TOKEN_STAGE in entry_refusals(models[name]))
    ]


def recommend_n_pairs(config: dict[str, Any]) -> Callable[[Wildcards], int]:
    """The recommend rule's ``n_pairs`` params function: ``recommend.n_pairs``, or where it
    is null the measuring stage's of the job's dataset (labelled text: text plasticity's, an
    image dataset: plasticity's)."""

    def n_pairs(wildcards: Wildcards) -> int:
        if dataset_kind(config["datasets"][wildcards.dataset]) == LABELLED_SOURCE:
            return recommend_text_n_pairs(config)
        return recommend_value(config, "n_pairs")

    return n_pairs


def recommend_params(config: dict[str, Any], settings: type) -> dict[str, Any]:
    """The recommend rule's params: one entry per setting of ``settings`` (the image
    recommend's class, whose flags recommend --labelled-text takes too) in the recommend
    block, the demo switch, and the resolved pairs of the job's dataset."""
    return {
        **stage_params(config, settings, "recommend"),
        "n_pairs": recommend_n_pairs(config),
    }


def recommend_text_params(config: dict[str, Any], settings: type) -> dict[str, Any]:
    """The recommend_text rule's params: how text is cut into sequences (text plasticity's
    reference dataset's tokenizer and sequence length), then the settings of ``settings`` (the
    text recommend's class) that the recommend block holds, the demo switch, and the resolved
    pairs."""
    return {
        **text_reference_sequences(config),
        **stage_params(config, settings, "recommend"),
        "n_pairs": recommend_text_n_pairs(config),
    }


def recommend_cell_problems(config: Mapping[str, Any]) -> list[str]:
    """With recommend enabled, one message per dataset of ``recommend.datasets`` that no model
    of ``recommend.models`` is ranked on, per model ``recommend.models`` names that is ranked
    on none of them, and, for labelled text, per problem of its reference text (unset: its
    kind is :func:`vitplasticity.workflow.dataset_kinds.text_dataset_problems`'s) and per
    sequence longer than a random model's stated positions; each naming its keys. Names the
    config does not define are left to the unknown-name checks."""
    recommend = config.get("recommend") or {}
    if not recommend.get("enabled"):
        return []
    models, datasets = config.get("models") or {}, config.get("datasets") or {}
    model_key = "recommend.models" + (
        "" if recommend.get("models") else " (null: plasticity.models)"
    )
    data_key = "recommend.datasets" + (
        "" if recommend.get("datasets") else " (null: plasticity.datasets)"
    )
    all_models = recommend_value(config, "models") or []
    all_data = recommend_value(config, "datasets") or []
    named_models = [m for m in all_models if m in models]
    named_data = [d for d in all_data if dataset_kind(datasets.get(d)) in RANKED_INPUTS]
    named_data = [d for d in named_data if d in datasets]
    cells = recommend_cells(config, named_models, named_data)
    # Against a side with unknown names (or text files), its own check is the message to read
    # first: no pairing message then.
    problems = [
        f"{data_key}: {dataset!r} is {_kind_words(datasets[dataset])}, and {model_key} = "
        f"[{', '.join(named_models)}] holds no {_model_words(datasets[dataset])} to rank on it: "
        "add one, or drop the dataset"
        for dataset in named_data
        if len(named_models) == len(all_models) and not any(d == dataset for _, d in cells)
    ]
    # A model named on purpose that nothing ranks is a mistake (plasticity's are only offered).
    if recommend.get("models") and len(named_data) == len(all_data):
        problems += [
            f"recommend.models: {model!r} {_takes_words(models[model])}, and {data_key} = "
            f"[{', '.join(named_data)}] holds no dataset of that kind: add one, or drop the model"
            for model in named_models
            if not any(m == model for m, _ in cells)
        ]
    labelled = [d for d in named_data if dataset_kind(datasets[d]) == LABELLED_SOURCE]
    text = config.get("text_plasticity") or {}
    # With text plasticity enabled, its own check names an unset reference.
    if labelled and not text.get("reference") and not text.get("enabled"):
        problems.append(
            f"text_plasticity.reference: unset, and {data_key} ranks labelled text "
            f"({', '.join(labelled)}) against it: name a datasets: entry of source text_file "
            "(each labelled dataset cuts it as it cuts its own documents)"
        )
    problems += position_problems(
        config, [(m, d) for m, d in cells if d in labelled], "recommend ranks it on"
    )
    return problems


def _kind_words(entry: Mapping[str, Any]) -> str:
    """How a message names the kind of a dataset recommend ranks on."""
    if dataset_kind(entry) == LABELLED_SOURCE:
        return f"labelled text (source: {LABELLED_SOURCE})"
    return "an image dataset"


def _model_words(entry: Mapping[str, Any]) -> str:
    """The models a dataset of ``entry``'s kind is ranked with."""
    if dataset_kind(entry) == LABELLED_SOURCE:
        return "text model (family: transformers)"
    return "model that takes images"


def _takes_words(entry: Mapping[str, Any]) -> str:
    """What a model that recommend ranks on no dataset takes, as a message says it."""
    if model_inputs(entry) == "tokens":
        return (
            f"is a text model (config.model_type {entry['config']['model_type']!r}), ranked on "
            f"labelled text (source: {LABELLED_SOURCE}; text files: text_plasticity.run_models)"
        )
    return "takes images or labelled text" if takes(entry, "tokens") else "takes images"
