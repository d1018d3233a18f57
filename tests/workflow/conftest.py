"""Configs as the Snakefile has them once it has validated them: config.yaml (the paper) and
with the demo preset, merged as --configfile merges them, the schema's defaults filled in."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.configs import DEMO, PAPER, Configure, load_config, merged, validated


@pytest.fixture
def paper() -> dict[str, Any]:
    return validated(load_config(PAPER))


@pytest.fixture
def demo() -> dict[str, Any]:
    return validated(load_config(PAPER, DEMO))


@pytest.fixture
def demo_with() -> Configure:
    """The demo's config with an edit merged over it (as a last --configfile would)."""

    def configure(edit: dict[str, Any]) -> dict[str, Any]:
        return validated(merged(load_config(PAPER, DEMO), edit))

    return configure
