"""Every key of the config schema says what it is: a property without a description fails."""

from collections.abc import Iterator
from pathlib import Path

import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "workflow/schemas/config.schema.yaml"


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


def undescribed(schema: dict) -> list[str]:
    """Paths of the properties with no description of their own nor behind their ``$ref``."""
    return [
        path
        for path, sub in properties(schema)
        if not (
            isinstance(sub, dict)
            and (sub.get("description") or resolve(schema, sub).get("description"))
        )
    ]


def test_undescribed_finds_a_property_without_a_description() -> None:
    schema = {
        "definitions": {"seed": {"type": "integer", "description": "a seed"}},
        "properties": {
            "a": {"type": "integer", "description": "an a"},
            "b": {"type": "object", "properties": {"c": {"type": "string"}}},
            "d": {"$ref": "#/definitions/seed"},
            "e": {"type": "object", "additionalProperties": {"properties": {"f": {}}}},
        },
    }
    assert undescribed(schema) == ["b", "b.c", "e", "e.<name>.f"]


def test_every_schema_property_has_a_description() -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    missing = undescribed(schema)
    assert not missing, (
        f"{SCHEMA_PATH.name}: {len(missing)} keys without a description:\n" + "\n".join(missing)
    )
