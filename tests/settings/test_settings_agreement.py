"""One setting, one meaning: the workflow schema, the settings field (TrainingSettings, and each
stage's: plasticity/settings.py, recommend/settings.py, report/settings.py) and the command's flag agree on every key's default, type, choices and bounds; every
key of the finetune block has its flag and every flag its key; the generated checks accept
exactly what the schema accepts; the rule's params and command line come from the same fields.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import pytest
import yaml
from snakemake.utils import validate

from tests.helpers.repo import REPO
from vitplasticity.cli import build_parser
from vitplasticity.finetune.settings import (
    WORKFLOW_ONLY_KEYS,
    TextFinetuneSettings,
    TrainingSettings,
)
from vitplasticity.plasticity.settings import (
    BoundsSettings,
    PlasticitySettings,
    TextBoundsSettings,
    TextPlasticitySettings,
)
from vitplasticity.recommend.settings import RecommendImageSettings, RecommendTextSettings
from vitplasticity.report.settings import CriteriaSettings
from vitplasticity.settings.declaration import (
    Setting,
    check_settings,
    command_flags,
    config_flags,
    flag,
    rule_params,
    setting_fields,
    settings_from_args,
)
from vitplasticity.settings.sequences import SEQUENCE_DEFAULTS, sequence_settings
from vitplasticity.settings.tracking import TrackingSettings
from vitplasticity.workflow.config import load_schema

SCHEMA_PATH = REPO / "workflow/schemas/config.schema.yaml"
SCHEMA = load_schema(SCHEMA_PATH)

# Flags of `vitplasticity finetune` that say which run, not how to train (no config key),
# and where it stops this time (a rung of the verification: workflow/rules/verify.smk).
RUN_IDENTITY_DESTS = {
    "stop_at_step",
    "experiment",
    "model",
    "dataset",
    "dataset_dir",
    "text",
    "labelled_text",
    "configuration",
    "lr",
    "seed",
    "out_dir",
    "runs",
    "help",
}
# The --tracking-* flags of finetune, plasticity and recommend: the tracking: block, declared
# and checked in tests/settings/test_tracking_settings.py (never a rule's params).
TRACKING_DESTS = {field.name for field in dataclasses.fields(TrackingSettings)}
# Keys the workflow always passes, so the schema has no default; the flag's default serves
# direct CLI use only. config.check_config requires an enabled experiment's optimizer.
REQUIRED_BY_THE_WORKFLOW = {"experiments.<name>.optimizer"}

SCHEMA_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object"}
FIELDS = setting_fields(TrainingSettings)
TEXT_RUN_KEYS = {
    declared.key
    for _, declared, _ in setting_fields(TextFinetuneSettings)
    if declared.key.startswith("finetune.")
}
"""The finetune keys a text run's flags mirror (TextFinetuneSettings: mask_probability)."""
FIELD_IDS = [field.name for field, _, _ in FIELDS]


def resolve(node: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with its local ``$ref`` followed (the schema's #/definitions)."""
    while "$ref" in node:
        target: Any = SCHEMA
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_node(key: str) -> Mapping[str, Any]:
    """The schema of config key ``key`` (``<name>``: an entry of a named block)."""
    node: Mapping[str, Any] = SCHEMA
    for part in key.split("."):
        node = resolve(node)
        node = node["additionalProperties"] if part == "<name>" else node["properties"][part]
    return resolve(node)


def schema_leaves(prefix: str) -> Iterator[str]:
    """Every key below ``prefix`` whose value is not itself a block of keys."""
    for name, item in schema_node(prefix)["properties"].items():
        key = f"{prefix}.{name}"
        if "properties" in resolve(item):
            yield from schema_leaves(key)
        else:
            yield key


def plain(value: Any) -> Any:
    """Tuples as lists: a YAML/JSON default and a Python default compare equal."""
    return list(value) if isinstance(value, tuple) else value


def finetune_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices["finetune"]


def actions_by_dest() -> dict[str, argparse.Action]:
    return {action.dest: action for action in finetune_parser()._actions}


# -- schema, dataclass and CLI agree ------------------------------------------------------


def test_every_finetune_key_has_a_setting_and_every_setting_its_key() -> None:
    keys = {declared.key for _, declared, _ in FIELDS} | TEXT_RUN_KEYS
    leaves = set(schema_leaves("finetune"))
    assert leaves - keys - set(WORKFLOW_ONLY_KEYS) == set(), "schema keys without a field"
    assert set(WORKFLOW_ONLY_KEYS) <= leaves, "a workflow-only key the schema lacks"
    for key in keys:
        schema_node(key)  # KeyError: a field's key the schema does not define


def test_every_flag_is_a_setting_or_names_the_run() -> None:
    dests = set(actions_by_dest())
    names = {field.name for field, _, _ in FIELDS}
    text = {field.name for field, _, _ in setting_fields(TextFinetuneSettings)}
    assert dests - RUN_IDENTITY_DESTS - TRACKING_DESTS - text == names


@pytest.mark.parametrize(("field", "declared", "annotation"), FIELDS, ids=FIELD_IDS)
def test_schema_default_is_the_field_default_is_the_cli_default(
    field: dataclasses.Field, declared: Setting, annotation: Any
) -> None:
    node = schema_node(declared.key)
    action = actions_by_dest()[field.name]
    if field.default is dataclasses.MISSING:
        assert "default" not in node and action.required
        return
    assert not action.required
    assert plain(action.default) == plain(field.default)
    if declared.key in REQUIRED_BY_THE_WORKFLOW:
        assert "default" not in node
    else:
        assert node["default"] == plain(field.default)
        assert type(node["default"]) in (type(plain(field.default)), int)  # 16 for 16.0


@pytest.mark.parametrize(("field", "declared", "annotation"), FIELDS, ids=FIELD_IDS)
def test_types_choices_and_bounds_agree(
    field: dataclasses.Field, declared: Setting, annotation: Any
) -> None:
    node = schema_node(declared.key)
    action = actions_by_dest()[field.name]
    assert tuple(node.get("enum", ())) == (declared.choices or ())
    assert tuple(action.choices or ()) == (declared.choices or ())
    if typing.get_origin(annotation) is tuple:
        items = typing.get_args(annotation)
        assert node["type"] == "array" and action.nargs == len(items)
        assert node["minItems"] == node["maxItems"] == len(items)
        assert resolve(node["items"])["type"] == SCHEMA_TYPES[items[0]]
        node = resolve(node["items"])
    elif "enum" not in node:
        assert node["type"] == SCHEMA_TYPES[typing.get_origin(annotation) or annotation]
    bounds = {
        "minimum": declared.minimum,
        "exclusiveMinimum": declared.exclusive_minimum,
        "maximum": declared.maximum,
        "exclusiveMaximum": declared.exclusive_maximum,
    }
    assert {k: node.get(k) for k in bounds} == bounds


def candidates(declared: Setting, annotation: Any, default: Any) -> list[Any]:
    """Values at, just inside and just outside every bound and choice of a setting."""
    if declared.choices is not None:
        return [*declared.choices, "bogus"]
    item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is tuple else annotation
    step = 1 if item is int else 1e-6
    values: list[Any] = []
    for bound in (
        declared.minimum,
        declared.exclusive_minimum,
        declared.maximum,
        declared.exclusive_maximum,
    ):
        if bound is not None:
            values += [item(bound), item(bound) - step, item(bound) + step]
    if item is float:
        values.append(math.inf)
    if typing.get_origin(annotation) is tuple:
        inner = [default[0], *values]
        return [(value, default[1]) for value in inner] + [(default[0],), (*default, default[1])]
    return values


@pytest.mark.parametrize(("field", "declared", "annotation"), FIELDS, ids=FIELD_IDS)
def test_generated_checks_accept_what_the_schema_accepts(
    field: dataclasses.Field, declared: Setting, annotation: Any
) -> None:
    """jsonschema on the schema's node is the independent judge of every boundary value."""
    if declared.switch or declared.json or (annotation in (str, bool) and not declared.choices):
        return  # no declared constraint: nothing to compare
    node = dict(schema_node(declared.key))
    node.pop("default", None)
    base = TrainingSettings(model_spec={}, steps=10, val_every=5)
    default = getattr(base, field.name)
    for value in candidates(declared, annotation, default):
        schema_ok = jsonschema.Draft7Validator(node).is_valid(plain(value))
        try:
            check_settings(dataclasses.replace(base, **{field.name: value}))
            ours = True
        except ValueError as error:
            ours = False
            assert str(error).startswith(f"{flag(field.name)} ({declared.key}): ")
        assert ours == schema_ok, f"{field.name}={value!r}: schema {schema_ok}, ours {ours}"


@pytest.mark.parametrize(
    "field",
    [f.name for f, declared, a in FIELDS if a is float or typing.get_origin(a) is tuple],
)
def test_nan_is_rejected_where_a_bound_is_declared(field: str) -> None:
    """Stricter than jsonschema, which lets NaN pass every bound (its comparisons are false)."""
    base = TrainingSettings(model_spec={}, steps=10, val_every=5)
    value = (math.nan, 0.5) if field == "adam_betas" else math.nan
    with pytest.raises(ValueError, match=f"^{flag(field)} "):
        check_settings(dataclasses.replace(base, **{field: value}))


def test_a_bad_value_names_the_entry_of_a_named_block() -> None:
    settings = TrainingSettings(model_spec={}, steps=0, val_every=5)
    with pytest.raises(ValueError, match=r"^--steps \(datasets\.cifar10\.steps\): must be >= 1"):
        check_settings(settings, {"datasets": "cifar10"})


# -- the rule's params and command line -----------------------------------------------------


@pytest.fixture
def validated_config() -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    validate(config, str(SCHEMA_PATH))
    return config


def test_rule_params_are_one_entry_per_finetune_key(validated_config: dict) -> None:
    block = validated_config["finetune"]
    params = rule_params(TrainingSettings, block, "finetune")
    direct = {
        key.removeprefix("finetune.")
        for _, declared, _ in FIELDS
        if (key := declared.key).startswith("finetune.") and key.count(".") == 1
    }
    assert set(params) == direct
    assert params["num_workers"] == block["num_workers"] == 4
    assert params["compile"] == "false" and params["adam_betas"] == [0.9, 0.999]
    with pytest.raises(KeyError, match=r"finetune\.precision: missing"):
        rule_params(
            TrainingSettings, {k: v for k, v in block.items() if k != "precision"}, "finetune"
        )


def test_the_command_line_parses_back_to_the_config(validated_config: dict) -> None:
    """Fill the generated command like Snakemake does (lists space-joined) and parse it: every
    setting arrives with the config's value."""
    config = copy.deepcopy(validated_config)
    config["finetune"].update(num_workers=2, compile=True, precision="bf16", adam_betas=[0.8, 0.9])
    params = {
        "model_spec": '{"timm_id": "x"}',
        "optimizer": "adamw",
        "steps": 7,
        "val_every": 3,
        **rule_params(TrainingSettings, config["finetune"], "finetune"),
        "demo_flag": "--demo",
    }
    text = command_flags(TrainingSettings, [name for name in params if name != "model_spec"])
    filled = text.replace(":q}", "}").format(  # Snakemake's :q quotes for the shell
        params=argparse.Namespace(
            **{k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in params.items()}
        )
    )
    lora = config_flags(TrainingSettings, {"rank": 4, "alpha": 12}, "finetune.lora")
    assert lora == "--lora-rank 4 --lora-alpha 12"
    argv = ["finetune", "--experiment", "e", "--model", "m", "--dataset", "d"]
    argv += ["--dataset-dir", "x", "--model-spec", params["model_spec"]]
    args = build_parser().parse_args([*argv, *filled.split(), *lora.split()])
    for key, value in config["finetune"].items():
        if f"finetune.{key}" not in WORKFLOW_ONLY_KEYS and key != "lora":
            assert plain(getattr(args, key)) == value, key
    assert (args.optimizer, args.steps, args.val_every, args.demo) == ("adamw", 7, 3, True)
    assert (args.lora_rank, args.lora_alpha) == (4, 12.0)
    with pytest.raises(ValueError, match="no setting for params"):
        command_flags(TrainingSettings, ["batch_size", "pack_runs"])


# -- every measuring stage: plasticity, text plasticity, bounds, recommend, criteria ----------


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage's declaration, its command, the config blocks it reads and what is not a setting."""

    settings: type
    command: str
    blocks: tuple[str, ...]
    other_flags: frozenset[str]
    """Dests of the command's flags that name inputs, outputs or the model: no config key."""
    workflow_keys: frozenset[str] = frozenset()
    """Keys of its blocks that choose the jobs (or that another stage declares): no flag."""
    data_flags: tuple[str, ...] = ()
    """Flags its command needs beside its required ones (one of a required group)."""


# The workflow's verification (workflow/rules/verify.smk), not the recommend command's.
VERIFY_KEYS = frozenset(
    f"recommend.verify.{k}"
    for k in [
        "enabled",
        "experiment",
        "models",
        "datasets",
        "criterion",
        "top_k",
        "baselines",
        "eta",
    ]
)

STAGES = [
    Stage(
        PlasticitySettings,
        "plasticity",
        ("plasticity",),
        frozenset({"model", "model_spec", "reference", "dataset_dir", "out", "summary"})
        # a text model's (--text): its file and name, how it is cut
        | {"text", "dataset", "tokenizer", "sequence_length"},
        frozenset({"plasticity.models", "plasticity.datasets"}),
        data_flags=("--dataset-dir", "prepared"),
    ),
    Stage(
        TextPlasticitySettings,
        "plasticity",
        ("text_plasticity",),
        frozenset({"model", "model_spec", "reference", "text", "dataset", "out", "summary"})
        # an image model's: its prepared dataset, its downstream split, a gated MLP's FC1
        | {"dataset_dir", "split", "fc1"},
        frozenset(
            {f"text_plasticity.{k}" for k in ("enabled", "run_models", "reference", "datasets")}
            | {"text_plasticity.bounds_models"}
        ),
        data_flags=("--text", "notes.txt"),
    ),
    Stage(
        BoundsSettings,
        "bounds",
        ("plasticity",),
        frozenset({"model", "model_spec", "reference", "text", "out", "plasticity"})
        | {"figure_prefix", "tokenizer", "sequence_length", "n_sequences"},
        # The plasticity stage declares the rest of the block.
        frozenset(
            f"plasticity.{k}"
            for k in (
                "models",
                "datasets",
                "protocols",
                "downstream_split",
                "dtype",
                "fc1",
                "stream",
            )
        ),
        data_flags=("--reference", "reference.parquet"),
    ),
    Stage(
        TextBoundsSettings,
        "bounds",
        ("text_plasticity",),
        frozenset({"model", "model_spec", "reference", "text", "out", "plasticity"})
        | {"figure_prefix", "n_images"},
        # The text plasticity stage declares the rest of the block.
        frozenset(
            {f"text_plasticity.{k}" for k in ("enabled", "run_models", "reference", "datasets")}
            | {"text_plasticity.bounds_models"}
            | {f"text_plasticity.{k}" for k in ("protocols", "dtype", "stream")}
        ),
        data_flags=("--text", "reference.txt"),
    ),
    Stage(
        RecommendImageSettings,
        "recommend",
        ("recommend",),
        frozenset(
            {"model_spec", "timm_id", "weights", "normalize", "model_kwargs", "model"}
            | {"dataset_dir", "image_folder", "dataset", "reference", "reference_fallback"}
            | {"dtype", "out_prefix"}
            # a text model's (--text, --labelled-text): its files, how they are cut, the protocol
            | {"text", "labelled_text", "tokenizer", "sequence_length", "protocol"}
        ),
        frozenset({"recommend.enabled", "recommend.models", "recommend.datasets"} | VERIFY_KEYS),
    ),
    Stage(
        RecommendTextSettings,
        "recommend",
        ("text_plasticity", "recommend"),
        frozenset(
            {"model", "model_spec", "reference", "text", "labelled_text", "dataset", "protocol"}
            | {"dtype", "out_prefix"}
            # an image model's: its timm options, its data and reference, the head warm-up
            | {"timm_id", "weights", "normalize", "model_kwargs", "dataset_dir", "image_folder"}
            | {"reference_fallback", "warmup_steps", "warmup_lr"}
        ),
        # Its sequences are text_plasticity's; recommend --text declares those it takes.
        frozenset(
            {f"text_plasticity.{k}" for k in ("enabled", "run_models", "reference", "datasets")}
            | {"text_plasticity.bounds_models"}
            | {f"text_plasticity.{k}" for k in ("n_pairs", "batch_size", "protocols")}
            | {f"text_plasticity.{k}" for k in ("device", "dtype", "stream")}
            | {"recommend.enabled", "recommend.models", "recommend.datasets"}
            | {"recommend.warmup_steps", "recommend.warmup_lr"}
            | VERIFY_KEYS
        ),
        data_flags=("--text", "notes.txt"),
    ),
    Stage(
        TextFinetuneSettings,
        "finetune",
        ("finetune",),
        # The run's identity and inputs, and the training flags: TrainingSettings'.
        frozenset(
            {"experiment", "model", "dataset", "dataset_dir", "text", "labelled_text"}
            | {"configuration", "lr", "seed", "out_dir", "runs", "stop_at_step"}
            | {field.name for field in dataclasses.fields(TrainingSettings)}
        ),
        # TrainingSettings declares the block's other keys (tested above).
        frozenset(declared.key for _, declared, _ in FIELDS) | set(WORKFLOW_ONLY_KEYS),
        data_flags=("--text", "notes.txt"),
    ),
    Stage(
        CriteriaSettings,
        "criteria",
        ("report.criteria",),
        frozenset(
            {"selected", "runs", "recommend", "plasticity", "out"}
            | {"experiment", "selected_out", "markdown"}
        ),
        frozenset({"report.criteria.enabled", "report.criteria.experiments"}),
        data_flags=("--selected", "selected.parquet"),
    ),
]
STAGE_IDS = [f"{stage.command}-{stage.settings.__name__}" for stage in STAGES]
STAGE_FIELDS = [
    (stage, field, declared, annotation)
    for stage in STAGES
    for field, declared, annotation in setting_fields(stage.settings)
]
STAGE_FIELD_IDS = [f"{stage.command}-{field.name}" for stage, field, _, _ in STAGE_FIELDS]
DATASET_KEY = "datasets.<name>."
"""The prefix of the settings that are keys of a text dataset's entry (tokenizer, length)."""
TEXT_DATASET = "notes"
"""The text dataset the command-line test cuts its text as."""
NULL_MEANS_ANOTHER_KEY = {"recommend.n_pairs": "plasticity.n_pairs or text_plasticity.n_pairs"}
"""Keys whose schema default is null, which the workflow resolves to another key's value."""


def command_actions(command: str) -> dict[str, argparse.Action]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {action.dest: action for action in subparsers.choices[command]._actions}


def schema_types(annotation: Any) -> set[str]:
    """The JSON Schema type names an annotation allows (``str | None``: string and null)."""
    if typing.get_origin(annotation) is tuple:
        return {"array"}
    items = (
        typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    )
    return {"null" if item is type(None) else SCHEMA_TYPES[item] for item in items}


@pytest.mark.parametrize("stage", STAGES, ids=STAGE_IDS)
def test_every_key_of_a_stage_block_is_declared(stage: Stage) -> None:
    declared = {d.key for s in STAGES for _, d, _ in setting_fields(s.settings)}
    for block in stage.blocks:
        leaves = set(schema_leaves(block))
        keys = {d.key for _, d, _ in setting_fields(stage.settings) if d.key.startswith(block)}
        assert leaves - keys - stage.workflow_keys == set(), "schema keys without a field"
        assert stage.workflow_keys & leaves <= declared | stage.workflow_keys
    for _, item, _ in setting_fields(stage.settings):
        schema_node(item.key)  # KeyError: a field's key the schema does not define


@pytest.mark.parametrize("stage", STAGES, ids=STAGE_IDS)
def test_every_stage_flag_is_a_setting_or_names_an_input(stage: Stage) -> None:
    names = {field.name for field, _, _ in setting_fields(stage.settings)}
    flags = set(command_actions(stage.command)) - {"help"} - stage.other_flags
    assert flags - TRACKING_DESTS == names


@pytest.mark.parametrize(
    ("stage", "field", "declared", "annotation"), STAGE_FIELDS, ids=STAGE_FIELD_IDS
)
def test_stage_schema_default_is_the_field_default_is_the_cli_default(
    stage: Stage, field: dataclasses.Field, declared: Setting, annotation: Any
) -> None:
    node = schema_node(declared.key)
    action = command_actions(stage.command)[field.name]
    assert not action.required
    assert plain(action.default) == plain(field.default)
    if declared.key in NULL_MEANS_ANOTHER_KEY:
        assert node["default"] is None
    elif declared.key.startswith(DATASET_KEY):
        # A dataset entry's key: a schema default would fill every image entry too; the
        # workflow fills a text entry's from SEQUENCE_DEFAULTS.
        assert "default" not in node
        assert SEQUENCE_DEFAULTS[declared.key.removeprefix(DATASET_KEY)] == field.default
    else:
        assert node["default"] == plain(field.default)


@pytest.mark.parametrize(
    ("stage", "field", "declared", "annotation"), STAGE_FIELDS, ids=STAGE_FIELD_IDS
)
def test_stage_types_choices_and_bounds_agree(
    stage: Stage, field: dataclasses.Field, declared: Setting, annotation: Any
) -> None:
    node = schema_node(declared.key)
    if typing.get_origin(annotation) is tuple:
        assert node["type"] == "array" and node.get("minItems") == 1
        item = resolve(node["items"])
        assert tuple(item.get("enum", ())) == (declared.choices or ())
        if "enum" not in item:
            assert item["type"] == "string"
    else:
        assert tuple(node.get("enum", ())) == (declared.choices or ())
        if "enum" not in node:
            allowed = node["type"] if isinstance(node["type"], list) else [node["type"]]
            if declared.key not in NULL_MEANS_ANOTHER_KEY:
                assert schema_types(annotation) <= set(allowed)
                # A converted setting's config value may also be its text (28000 or 28K).
                text = {"string"} if declared.convert is not None else set()
                assert set(allowed) - schema_types(annotation) <= {"integer"} | text
        bounds = {
            "minimum": declared.minimum,
            "exclusiveMinimum": declared.exclusive_minimum,
            "maximum": declared.maximum,
            "exclusiveMaximum": declared.exclusive_maximum,
        }
        if declared.key != "recommend.budget":  # its minimum bounds the numbers alone
            assert {k: node.get(k) for k in bounds} == bounds


@pytest.mark.parametrize(
    ("stage", "field", "declared", "annotation"),
    [case for case in STAGE_FIELDS if case[2].minimum is not None or case[2].choices],
    ids=[
        i
        for i, c in zip(STAGE_FIELD_IDS, STAGE_FIELDS, strict=True)
        if c[2].minimum is not None or c[2].choices
    ],
)
def test_stage_checks_accept_what_the_schema_accepts(
    stage: Stage, field: dataclasses.Field, declared: Setting, annotation: Any
) -> None:
    """jsonschema on the schema's node is the independent judge of each boundary value."""
    node = dict(schema_node(declared.key))
    node.pop("default", None)
    base = stage.settings()
    if typing.get_origin(annotation) is tuple:
        values = [(choice,) for choice in declared.choices or ()] + [("bogus",), ()]
    elif declared.choices:
        values = [*declared.choices, "bogus"]
    else:
        values = [int(declared.minimum) + step for step in (-1, 0, 1)]
    for value in values:
        schema_ok = jsonschema.Draft7Validator(node).is_valid(plain(value))
        try:
            check_settings(dataclasses.replace(base, **{field.name: value}))
            ours = True
        except ValueError as error:
            ours = False
            assert str(error).startswith(f"{flag(field.name)} ({declared.key}): ")
        assert ours == schema_ok, f"{field.name}={value!r}: schema {schema_ok}, ours {ours}"


def stage_params(stage: Stage, config: dict) -> dict[str, Any]:
    """The rule's params as workflow/rules/common.smk's stage_params builds them."""
    params: dict[str, Any] = {}
    for block in stage.blocks:
        values: Any = config
        for part in block.split("."):
            values = values[part]
        params.update(rule_params(stage.settings, values, block))
    if any(d.key.startswith(DATASET_KEY) for _, d, _ in setting_fields(stage.settings)):
        params.update(sequence_settings(config["datasets"][TEXT_DATASET]))
    if "demo" not in {field.name for field in dataclasses.fields(stage.settings)}:
        return params  # finetune's text flags: its --demo is TrainingSettings'
    return {**params, "demo_flag": "--demo" if config["demo"] else ""}


@pytest.mark.parametrize("stage", STAGES, ids=STAGE_IDS)
def test_the_stage_command_line_carries_every_setting_and_parses_back(
    stage: Stage, validated_config: dict
) -> None:
    """Every declared field reaches the generated command line, and the command parses it back
    to the config's values (lists space-joined as Snakemake joins them)."""
    config = copy.deepcopy(validated_config)
    config["demo"] = True
    config["recommend"].update(n_pairs=77, budget=28000, combine=True)
    config["report"]["criteria"]["parameters"] = False
    config["datasets"][TEXT_DATASET] = {
        "source": "text_file",
        "path": "notes.txt",
        "steps": 10,
        "val_every": 5,
        "tokenizer": "bytes",
        "sequence_length": 77,
    }
    params = stage_params(stage, config)
    text = command_flags(stage.settings, list(params))
    for field, declared, _ in setting_fields(stage.settings):
        shown = f"{{params.{field.name}_flag}}" if declared.switch else flag(field.name)
        assert shown in text, field.name
    filled = text.replace(":q}", "}").format(  # Snakemake's :q quotes for the shell
        params=argparse.Namespace(
            **{k: " ".join(map(str, v)) if isinstance(v, list) else v for k, v in params.items()}
        )
    )
    required = [
        # "1": a value every type of required flag takes (a name, a path, --lr, --seed).
        (action.option_strings[0], "{}" if action.dest == "model_spec" else "1")
        for action in command_actions(stage.command).values()
        if action.required
    ]
    argv = [
        stage.command,
        *(part for pair in required for part in pair),
        *stage.data_flags,
        *filled.split(),
    ]
    args = build_parser().parse_args(argv)
    for field, declared, _ in setting_fields(stage.settings):
        *parents, key = declared.key.replace("<name>", TEXT_DATASET).split(".")
        block: Any = config
        for part in parents:
            block = block[part]
        expected = block[key]
        if declared.key == "recommend.budget":
            expected = str(expected)
        assert plain(getattr(args, field.name)) == expected, field.name


def test_a_converted_setting_travels_as_text_and_arrives_converted() -> None:
    """The budget's flag and rule param carry its text (28K); settings_from_args and
    check_settings give the number, and a text the converter refuses names flag and key."""
    args = build_parser().parse_args(["recommend", "--out-prefix", "x", "--budget", "28K"])
    assert args.budget == "28K"
    assert settings_from_args(RecommendImageSettings, args).budget == 28_000
    assert check_settings(RecommendTextSettings(budget="1.5M")).budget == 1_500_000
    assert check_settings(RecommendTextSettings(budget=None)).budget is None
    with pytest.raises(ValueError, match=r"^--budget \(recommend\.budget\): budget 'lots'"):
        check_settings(RecommendImageSettings(budget="lots"))
    with pytest.raises(ValueError, match=r"^--budget \(recommend\.budget\): budget '1x'"):
        settings_from_args(
            RecommendTextSettings,
            argparse.Namespace(
                **{
                    field.name: field.default
                    for field, _, _ in setting_fields(RecommendTextSettings)
                }
                | {"budget": "1x"}
            ),
        )
