"""Every key of the config schema says what it is, as the snakemake-workflow-catalog renders it
(type, description, default): a property without a description or a type fails, and so does one
without a default whose description does not say why it has none.

A key has no default when it is required (by its object's ``required``, or by the code for some
entries: ``cifar10c (required there)``, ``required for an enabled experiment``) or when its
absence means something a default cannot say (``absent: every file is downloaded``); its
description says which, with the word "required" or "absent". Snakemake's ``validate`` fills a
default into the config wherever the key is missing, so no default is invented for these.
"""

from collections.abc import Callable, Iterator

import jsonschema
import pytest
import yaml

from tests.helpers.repo import REPO

SCHEMA_PATH = REPO / "workflow/schemas/config.schema.yaml"
# Words of a description that say why a key has no default.
NO_DEFAULT_BECAUSE = ("required", "absent")


def resolve(schema: dict, node: dict) -> dict:
    """``node``, or the definition its local ``$ref`` points at."""
    ref = node.get("$ref")
    if ref is None:
        return node
    target = schema
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target


def properties(node: object, path: str = "") -> Iterator[tuple[str, dict]]:
    """Every (dotted path, schema) of a key declared under a ``properties:`` mapping, at any depth
    (definitions, model and dataset entries, nested settings blocks). An ``if:`` clause only
    tests a value, it declares no key: it is skipped."""
    if isinstance(node, list):
        for item in node:
            yield from properties(item, path)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "properties" and isinstance(value, dict):
            for name, sub in value.items():
                yield f"{path}.{name}".lstrip("."), sub
                yield from properties(sub, f"{path}.{name}")
        elif key == "definitions":
            for name, sub in value.items():
                yield from properties(sub, f"{path}.definitions.{name}")
        elif key == "additionalProperties":
            yield from properties(value, f"{path}.<name>")
        elif key != "if":
            yield from properties(value, path)


def own_or_referenced(schema: dict, sub: object, keyword: str) -> object:
    """The property's ``keyword`` (description, type), its own or its ``$ref``'s; None when it
    has neither."""
    if not isinstance(sub, dict):
        return None
    return sub.get(keyword) or resolve(schema, sub).get(keyword)


def undescribed(schema: dict) -> list[str]:
    """Paths of the properties with no description of their own nor behind their ``$ref``."""
    return [
        path
        for path, sub in properties(schema)
        if not own_or_referenced(schema, sub, "description")
    ]


def untyped(schema: dict) -> list[str]:
    """Paths of the properties with no ``type`` of their own nor behind their ``$ref`` (an
    ``enum`` or ``const`` alone does not say it: the catalog's table shows the type)."""
    return [path for path, sub in properties(schema) if not own_or_referenced(schema, sub, "type")]


def undefaulted(schema: dict) -> list[str]:
    """Paths of the properties with no ``default`` whose description does not say why (by one
    of :data:`NO_DEFAULT_BECAUSE`). A default behind a ``$ref`` does not count: Snakemake fills
    only the one written beside the property."""
    return [
        path
        for path, sub in properties(schema)
        if isinstance(sub, dict)
        and "default" not in sub
        and not any(
            word in str(own_or_referenced(schema, sub, "description"))
            for word in NO_DEFAULT_BECAUSE
        )
    ]


def invalid_defaults(schema: dict) -> list[str]:
    """Paths of the properties whose default their own schema rejects (a default of the wrong
    type, outside the bounds or not one of the choices)."""
    definitions = {"definitions": schema.get("definitions", {})}
    return [
        path
        for path, sub in properties(schema)
        if isinstance(sub, dict)
        and "default" in sub
        and not jsonschema.Draft202012Validator({**sub, **definitions}).is_valid(sub["default"])
    ]


# A schema with one gap of every kind, beside keys that have none.
PLANTED = {
    "definitions": {"seed": {"type": "integer", "description": "a seed"}},
    "properties": {
        "a": {"type": "integer", "default": 1, "description": "an a"},
        "b": {
            "type": "object",
            "default": {},
            "properties": {"c": {"type": "string", "default": "x"}},
        },
        "d": {"$ref": "#/definitions/seed", "default": 0},
        "e": {"type": "object", "default": {}, "additionalProperties": {"properties": {"f": {}}}},
        "g": {"enum": ["x", "y"], "default": "x", "description": "untyped"},
        "h": {"type": "string", "description": "required: an h"},
        "i": {"type": "string", "description": "absent: no i"},
        "j": {"type": "string", "description": "no default and no reason"},
        "k": {"type": "integer", "minimum": 1, "default": 0, "description": "out of bounds"},
        "l": {"enum": ["x", "y"], "type": "string", "default": "z", "description": "no choice"},
    },
}


PLANTED_GAPS = {
    undescribed: ["b", "b.c", "e", "e.<name>.f"],
    untyped: ["e.<name>.f", "g"],
    undefaulted: ["e.<name>.f", "j"],
    invalid_defaults: ["k", "l"],
}
CHECKS = list(PLANTED_GAPS)
CHECK_IDS = [check.__name__ for check in CHECKS]


@pytest.mark.parametrize("check", CHECKS, ids=CHECK_IDS)
def test_the_check_finds_the_planted_gaps(check: Callable[[dict], list[str]]) -> None:
    assert check(PLANTED) == PLANTED_GAPS[check]


@pytest.mark.parametrize("check", CHECKS, ids=CHECK_IDS)
def test_the_schema_has_no_gap(check: Callable[[dict], list[str]]) -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    gaps = check(schema)
    assert not gaps, f"{SCHEMA_PATH.name}: {len(gaps)} keys {check.__name__}:\n" + "\n".join(gaps)
