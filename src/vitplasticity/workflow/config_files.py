"""Reading a workflow config file before Snakemake does: one that is not UTF-8 text, or not
YAML, is named with its file, line and column (Snakemake's own message names neither), and
the Snakefile shows that line alone. Plain Python: no torch import."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from vitplasticity.workflow.config import SAFE_LOADER, ConfigError


def config_file_problem(path: str | os.PathLike[str]) -> str | None:
    """What makes the config file at ``path`` unreadable for Snakemake, or None.

    Returns:
        ``<file>: ...`` with the line and column of the first byte that is not UTF-8 or of
        the YAML syntax error, a top level that is not a mapping, or a folder given for the
        file; None for a readable file (or none at ``path``: Snakemake names that itself).
    """
    path = Path(path)
    if path.is_dir():
        return f"{path}: is a folder, not a config file: name a YAML file"
    if not path.is_file():
        return None
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        column = error.start - (raw.rfind(b"\n", 0, error.start) + 1) + 1
        return (
            f"{path}, line {line}, column {column}: byte 0x{raw[error.start]:02x} is not "
            "UTF-8 text: save the file as UTF-8"
        )
    try:
        # libyaml's loader: ~10x faster than PyYAML's own, which every cluster job pays again
        # when it re-parses the Snakefile (the same marks on errors).
        content = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(str(part) for part in (error.context, error.problem) if part)
        return f"{path}{where}: not valid YAML: {what}"
    except yaml.YAMLError as error:
        return f"{path}: not valid YAML: {error}"
    if content is not None and not isinstance(content, dict):
        return (
            f"{path}: holds a {type(content).__name__}, not a mapping of config keys at the "
            "top level (key: value lines)"
        )
    return None


def check_config_file(path: str | os.PathLike[str]) -> None:
    """Refuse the config file at ``path`` when Snakemake could not read it
    (:func:`config_file_problem`).

    Raises:
        ConfigError: naming the file, line and column.
    """
    problem = config_file_problem(path)
    if problem:
        raise ConfigError(f"invalid config file: {problem}")
