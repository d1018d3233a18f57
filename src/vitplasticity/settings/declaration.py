"""Settings declared once: a dataclass field with its :func:`setting` metadata is the CLI flag,
its parser, its check and the workflow rule's command-line fragment.

A settings dataclass (e.g. :class:`vitplasticity.finetune.settings.TrainingSettings`) declares
each field with :func:`setting`: the default, a help text, the config key it mirrors, and what
the schema says of it (choices, bounds). From that one declaration:

- :func:`add_settings_arguments` adds the ``--snake-case`` flags to an argparse parser (type
  from the annotation, choices, nargs for a tuple, booleans as ``true``/``false``);
- :func:`settings_from_args` builds the dataclass from the parsed flags (a ``convert``
  parses a flag's text into the field's value);
- :func:`check_settings` converts and checks choices and bounds, naming the flag and the
  config key, and gives back the settings as converted;
- :func:`rule_params` and :func:`command_flags` give a Snakemake rule one ``params:`` entry per
  config key and the ``--flag {params.name}`` text that passes them on, in the params' order;
- :func:`config_flags` writes a config block's values as flags (``--lora-rank 8 ...``);
- :func:`recorded_settings` gives the values as a stage's provenance records them.

The workflow's defaults live in its JSON schema; tests/settings/test_settings_agreement.py checks that
every schema key, default, choice and bound equals its field's. Torch-free: the Snakefile
imports it on every node.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Setting",
    "add_settings_arguments",
    "bad_setting",
    "check_settings",
    "command_flags",
    "config_flags",
    "flag",
    "param_name",
    "recorded_settings",
    "rule_params",
    "setting",
    "setting_fields",
    "settings_from_args",
    "switch_flag",
]


@dataclass(frozen=True)
class Setting:
    """What a settings field declares besides its default and type.

    ``key`` is the config key the value comes from (``finetune.batch_size``; ``<name>`` stands
    for an entry of a named block, e.g. ``datasets.<name>.steps``). Bounds follow JSON
    Schema's words and apply to every item of a tuple. ``switch`` makes a boolean a flag
    without a value (``--demo``), given when the value is true, or with ``inverted`` the flag
    ``--no-<name>``, given when it is false; ``json`` parses the value as JSON (a config entry).
    ``quote`` has the rule's command line quote the value for the shell (a path, a list of
    names), as a JSON value always is. ``convert`` parses a value given as text (the flag's,
    the config's: ``28K``) into the field's (``28000``); it returns a value already converted
    as it is and raises ValueError for a bad one. The flag and the rule's params carry the
    text.
    """

    help: str
    key: str
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    exclusive_maximum: float | None = None
    metavar: str | tuple[str, ...] | None = None
    switch: bool = False
    inverted: bool = False
    json: bool = False
    quote: bool = False
    convert: Callable[[Any], Any] | None = None


def setting(default: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A dataclass field whose metadata is a :class:`Setting` (keyword arguments ``declared``).

    Without ``default`` the setting is required (a required flag).
    """
    return dataclasses.field(default=default, metadata={"setting": Setting(**declared)})


def setting_fields(cls: type) -> list[tuple[dataclasses.Field, Setting, Any]]:
    """Each declared field of the dataclass ``cls`` with its :class:`Setting` and its type."""
    hints = typing.get_type_hints(cls)
    return [
        (field, field.metadata["setting"], hints[field.name])
        for field in dataclasses.fields(cls)
        if "setting" in field.metadata
    ]


def flag(name: str) -> str:
    """The CLI flag of field ``name``: ``--snake-case``."""
    return "--" + name.replace("_", "-")


def switch_flag(field: dataclasses.Field) -> str:
    """The flag of a switch: ``--name``, or ``--no-name`` for an inverted one."""
    inverted = field.metadata["setting"].inverted
    return flag(f"no_{field.name}" if inverted else field.name)


def param_name(field: dataclasses.Field) -> str:
    """The rule's params entry of a field: its name, ``<name>_flag`` for a switch."""
    return f"{field.name}_flag" if field.metadata["setting"].switch else field.name


def bad_setting(flag_text: str, key: str, message: str) -> ValueError:
    """The error of a bad value: ``--flag (config.key): message``."""
    return ValueError(f"{flag_text} ({key}): {message}")


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return lowered == "true"


def json_argument(text: str) -> Any:
    """argparse type for a JSON value (config entries arrive from the rules as JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text[:80]!r}") from error


def _bounds_text(declared: Setting) -> str | None:
    """``>= 1``, ``> 0``, ``in [0, 1)`` ...: the bounds of a setting, or None."""
    low = (
        ("[", declared.minimum)
        if declared.minimum is not None
        else ("(", declared.exclusive_minimum)
        if declared.exclusive_minimum is not None
        else None
    )
    high = (
        ("]", declared.maximum)
        if declared.maximum is not None
        else (")", declared.exclusive_maximum)
        if declared.exclusive_maximum is not None
        else None
    )
    if low and high:
        return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"
    return None


def _within(value: Any, declared: Setting) -> bool:
    """Whether ``value`` meets the bounds (written so that NaN meets none)."""
    checks = (
        (declared.minimum, lambda bound: value >= bound),
        (declared.exclusive_minimum, lambda bound: value > bound),
        (declared.maximum, lambda bound: value <= bound),
        (declared.exclusive_maximum, lambda bound: value < bound),
    )
    return all(check(bound) for bound, check in checks if bound is not None)


def _any_length(annotation: Any) -> bool:
    """Whether ``annotation`` is a tuple of any length (``tuple[str, ...]``)."""
    return typing.get_origin(annotation) is tuple and typing.get_args(annotation)[-1] is Ellipsis


def _plain_type(annotation: Any) -> Any:
    """The type a flag's text is parsed into: ``X`` of ``X | None``, else ``annotation``."""
    items = [item for item in typing.get_args(annotation) if item is not type(None)]
    return items[0] if isinstance(annotation, types.UnionType) and len(items) == 1 else annotation


def add_settings_arguments(
    parser: argparse._ActionsContainer, cls: type, only: Collection[str] | None = None
) -> None:
    """Add one flag per declared field of ``cls`` (of those named in ``only``, when given) to
    ``parser`` (a parser or group).

    The type comes from the annotation (``int``, ``float``, ``str``, ``bool`` as
    ``true``/``false``, a ``tuple`` as that many values), ``choices`` and ``help`` from the
    :class:`Setting`, the default from the field; a field without one is a required flag.
    """
    for field, declared, annotation in setting_fields(cls):
        if only is not None and field.name not in only:
            continue
        options: dict[str, Any] = {"help": f"{declared.help} ({declared.key})"}
        if field.default is dataclasses.MISSING:
            options["required"] = True
        elif not declared.switch:
            options.update(default=field.default, help=f"{options['help']}; default %(default)s")
        if declared.metavar is not None:
            options["metavar"] = declared.metavar
        if declared.switch:
            action = "store_false" if declared.inverted else "store_true"
            parser.add_argument(
                switch_flag(field), dest=field.name, action=action, help=options["help"]
            )
            continue
        if declared.json:
            options["type"] = json_argument
        elif declared.convert is not None:
            options["type"] = str  # settings_from_args converts the text
        elif annotation is bool:
            options.update(type=_boolean, metavar="{true,false}")
        elif typing.get_origin(annotation) is tuple:
            items = typing.get_args(annotation)
            options.update(type=items[0], nargs="+" if _any_length(annotation) else len(items))
        else:
            options["type"] = _plain_type(annotation)
        # A tuple's items are checked by check_settings, which names the config key.
        if declared.choices is not None and typing.get_origin(annotation) is not tuple:
            options["choices"] = declared.choices
        parser.add_argument(flag(field.name), **options)


def _converted(value: Any, declared: Setting, where: str, key: str) -> Any:
    """``value`` through the setting's ``convert`` (as it is without one).

    Raises:
        ValueError: ``--flag (config.key): why``, for a value the converter refuses.
    """
    if declared.convert is None:
        return value
    try:
        return declared.convert(value)
    except ValueError as error:
        raise bad_setting(where, key, str(error)) from None


def settings_from_args(cls: type, args: argparse.Namespace) -> Any:
    """The ``cls`` built from the parsed flags of its declared fields (tuples as tuples, a
    field's ``convert`` applied to its flag's text).

    Raises:
        ValueError: ``--flag (config.key): why``, for a text a converter refuses.
    """
    values = {}
    for field, declared, annotation in setting_fields(cls):
        value = getattr(args, field.name)
        value = tuple(value) if typing.get_origin(annotation) is tuple else value
        values[field.name] = _converted(value, declared, flag(field.name), declared.key)
    return cls(**values)


def _check_items(
    value: tuple[Any, ...], declared: Setting, annotation: Any, where: str, key: str
) -> None:
    """Check a tuple setting: its length (one at least where any length goes), then each item's
    choices and bounds."""
    if _any_length(annotation):
        if not value:
            raise bad_setting(where, key, "expected one value at least, got none")
    else:
        length = len(typing.get_args(annotation))
        bounds = _bounds_text(declared)
        if len(value) != length or not all(_within(item, declared) for item in value):
            rule = f", each {bounds}" if bounds else ""
            raise bad_setting(where, key, f"expected {length} values{rule}, got {value}")
    for item in value:
        if declared.choices is not None and item not in declared.choices:
            allowed = "|".join(str(choice) for choice in declared.choices)
            raise bad_setting(where, key, f"{item!r} not {allowed}")
        if not _within(item, declared):
            raise bad_setting(where, key, f"each must be {_bounds_text(declared)}, got {item}")


def check_settings(settings: Any, names: Mapping[str, str] | None = None) -> Any:
    """Convert each declared field (its ``convert``) and check its choices and bounds (every
    item of a tuple, and its length).

    Args:
        settings: a settings dataclass instance.
        names: what ``<name>`` in a config key stands for, by its block (``{"models":
            "vit_base"}``), so that a message names the entry.

    Returns:
        ``settings`` with every field converted (the same values where none converts).

    Raises:
        ValueError: ``--flag (config.key): what is wrong``, for the first bad field.
    """
    converted = {}
    for field, declared, annotation in setting_fields(type(settings)):
        key = declared.key
        for block, name in (names or {}).items():
            key = key.replace(f"{block}.<name>", f"{block}.{name}")
        where = flag(field.name)
        value = _converted(getattr(settings, field.name), declared, where, key)
        converted[field.name] = value
        if typing.get_origin(annotation) is tuple:
            _check_items(value, declared, annotation, where, key)
            continue
        if declared.choices is not None and value not in declared.choices:
            allowed = "|".join(str(choice) for choice in declared.choices)
            raise bad_setting(where, key, f"{value!r} not {allowed}")
        if not _within(value, declared):
            raise bad_setting(where, key, f"must be {_bounds_text(declared)}, got {value}")
    return dataclasses.replace(settings, **converted)


def recorded_settings(settings: Any, leave_out: Iterable[str] = ("demo",)) -> dict[str, Any]:
    """The declared fields of ``settings`` as provenance records them: by field name, tuples
    as lists, without the fields ``leave_out`` names (the demo label, which a stage's footer
    records beside its provenance)."""
    left_out = set(leave_out)
    return {
        field.name: list(value) if isinstance(value, tuple) else value
        for field, _, _ in setting_fields(type(settings))
        if field.name not in left_out
        for value in (getattr(settings, field.name),)
    }


def _config_value(value: Any) -> Any:
    """A config value as a rule param: booleans as the CLI's ``true``/``false``."""
    return str(value).lower() if isinstance(value, bool) else value


def _param_value(field: dataclasses.Field, annotation: Any, value: Any) -> Any:
    """A config value as the params entry of ``field``: a switch as its flag or ``""``, null
    as the CLI's ``none``, the value of a string setting or of one its flag's text converts
    (``budget: 28000``) as a string, else :func:`_config_value`."""
    declared = field.metadata["setting"]
    if declared.switch:
        return switch_flag(field) if bool(value) != declared.inverted else ""
    if value is None:
        return "none"
    if declared.convert is not None or _plain_type(annotation) is str:
        return str(value)
    return _config_value(value)


def _block_fields(cls: type, prefix: str) -> list[tuple[dataclasses.Field, str, Any]]:
    """The fields of ``cls`` mirroring a key ``<prefix>.<key>`` (not deeper), with the key and
    the field's type."""
    found = []
    for field, declared, annotation in setting_fields(cls):
        key = declared.key.removeprefix(f"{prefix}.")
        if key != declared.key and "." not in key:
            found.append((field, key, annotation))
    return found


def _block_value(block: Mapping[str, Any], prefix: str, key: str) -> Any:
    if key not in block:
        raise KeyError(f"{prefix}.{key}: missing (the schema's validate fills in its default)")
    return block[key]


def rule_params(cls: type, block: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """One params entry per field of ``cls`` mirroring a key ``<prefix>.<key>`` of ``block``.

    Each value is the config's own (booleans as ``true``/``false``), so that Snakemake tracks
    every key on its own: editing one reruns only the jobs whose params it changes.

    Raises:
        KeyError: naming a key the block lacks.
    """
    return {
        param_name(field): _param_value(field, annotation, _block_value(block, prefix, key))
        for field, key, annotation in _block_fields(cls, prefix)
    }


def command_flags(cls: type, params: Iterable[str]) -> str:
    """The ``--flag {params.name}`` text of each field of ``cls`` whose params entry is one of
    ``params``, in the order of ``params`` (a switch as ``{params.<name>_flag}``; a JSON value
    or one declared ``quote`` quoted for the shell).

    Raises:
        ValueError: for a name in ``params`` that is no field's params entry.
    """
    fields = {param_name(field): (field, declared) for field, declared, _ in setting_fields(cls)}
    names = list(params)
    unknown = [name for name in names if name not in fields]
    if unknown:
        raise ValueError(f"{cls.__name__}: no setting for params {sorted(unknown)}")
    parts = []
    for name in names:
        field, declared = fields[name]
        if declared.switch:
            parts.append(f"{{params.{name}}}")
            continue
        quote = declared.json or declared.quote
        parts.append(f"{flag(field.name)} {{params.{name}{':q' if quote else ''}}}")
    return "".join(f" {part}" for part in parts)


def config_flags(cls: type, block: Mapping[str, Any], prefix: str) -> str:
    """The values of ``block`` (config key ``<prefix>.<key>``) as the flags of the fields of
    ``cls`` that mirror them: ``--lora-rank 8 --lora-alpha 16``.

    Raises:
        KeyError: naming a key the block lacks.
    """
    parts = []
    for field, key, _ in _block_fields(cls, prefix):
        value = _config_value(_block_value(block, prefix, key))
        text = " ".join(map(str, value)) if isinstance(value, list | tuple) else value
        parts.append(f"{flag(field.name)} {text}")
    return " ".join(parts)
