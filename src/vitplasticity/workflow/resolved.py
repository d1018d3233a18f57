"""The resolved config (the config files merged, the schema's defaults filled in) saved beside
the results at the start of a run, as facebookresearch/dinov2 saves its config beside every
output: what produced the results can be read back without re-running the merge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from vitplasticity.utils.io import atomic_path

FILENAME = "config.resolved.yaml"


class _PlainDumper(yaml.SafeDumper):
    """A YAML dumper that writes a value every place it appears: the schema's defaults fill
    one dict object into several keys, which a plain dump writes as ``&id001`` anchors and
    ``*id001`` aliases, hard to read in a file meant for people."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def resolved_config_path(config: dict[str, Any]) -> Path:
    """Where the resolved config is saved: ``<paths.results>/config.resolved.yaml``."""
    return Path(config["paths"]["results"]) / FILENAME


def resolved_config_text(config: dict[str, Any]) -> str:
    """``config`` as YAML, in its own key order."""
    return yaml.dump(config, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True)


def save_resolved_config(config: dict[str, Any]) -> bool:
    """Write ``config`` (:func:`resolved_config_text`) to :func:`resolved_config_path`
    atomically, unless the file already holds it: an unchanged rerun leaves the file and its
    mtime alone.

    Returns:
        Whether the file was written.
    """
    text = resolved_config_text(config)
    target = resolved_config_path(config)
    if target.is_file() and target.read_text() == text:
        return False
    with atomic_path(target) as tmp:
        tmp.write_text(text)
    return True
