"""The resolved config beside the results (docs/configuration.md): written when a run starts
its jobs, not by a dry run, and rewritten only when the config changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.helpers.configs import validated
from tests.helpers.workflow import PRESETS, merged, snakemake

pytestmark = pytest.mark.slow

DATASETS = "resources/demo/datasets"


def test_a_run_saves_the_config_it_ran_with_and_a_dry_run_does_not(tmp_path: Path) -> None:
    saved = tmp_path / "results/demo/config.resolved.yaml"
    dry = snakemake(tmp_path, "-n", f"{DATASETS}/demo-stripes")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not saved.exists()

    run = snakemake(tmp_path, f"{DATASETS}/demo-stripes")
    assert run.returncode == 0, run.stderr[-3000:]
    assert yaml.safe_load(saved.read_text()) == validated(merged(*PRESETS))

    # Another run on the same config leaves the file as it was.
    os.utime(saved, (1_000_000, 1_000_000))
    same = snakemake(tmp_path, f"{DATASETS}/demo-blobs")
    assert same.returncode == 0, same.stderr[-3000:]
    assert saved.stat().st_mtime == 1_000_000

    # A run on an edited config records the edit.
    edit = {"report": {"figures": {"dpi": 300}}}
    (tmp_path / "edit.yaml").write_text(yaml.safe_dump(edit))
    edited = snakemake(
        tmp_path, f"{DATASETS}/demo-reference", extra_configfiles=(tmp_path / "edit.yaml",)
    )
    assert edited.returncode == 0, edited.stderr[-3000:]
    assert yaml.safe_load(saved.read_text()) == validated(merged(*PRESETS, edit=edit))
