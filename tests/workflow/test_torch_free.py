"""The Snakefile and every SLURM compute node parse the .smk files: what they import must not
import torch or timm (seconds per parse; and a login node may not have them working)."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys

import vitplasticity.workflow
from tests.helpers.repo import REPO

IMPORT = re.compile(r"^from (vitplasticity[\w.]*) import", re.M)


def workflow_imports() -> list[str]:
    """The vitplasticity modules the Snakefile and the rule files import, and every module of
    vitplasticity.workflow."""
    files = [REPO / "workflow/Snakefile", *sorted((REPO / "workflow/rules").glob("*.smk"))]
    named = {module for path in files for module in IMPORT.findall(path.read_text())}
    package = {
        f"vitplasticity.workflow.{info.name}"
        for info in pkgutil.iter_modules(vitplasticity.workflow.__path__)
    }
    return sorted(named | package)


def test_the_workflows_imports_pull_neither_torch_nor_timm() -> None:
    modules = workflow_imports()
    assert "vitplasticity.workflow.targets" in modules
    assert "vitplasticity.plasticity.settings" in modules  # read from common.smk
    script = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'timm') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *modules], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
