"""The tracking: block: its schema and its fields agree (keys, defaults, choices); a command
takes it from VITPLASTICITY_TRACKING, a flag winning; a bad value is named by its key."""

from __future__ import annotations

import argparse
import dataclasses
import json

import jsonschema
import pytest

from tests.helpers.repo import REPO
from vitplasticity.cli import build_parser
from vitplasticity.settings.declaration import setting_fields
from vitplasticity.settings.tracking import (
    TRACKING_VARIABLE,
    TrackingSettings,
    tracking_environment,
    tracking_from_args,
)
from vitplasticity.workflow.config import load_schema

SCHEMA = load_schema(REPO / "workflow/schemas/config.schema.yaml")
BLOCK = SCHEMA["properties"]["tracking"]
TRACKED_COMMANDS = (
    "finetune",
    "plasticity",
    "recommend",
)


def command_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def test_every_key_has_a_field_and_every_field_its_key() -> None:
    keys = {declared.key for _, declared, _ in setting_fields(TrackingSettings)}
    assert keys == {f"tracking.{key}" for key in BLOCK["properties"]}


def test_the_schema_defaults_are_the_field_defaults() -> None:
    defaults = {key: node["default"] for key, node in BLOCK["properties"].items()}
    assert TrackingSettings.from_config(defaults) == TrackingSettings()
    assert TrackingSettings.from_config({}) == TrackingSettings()
    assert TrackingSettings().backend == ("none",)


def test_the_schema_choices_are_the_field_choices() -> None:
    choices = {d.key: set(d.choices or ()) for _, d, _ in setting_fields(TrackingSettings)}
    backend = BLOCK["properties"]["backend"]["oneOf"]
    assert set(backend[0]["enum"]) == set(backend[1]["items"]["enum"])
    assert choices["tracking.backend"] == set(backend[0]["enum"])
    assert choices["tracking.wandb_mode"] == set(BLOCK["properties"]["wandb_mode"]["enum"])


@pytest.mark.parametrize(
    "block",
    [
        {"backend": "tensorboard"},
        {"backend": ["wandb", "comet"]},
        {"wandb_mode": "disabled"},
        {"backend": "wandb", "entity": "me"},
    ],
)
def test_the_check_refuses_what_the_schema_refuses(block: dict) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(block, BLOCK)
    with pytest.raises(ValueError, match="tracking"):
        TrackingSettings.from_config(block)


@pytest.mark.parametrize(
    "block", [{}, {"backend": "wandb"}, {"backend": ["wandb", "mlflow"], "wandb_mode": "offline"}]
)
def test_the_check_accepts_what_the_schema_accepts(block: dict) -> None:
    jsonschema.validate(block, BLOCK)
    names = block.get("backend", "none")
    assert TrackingSettings.from_config(block).backend == (
        (names,) if isinstance(names, str) else tuple(names)
    )


@pytest.mark.parametrize("command", TRACKED_COMMANDS)
def test_every_tracked_command_has_the_flags(command: str) -> None:
    dests = {action.dest for action in command_parser(command)._actions}
    assert {field.name for field in dataclasses.fields(TrackingSettings)} <= dests


def parsed(*flags: str) -> argparse.Namespace:
    """The finetune command's flags parsed (the required ones given placeholders)."""
    required = ["--experiment", "e", "--model", "m", "--dataset", "d", "--dataset-dir", "x"]
    required += ["--model-spec", "{}", "--steps", "1", "--val-every", "1"]
    return command_parser("finetune").parse_args([*required, *flags])


def test_the_environment_gives_the_settings_and_a_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(TRACKING_VARIABLE, raising=False)
    assert tracking_from_args(parsed()) == TrackingSettings()
    block = {"backend": ["wandb", "mlflow"], "project": "grid", "wandb_mode": "offline"}
    monkeypatch.setenv(TRACKING_VARIABLE, tracking_environment(block))
    from_environment = tracking_from_args(parsed())
    assert from_environment.backend == ("wandb", "mlflow")
    assert (from_environment.project, from_environment.wandb_mode) == ("grid", "offline")
    given = tracking_from_args(parsed("--tracking-backend", "mlflow", "--tracking-project", "p"))
    assert (given.backend, given.project, given.wandb_mode) == (("mlflow",), "p", "offline")


def test_a_bad_environment_value_names_the_variable_and_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(TRACKING_VARIABLE, json.dumps({"wandb_mode": "sometimes"}))
    with pytest.raises(ValueError, match=f"{TRACKING_VARIABLE}.*tracking.wandb_mode"):
        tracking_from_args(parsed())
    monkeypatch.setenv(TRACKING_VARIABLE, "{not json")
    with pytest.raises(ValueError, match=TRACKING_VARIABLE):
        tracking_from_args(parsed())
