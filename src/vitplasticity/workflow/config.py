"""Strict keys and the run grid of a workflow config (plain Python: no torch import, so the
Snakefile can use it on every node cheaply).

``check_keys`` runs first: every key at every level must be one the schema defines (a dataset
entry's keys depend on its ``source``, a model entry's on its ``family``), and each unknown one
is named with the nearest valid key; a key of an earlier config layout is named with what to
write instead. The JSON schema then checks types and ranges;
:func:`vitplasticity.workflow.config_check.check_config` checks what a schema cannot. This
module also expands an experiment into its runs (:class:`vitplasticity.finetune.run.Run`), and
:func:`config_errors_end_the_run` shows a config error in the Snakefile as its message alone.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from vitplasticity.data.imagenet_layouts import IMAGENET_ENV
from vitplasticity.finetune.run import Run, lr_label
from vitplasticity.models.registry import FAMILY_KEY, entry_family, model_id_keys


class ConfigError(ValueError):
    """A config with unknown keys, or that names something undefined or asks for an empty grid."""


@contextmanager
def config_errors_end_the_run(*also: type[Exception]) -> Iterator[None]:
    """Around the config checks of the Snakefile: a ConfigError (or one of ``also``, e.g.
    Snakemake's schema error) ends the process with its message alone.

    Snakemake shows an exception raised while it parses the Snakefile with the ``File ...,
    line ...`` lines of where it was raised, which read as a crash; a config error is the
    user's to fix, and its message names every key at fault.

    Raises:
        SystemExit: with the error's message (exit status 1).
    """
    try:
        yield
    except (ConfigError, *also) as error:
        raise SystemExit(str(error)) from None


# The keys a dataset entry may carry, by its source (the schema gives each key's type; a key
# of another source is an error, e.g. corruption: on a cifar10 entry, so a typo never slips
# through as "some other source's option").
_DATASET_COMMON = ("source", "steps", "val_every")
_DOWNLOADED = ("url", "archive", "checksums")
# A text dataset, of either text source, is read where path names it and cut as it says.
_TEXT = (*_DATASET_COMMON, "path", "tokenizer", "sequence_length")
DATASET_KEYS: dict[str, tuple[str, ...]] = {
    "synthetic": (
        *_DATASET_COMMON,
        "style",
        "num_classes",
        "n_pool",
        "n_test",
        "image_size",
        "seed",
    ),
    "image_folder": (*_DATASET_COMMON, "root"),
    "cifar10": (*_DATASET_COMMON, *_DOWNLOADED),
    "cifar100": (*_DATASET_COMMON, *_DOWNLOADED),
    "cifar10c": (*_DATASET_COMMON, "corruption", "severity", *_DOWNLOADED),
    "domainnet": (*_DATASET_COMMON, "domain", "split", *_DOWNLOADED),
    "flowers102": (*_DATASET_COMMON, *_DOWNLOADED),
    "pet": (*_DATASET_COMMON, *_DOWNLOADED),
    "text_file": _TEXT,
    "labelled_text": _TEXT,
}
# How check_keys names a value that should be a mapping (and counts such problems).
SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""PyYAML's safe loader in C (libyaml) where PyYAML was built with it, else in Python: the
schema and config are read again by every cluster job, and libyaml reads them ~10x faster."""

MAPPING_EXPECTED = "expected a mapping"
NOT_A_NAME = "not a name a path can hold"
# Keys written for another one that string similarity cannot guess.
KEY_HINTS: dict[str, str] = {"md5": "checksums", "sha256": "checksums", "hash": "checksums"}

# The key that names the model in each registered family (an entry without a family is told
# which family its id key belongs to).
MODEL_ID_KEYS: dict[str, str] = model_id_keys()
# Keys of earlier config layouts (key paths, ``*`` for a user-chosen name), each with what to
# write instead: a config written for them is told how to update, not offered a near key.
REPLACED_KEYS: dict[str, str] = {
    "text_plasticity.models": (
        "text models are models like any other now: move each entry under models: with "
        "family: transformers (hf_id, weights, config, init_seed) and name it in "
        "text_plasticity.run_models"
    ),
    "models.*.source": (
        "the old text-model key: write weights: hub | random | <saved model folder> "
        "(with family: transformers)"
    ),
    **{
        f"{block}.{key}": (
            f"text files are datasets: entries now, and {key} is a key of each: "
            "datasets: {<name>: {source: text_file, path: <file>, steps: <n>, val_every: <n>, "
            f"tokenizer: auto, sequence_length: 128}}}}; name them in {block}.datasets"
        )
        for block, keys in (("text_plasticity", ("tokenizer", "sequence_length")),)
        for key in keys
    },
    **{
        f"{block}.datasets.*": (
            f"{block}.datasets is a list of dataset names now: move each file into datasets: "
            "as {<name>: {source: text_file, path: <file>, steps: <n>, val_every: <n>}} and "
            f"write {block}.datasets: [<name>, ...]"
        )
        for block in ("text_plasticity",)
    },
    "text_finetune": (
        "a text finetuning grid is an experiments: entry now, as an image one: experiments: "
        "{<name>: {optimizer: adamw, models: [<text models>], datasets: [<text datasets: "
        "source text_file, each with its steps, val_every, tokenizer, sequence_length>], "
        "configurations: [...], lrs: [...], seeds: [...]}}; mask_probability is "
        "finetune.mask_probability; the check is results/stats/<name>/criteria.md"
    ),
}


def load_schema(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The workflow's JSON schema (YAML) as a mapping."""
    return yaml.load(Path(path).read_text(), Loader=SAFE_LOADER)


def _resolve(node: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with its local ``$ref`` (``#/definitions/...``) followed."""
    while isinstance(node, Mapping) and "$ref" in node:
        target: Any = schema
        for part in str(node["$ref"]).removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _object_branch(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """For a mapping value: the one ``oneOf``/``anyOf`` branch describing an object, if any."""
    branches = [
        branch
        for branch in (*node.get("oneOf", ()), *node.get("anyOf", ()))
        if "properties" in branch or "object" in str(branch.get("type", ""))
    ]
    return branches[0] if len(branches) == 1 else node


def _unknown_key(where: str, key: str, allowed: list[str]) -> str:
    """The message for ``key`` at ``where``: its nearest valid key, else the valid ones."""
    close = difflib.get_close_matches(key, allowed, n=1)
    if not close and KEY_HINTS.get(key) in allowed:
        close = [KEY_HINTS[key]]
    if close:
        return f"{where}: unknown key; did you mean {close[0]!r}?"
    return f"{where}: unknown key (valid here: {', '.join(sorted(allowed))})"


def _family_branches(node: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """The branches of a model entry, each applying to one family (``if: {properties: {family:
    {const: F}}}``, ``then``: F's object): {F: F's object}; {} for any other node."""
    branches: dict[str, Any] = {}
    for branch in node.get("allOf", ()):
        const = branch.get("if", {}).get("properties", {}).get(FAMILY_KEY, {}).get("const")
        if const is not None and "then" in branch:
            branches[const] = _resolve(branch["then"], schema)
    return branches


def _name_problems(
    value: Mapping[str, Any], node: Mapping[str, Any], schema: Mapping[str, Any], path: str
) -> list[str]:
    """One message per user-chosen name of ``value`` that the schema's ``propertyNames``
    pattern refuses (a model, dataset or text dataset name: each names folders and files)."""
    names = _resolve(node.get("propertyNames", {}), schema)
    pattern = names.get("pattern") if isinstance(names, Mapping) else None
    if not pattern:
        return []
    return [
        f"{path}.{key}: {NOT_A_NAME} ({pattern}: it names folders and files): rename it, e.g. "
        f"{re.sub(r'[^A-Za-z0-9_.-]', '_', str(key)).lstrip('_.-') or 'name'}"
        for key in value
        if not re.fullmatch(pattern, str(key))
    ]


def _walk(
    value: Any,
    node: Mapping[str, Any],
    schema: Mapping[str, Any],
    path: str,
    problems: list[str],
    pattern: str = "",
) -> None:
    """Append a message for every key below ``value`` that ``node`` does not define
    (``pattern``: ``path`` with user-chosen names as ``*``)."""
    node = _resolve(node, schema)
    replaced = REPLACED_KEYS.get(f"{pattern}.*")
    if node.get("type") == "array" and isinstance(value, Mapping) and replaced:
        # a mapping of an earlier layout where a list is wanted now (name -> file)
        problems.extend(f"{path}.{key}: no longer a key: {replaced}" for key in value)
        return
    if node.get("type") == "object" and not isinstance(value, Mapping):
        # Named here, in one line among the others: the schema would dump itself instead.
        about = f" ({node['description']})" if node.get("description") else ""
        problems.append(
            f"{path}: {MAPPING_EXPECTED} (key: value entries), got the "
            f"{type(value).__name__} {value!r}{about}"
        )
        return
    if isinstance(value, list) and isinstance(node.get("items"), Mapping):
        for index, item in enumerate(value):
            _walk(item, node["items"], schema, f"{path}[{index}]", problems, pattern)
        return
    if not isinstance(value, Mapping) or not isinstance(node, Mapping):
        return
    kind, choice, keys_of = "", None, {}
    families = _family_branches(node, schema)
    if families:  # a model entry: the keys of the branch it selects
        kind, keys_of = FAMILY_KEY, {f: list(b.get("properties", {})) for f, b in families.items()}
        choice = entry_family(value, families, path, problems)
        if choice is None:
            return
        node = families[choice]
    node = _object_branch(node)
    problems.extend(_name_problems(value, node, schema, path))
    properties: Mapping[str, Any] = node.get("properties", {})
    extra = node.get("additionalProperties", True)
    allowed = list(properties)
    source = value.get("source") if path.startswith("datasets.") and path.count(".") == 1 else None
    if source in DATASET_KEYS:
        kind, choice, keys_of = "source", source, dict(DATASET_KEYS)
        allowed = [key for key in allowed if key in DATASET_KEYS[source]]
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        key_pattern = f"{pattern}.{key}" if pattern else str(key)
        if key_pattern in REPLACED_KEYS:
            problems.append(f"{where}: no longer a key: {REPLACED_KEYS[key_pattern]}")
        elif key in allowed:
            _walk(item, properties[key], schema, where, problems, key_pattern)
        elif choice is not None and any(key in keys for keys in keys_of.values()):
            # a key of another dataset source or model family
            users = [name for name, keys in keys_of.items() if key in keys]
            problems.append(
                f"{where}: not a key of {kind} {choice!r} (a key of {', '.join(users)}; "
                f"{choice} accepts: {', '.join(sorted(allowed))})"
            )
        elif isinstance(extra, Mapping):  # a mapping of user-chosen names
            _walk(item, extra, schema, where, problems, f"{pattern}.*" if pattern else "*")
        elif extra is False:
            problems.append(_unknown_key(where, str(key), allowed))


def unknown_keys(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    """One message per key of ``config`` that ``schema`` does not define, at every level.

    A closed object (``additionalProperties: false``) accepts its ``properties`` only; a
    dataset entry accepts the keys of its ``source`` (``DATASET_KEYS``), a model entry those
    of its ``family`` (the schema's branch for it). Free-form mappings (``models.<m>.kwargs``,
    ``models.<m>.config``) are not checked. A key of an earlier layout
    (:data:`REPLACED_KEYS`) and a model entry without a family are named with what to write
    instead. A value where the schema wants a mapping (``checksums: md5:...``) is named too,
    so that the schema's dump of its first error does not hide the others.

    Returns:
        Messages naming the full key path (``datasets.cifar10.archvie``) and the nearest
        valid key (or the replacement), in config order.
    """
    problems: list[str] = []
    _walk(config, schema, schema, "", problems)
    return problems


def check_keys(
    config: Mapping[str, Any], schema: Mapping[str, Any] | str | os.PathLike[str]
) -> None:
    """Reject every unknown config key at once, before anything else reads the config.

    Call it before Snakemake's ``validate``: that one fills the schema's defaults into every
    dataset entry (``severity``, ``split``), keys this check would take for the entry's own.

    Args:
        config: the merged config (config.yaml, presets and ``--config`` overrides).
        schema: the JSON schema, or the path of its YAML file.

    Raises:
        ConfigError: listing every unknown key with its nearest valid one, and every key of
            an earlier layout with its replacement.
    """
    if not isinstance(schema, Mapping):
        schema = load_schema(schema)
    problems = unknown_keys(config, schema)
    if problems:
        mistyped = sum(MAPPING_EXPECTED in problem for problem in problems)
        misnamed = sum(NOT_A_NAME in problem for problem in problems)
        counts = []
        if len(problems) > mistyped + misnamed:
            counts.append(f"{len(problems) - mistyped - misnamed} unknown or outdated key(s)")
        if mistyped:
            counts.append(f"{mistyped} value(s) that must be a mapping")
        if misnamed:
            counts.append(f"{misnamed} name(s) that cannot be a path component")
        raise ConfigError(
            f"invalid config: {', '.join(counts)} (config.yaml with the presets, "
            "--configfile and --config merged over it):\n  " + "\n  ".join(problems)
        )


def enabled_experiments(config: dict[str, Any]) -> list[str]:
    """Names of the experiments with ``enabled`` true (the default), in config order."""
    return [name for name, exp in config["experiments"].items() if exp.get("enabled", True)]


def learning_rates(experiment: dict[str, Any], dataset: str) -> list[float]:
    """The LR grid of ``dataset`` in ``experiment``: its own entry, else the shared ``lrs``."""
    by_dataset = experiment.get("lrs_by_dataset") or {}
    return [float(lr) for lr in by_dataset.get(dataset, experiment["lrs"])]


def grid_lr(config: dict[str, Any], experiment: str, dataset: str, label: str) -> float:
    """The learning rate of ``experiment``'s grid on ``dataset`` whose path label is ``label``.

    A run folder names its LR by :func:`lr_label` (6 significant digits); the run itself must
    train with the grid's exact value, which this gives back.

    Raises:
        ConfigError: when no LR of the grid, or more than one, has that label.
    """
    key = f"experiments.{experiment}"
    found = set(learning_rates(config["experiments"][experiment], dataset))
    matches = sorted(lr for lr in found if lr_label(lr) == label)
    if len(matches) != 1:
        raise ConfigError(
            f"{key}: {len(matches)} learning rates of dataset {dataset!r} have the path label "
            f"lr{label} ({', '.join(map(repr, matches)) or 'none'}; grid: {sorted(found)})"
        )
    return matches[0]


def shared_label_problems(key: str, lrs: list[float], what: str = "") -> list[str]:
    """One message per pair of the learning rates ``lrs`` (of the grid at ``key``; ``what``:
    which of its lists, for the message) that share a path label: their runs would write one
    folder."""
    labels: dict[str, float] = {}
    problems = []
    for lr in lrs:
        other = labels.setdefault(lr_label(lr), lr)
        if other != lr:
            problems.append(
                f"{key}: learning rates {other!r} and {lr!r}{what} share the path label "
                f"lr{lr_label(lr)} (differ within 6 significant digits)"
            )
    return problems


def lr_label_problems(config: dict[str, Any], name: str) -> list[str]:
    """One message per pair of LRs of experiment ``name`` that share a path label (their runs
    would write one folder)."""
    exp = config["experiments"][name]
    return [
        problem
        for dataset in exp.get("datasets", [])
        for problem in shared_label_problems(
            f"experiments.{name}", learning_rates(exp, dataset), f" of dataset {dataset!r}"
        )
    ]


def experiment_runs(config: dict[str, Any], name: str) -> list[Run]:
    """Every run of experiment ``name``: models x datasets x configurations x LRs x seeds."""
    exp = config["experiments"][name]
    return [
        Run(name, model, dataset, configuration, lr, int(seed))
        for model in exp["models"]
        for dataset in exp["datasets"]
        for configuration in exp["configurations"]
        for lr in learning_rates(exp, dataset)
        for seed in exp["seeds"]
    ]


def imagenet_path(config: dict[str, Any]) -> str | None:
    """Where ImageNet val is: the environment variable wins over ``paths.imagenet``."""
    return os.environ.get(IMAGENET_ENV) or config["paths"].get("imagenet") or None
