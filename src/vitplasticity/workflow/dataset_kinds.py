"""Image datasets and text datasets in one ``datasets:`` block, each stage taking its kind.

A dataset entry of ``source: text_file`` is a text dataset: its ``path`` is a text file, one
document per line, cut into sequences as its ``tokenizer`` and ``sequence_length`` say
(:mod:`vitplasticity.settings.sequences`). One of ``source: labelled_text`` is a labelled text
dataset: its ``path`` a table of documents and labels or a folder of them
(:mod:`vitplasticity.data.labelled`), each document cut to its first ``sequence_length``
tokens. Every other source is an image dataset. Text plasticity (its reference and datasets)
takes text files only, the image stages (``plasticity``, the reference set) image datasets
only, ``recommend`` image datasets and labelled text (which it ranks against text
plasticity's reference text); an experiment takes one kind of the three, with models that
take that kind (:func:`experiment_problems`). A mismatch is named at parse time, the key with the
dataset and its source. Plain Python, no torch: the Snakefile checks the config with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from vitplasticity.settings.sequences import (
    LABELLED_SOURCE,
    TEXT_SOURCE,
    TEXT_SOURCES,
    sequence_settings,
)

IMAGES = "images"
"""The kind of every dataset whose source is not a text one (:func:`dataset_kind`)."""

KIND_NAMES: dict[str, str] = {
    IMAGES: "image datasets",
    TEXT_SOURCE: f"text datasets of source {TEXT_SOURCE}",
    LABELLED_SOURCE: f"labelled text datasets of source {LABELLED_SOURCE}",
}
"""How a message names the datasets of each kind."""

_TEXT_ENTRY = (
    "datasets: {<name>: {source: text_file, path: <file, one document per line>, steps: <n>, "
    "val_every: <n>}}"
)

_PATHS = {
    TEXT_SOURCE: "a text file, one document per line",
    LABELLED_SOURCE: (
        "a .csv or .jsonl file with text and label columns, or a folder of train and test "
        "ones or of <class>/<document>.txt files"
    ),
}
"""What the ``path`` of each text source is."""


def dataset_kind(entry: Any) -> str:
    """The kind of a ``datasets:`` entry: its source for a text source (:data:`TEXT_SOURCE`, a
    text file a language model is trained on; :data:`LABELLED_SOURCE`, labelled text a
    classifier is trained on), else :data:`IMAGES`."""
    source = entry.get("source") if isinstance(entry, Mapping) else None
    return source if source in TEXT_SOURCES else IMAGES


def is_text_dataset(entry: Any) -> bool:
    """Whether a ``datasets:`` entry is read by text models: a text file or labelled text,
    read where its ``path`` names it and cut as its entry says."""
    return dataset_kind(entry) != IMAGES


def _image_stage_names(config: Mapping[str, Any]) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    """(config key, dataset name, the kinds it takes) of every dataset an image stage takes:
    images, and for recommend labelled text too (ranked with its text models)."""
    for name in (config.get("plasticity") or {}).get("datasets") or []:
        yield "plasticity.datasets", name, (IMAGES,)
    reference = config.get("reference") or {}
    if reference.get("source") == "dataset" and reference.get("dataset"):
        yield "reference.dataset", reference["dataset"], (IMAGES,)
    recommend = config.get("recommend") or {}
    if recommend.get("enabled"):
        for name in recommend.get("datasets") or []:
            yield "recommend.datasets", name, (IMAGES, LABELLED_SOURCE)


def _text_stage_names(config: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(config key, dataset name) of every dataset an enabled text stage takes: text
    plasticity's reference and datasets, and its reference when recommend ranks labelled text
    against it."""
    text = config.get("text_plasticity") or {}
    datasets = config.get("datasets") or {}
    recommend = config.get("recommend") or {}
    ranks_labelled = recommend.get("enabled") and any(
        dataset_kind(datasets.get(name)) == LABELLED_SOURCE
        for name in recommend.get("datasets") or []
    )
    if text.get("reference") and (text.get("enabled") or ranks_labelled):
        used_by = "" if text.get("enabled") else " (recommend's reference text)"
        yield f"text_plasticity.reference{used_by}", text["reference"]
    if text.get("enabled"):
        for name in text.get("datasets") or []:
            yield "text_plasticity.datasets", name


def text_dataset_problems(config: Mapping[str, Any]) -> list[str]:
    """One message per text dataset entry without a readable ``path`` file, per dataset a
    stage takes that is of the other kind or undefined (an old text stage's file path given
    for a name says where files go now), and per text plasticity dataset cut otherwise than
    its reference (the pairs would pair sequences of different lengths or tokens)."""
    datasets = config.get("datasets") or {}
    problems = [
        problem
        for name, entry in datasets.items()
        if is_text_dataset(entry)
        for problem in _path_problems(name, entry)
    ]
    for key, name, kinds in _image_stage_names(config):
        kind = dataset_kind(datasets.get(name))
        if kind not in kinds:
            problems.append(
                f"{key}: {name!r} is a text dataset (source: {kind}): this stage takes image "
                "datasets; text datasets go to text_plasticity.datasets (text files) or to an "
                "experiment's datasets"
            )
    for key, name in _text_stage_names(config):
        entry = datasets.get(name)
        kind = dataset_kind(entry)
        if entry is None:
            problems.append(_undefined_text_dataset(key, name, datasets))
        elif kind != TEXT_SOURCE:
            source = entry.get("source") if isinstance(entry, Mapping) else None
            what = "a labelled text" if kind == LABELLED_SOURCE else "an image"
            problems.append(
                f"{key}: {name!r} is {what} dataset (source: {source}): this stage takes text "
                f"files, {_TEXT_ENTRY}"
            )
    return problems + _cut_problems(config)


def _path_problems(name: str, entry: Mapping[str, Any]) -> list[str]:
    """The problem of a text dataset's ``path``: missing, not there, or not of its source's
    kind (a folder for a text file; for labelled text, a layout
    :func:`vitplasticity.data.labelled.layout_problem` refuses)."""
    key, source = f"datasets.{name}.path", entry["source"]
    remedy = f"give {_PATHS[source]}"
    if not entry.get("path"):
        return [f"{key}: missing: a {source} dataset reads its documents from path: {remedy}"]
    path = Path(os.path.expanduser(str(entry["path"])))
    if source == LABELLED_SOURCE:
        # Imported here: the reader's numpy is needed only by a config with labelled text.
        from vitplasticity.data.labelled import layout_problem

        problem = layout_problem(path)
    elif path.is_dir():
        problem = "is a folder"
    else:
        problem = None if path.is_file() else "does not exist"
    return [f"{key}: {entry['path']!r} {problem}: {remedy}"] if problem else []


def _undefined_text_dataset(key: str, name: str, datasets: Mapping[str, Any]) -> str:
    """The message for a text stage naming no dataset: a file path (the old layout) is told
    where text files go now."""
    defined = ", ".join(sorted(datasets)) or "none"
    if "/" in name or "." in name or Path(os.path.expanduser(name)).is_file():
        return (
            f"{key}: {name!r} is a file, not a dataset name: text files are datasets: entries "
            f"now, {_TEXT_ENTRY}; name the entry here"
        )
    return f"{key}: unknown dataset {name!r} (defined: {defined})"


def _cut_problems(config: Mapping[str, Any]) -> list[str]:
    """Text plasticity pairs reference sequence i with downstream sequence i: every dataset it
    measures must be cut as its reference is."""
    text = config.get("text_plasticity") or {}
    datasets = config.get("datasets") or {}
    reference = datasets.get(text.get("reference"))
    if not text.get("enabled") or dataset_kind(reference) != TEXT_SOURCE:
        return []
    expected = sequence_settings(reference)
    problems = []
    for name in text.get("datasets") or []:
        if dataset_kind(datasets.get(name)) != TEXT_SOURCE:
            continue  # named by text_dataset_problems
        for key, value in sequence_settings(datasets[name]).items():
            if value != expected[key]:
                problems.append(
                    f"datasets.{name}.{key}: {value!r}, but the reference "
                    f"datasets.{text['reference']}.{key} is {expected[key]!r}: text plasticity "
                    "pairs sequences cut alike; give both the same"
                )
    return problems


def experiment_problems(config: Mapping[str, Any]) -> list[str]:
    """Per enabled experiment: datasets of several kinds (one experiment, one kind: its runs
    are read as one table, by the accuracy report or the text criteria check); and for an
    experiment on text datasets (text files or labelled text), each model that takes no token
    ids, each dataset's sequence longer than a random-init model's stated positions, and each
    dataset whose runs are no longer than the warm-up (they would never reach their learning
    rate). An image experiment's models are checked with the other image stages'
    (``model_entries``)."""
    from vitplasticity.workflow.model_entries import takes

    datasets, models = config.get("datasets") or {}, config.get("models") or {}
    problems = []
    for experiment, block in (config.get("experiments") or {}).items():
        if not isinstance(block, Mapping) or not block.get("enabled", True):
            continue
        key = f"experiments.{experiment}"
        names = [d for d in block.get("datasets") or [] if isinstance(datasets.get(d), Mapping)]
        by_kind: dict[str, list[str]] = {}
        for name in names:
            by_kind.setdefault(dataset_kind(datasets[name]), []).append(name)
        if len(by_kind) > 1:
            kinds = [f"{KIND_NAMES[kind]} ({', '.join(d)})" for kind, d in by_kind.items()]
            problems.append(
                f"{key}.datasets: {' and '.join(kinds)}: an experiment finetunes on one kind; "
                f"split it in {('two', 'three')[len(by_kind) - 2]}"
            )
            continue
        text = [d for d in names if is_text_dataset(datasets[d])]
        if not text:
            continue
        takers = []
        for name in block.get("models") or []:
            entry = models.get(name)
            if entry is None:
                continue  # named by check_config's unknown-model check
            if takes(entry, "tokens"):
                takers.append(name)
                continue
            problems.append(
                f"{key}.models: {name!r} takes images, and {key}.datasets are text datasets "
                f"({', '.join(text)}): a text experiment finetunes transformers text models"
            )
        cells = [(model, dataset) for model in takers for dataset in text]
        problems += position_problems(config, cells, f"{key} finetunes it on")
        problems += text_run_problems(config, key, text, "disable the experiment")
    return problems


def position_problems(
    config: Mapping[str, Any], cells: list[tuple[str, str]], doing: str
) -> list[str]:
    """Per (text model, text dataset) of ``cells``: the dataset's ``sequence_length`` beyond
    the positions a random-init model's config states; ``doing`` says what the stage does
    ("experiments.x finetunes it on")."""
    from vitplasticity.models.text import stated_positions

    datasets, models = config.get("datasets") or {}, config.get("models") or {}
    problems = []
    for model, dataset in cells:
        limit = stated_positions(models[model])
        length = sequence_settings(datasets[dataset])["sequence_length"]
        if limit is not None and length > limit:
            problems.append(
                f"datasets.{dataset}.sequence_length: {length} exceeds the {limit} positions "
                f"that models.{model}.config states ({doing} {dataset})"
            )
    return problems


def text_run_problems(
    config: Mapping[str, Any], key: str, text: list[str], remedy: str
) -> list[str]:
    """What the finetuning runs that ``key`` trains on the text datasets ``text`` would refuse
    or waste: runs no longer than the warm-up (they would never reach their learning rate)
    and ``finetune.compile``, not implemented for text runs (``remedy``: the other way out
    than setting it false)."""
    datasets, finetune = config.get("datasets") or {}, config.get("finetune") or {}
    warmup = finetune.get("warmup_steps", 0)
    problems = [
        f"finetune.warmup_steps: {warmup}, not fewer than datasets.{dataset}.steps "
        f"{datasets[dataset].get('steps', 1)}: the runs of {key} would never reach their "
        "learning rate"
        for dataset in text
        if warmup >= datasets[dataset].get("steps", 1)
    ]
    if text and finetune.get("compile"):
        problems.append(
            f"finetune.compile: true, and {key} finetunes text datasets: compile is not "
            f"implemented for text runs; set it false or {remedy}"
        )
    return problems
