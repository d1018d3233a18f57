"""vitplasticity.workflow.resolved: the resolved config beside the results, written only when
it changed (the end-to-end run: tests/pipeline/test_resolved_config.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from vitplasticity.workflow.resolved import (
    resolved_config_path,
    resolved_config_text,
    save_resolved_config,
)


def test_the_file_lies_beside_the_results(demo: dict[str, Any]) -> None:
    assert resolved_config_path(demo) == Path("results/demo/config.resolved.yaml")


def test_it_holds_the_config_in_its_own_order(demo: dict[str, Any], tmp_path: Path) -> None:
    demo["paths"]["results"] = str(tmp_path / "results")
    assert save_resolved_config(demo) is True
    path = resolved_config_path(demo)
    assert yaml.safe_load(path.read_text()) == demo
    assert list(yaml.safe_load(path.read_text())) == list(demo)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_an_unchanged_config_leaves_the_file_alone(demo: dict[str, Any], tmp_path: Path) -> None:
    demo["paths"]["results"] = str(tmp_path)
    save_resolved_config(demo)
    path = resolved_config_path(demo)
    os.utime(path, (1_000_000, 1_000_000))
    assert save_resolved_config(demo) is False
    assert path.stat().st_mtime == 1_000_000
    demo["plasticity"]["n_pairs"] += 1
    assert save_resolved_config(demo) is True
    assert (
        yaml.safe_load(path.read_text())["plasticity"]["n_pairs"] == demo["plasticity"]["n_pairs"]
    )


def test_a_value_filled_into_several_keys_is_written_at_each(demo: dict[str, Any]) -> None:
    """The schema's defaults fill one object into several keys: each is written out in full,
    with no YAML anchor or alias, and the file reads back as the config."""
    shared: dict[str, Any] = {}
    demo["models"]["demo_vit"]["kwargs"] = demo["models"]["vit_base"]["kwargs"] = shared
    text = resolved_config_text(demo)
    assert "&id" not in text and "*id" not in text
    assert yaml.safe_load(text) == demo
