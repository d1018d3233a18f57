"""The one error line a refused ``vitplasticity`` command ends in: exit status 2, exactly one
ERROR log line, with no traceback and no second line, and nothing half-written. The tables of
bad inputs (tests/*/test_bad_*.py, tests/commands/test_damaged_stage_inputs.py) share it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from vitplasticity import cli


def refusal(
    argv: Sequence[str], caplog: pytest.LogCaptureFixture, outputs: Path | None = None
) -> str:
    """Run the CLI on ``argv`` and return its one error message, after checking that it
    refused as a bad input must: exit 2, one ERROR line without a newline or an exception's
    traceback, and nothing under ``outputs``."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        status = cli.main(list(argv))  # an exception escaping here is a traceback
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert status == 2 and len(errors) == 1, caplog.text
    message = errors[0].getMessage()
    assert "\n" not in message and errors[0].exc_info is None, message
    if outputs is not None:
        leftovers = list(outputs.rglob("*")) if outputs.exists() else []
        assert leftovers == [], f"half-written outputs: {leftovers}"
    return message
