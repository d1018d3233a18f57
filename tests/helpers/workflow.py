"""Running the repository's workflow with `snakemake` in a temporary directory: on the mini
preset (:func:`snakemake`), or a dry run of the paper's config.yaml (:func:`paper_dry_run`);
and the config such a run reads (:func:`merged`)."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from snakemake.utils import update_config

from tests.helpers.repo import REPO

PRESETS = [
    REPO / "config/config.yaml",
    REPO / "config/demo.yaml",
    REPO / "tests/presets/mini.yaml",
]
"""The config files of the mini preset, in the order snakemake merges them."""


def snakemake(
    workdir: Path,
    *args: str,
    extra_configfiles: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run snakemake on the repository's Snakefile inside ``workdir``, on the mini preset with
    ``extra_configfiles`` merged last, in ``env`` (default: this process's environment) with
    this interpreter's scripts first on PATH."""
    bindir = Path(sys.executable).parent
    base = os.environ if env is None else env
    env = {**base, "PATH": f"{bindir}{os.pathsep}{base['PATH']}"}
    command = [
        str(bindir / "snakemake"),
        "--snakefile",
        str(REPO / "workflow/Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        *map(str, PRESETS),
        *map(str, extra_configfiles),
        "--cores",
        "2",
        *args,
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)


def planned_jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """Job counts of a dry run ({} when nothing is to be done)."""
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    text = result.stdout + result.stderr
    if "Job stats:" not in text:
        return {}
    table = text[text.index("Job stats:") :].split("\n\n")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def merged(*files: Path, edit: dict | None = None) -> dict:
    """The config of ``snakemake --configfile *files`` with ``edit`` merged last."""
    config: dict = {}
    for path in files:
        update_config(config, yaml.safe_load(path.read_text()))
    update_config(config, copy.deepcopy(edit or {}))
    return config


def paper_dry_run(
    workdir: Path, *targets: str, edit: str = "", env: dict | None = None
) -> subprocess.CompletedProcess:
    """`snakemake -n` of ``targets`` on config.yaml, with the YAML text ``edit`` (if any)
    merged over it, in ``workdir``; VITPLASTICITY_IMAGENET unset unless ``env`` is given."""
    configfiles = [str(REPO / "config/config.yaml")]
    if edit:
        (workdir / "edit.yaml").write_text(edit)
        configfiles.append(str(workdir / "edit.yaml"))
    bindir = Path(sys.executable).parent
    full_env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    if env is None:
        full_env.pop("VITPLASTICITY_IMAGENET", None)
    command = [
        str(bindir / "snakemake"),
        "-n",
        *targets,
        "--configfile",
        *configfiles,
        "--directory",
        str(workdir),
        "--snakefile",
        str(REPO / "workflow/Snakefile"),
    ]
    return subprocess.run(
        command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=300
    )
