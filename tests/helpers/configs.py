"""Workflow configs for tests: config.yaml and the demo preset merged as Snakemake merges them,
and `snakemake -n` on the repository's Snakefile."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from snakemake.utils import update_config, validate

from tests.helpers.repo import REPO

PAPER = REPO / "config/config.yaml"
DEMO = REPO / "config/demo.yaml"
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"

Configure = Callable[..., dict[str, Any]]
"""A config edit merged over the demo's, validated (the ``demo_with`` fixture of tests/workflow)."""


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``override`` merged over a copy of ``base`` by Snakemake's own --configfile merge
    (``snakemake.utils.update_config``: mappings merge, everything else replaces)."""
    out = copy.deepcopy(base)
    update_config(out, copy.deepcopy(override))
    return out


def validated(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the schema's defaults filled in (Snakemake's validate, as the Snakefile)."""
    validate(config, str(SCHEMA))
    return config


def load_config(*files: Path) -> dict[str, Any]:
    """The config ``files`` give, merged in order."""
    config: dict[str, Any] = {}
    for file in files:
        config = merged(config, yaml.safe_load(file.read_text()))
    return config


def dry_run(
    workdir: Path,
    *configfiles: Path,
    edit: dict[str, Any] | None = None,
    options: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """`snakemake -n all` in ``workdir`` on ``configfiles`` with ``edit`` (YAML) merged over
    them and Snakemake's ``options`` after, the package of this checkout first on PYTHONPATH."""
    files = [str(f) for f in configfiles]
    if edit is not None:
        (workdir / "edit.yaml").write_text(yaml.safe_dump(edit))
        files.append(str(workdir / "edit.yaml"))
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("VITPLASTICITY_IMAGENET", None)
    command = [
        str(bindir / "snakemake"),
        "-n",
        "all",
        "--snakefile",
        str(REPO / "workflow/Snakefile"),
    ]
    command += ["--directory", str(workdir), *options, "--configfile", *files]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
