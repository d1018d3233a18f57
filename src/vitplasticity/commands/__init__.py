"""Subcommands of the ``vitplasticity`` CLI, one module per group of stages."""

import argparse
import json
from typing import Any


def json_argument(text: str) -> Any:
    """argparse type for a JSON value (config entries arrive from the rules as JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON ({error}): {text[:80]!r}") from error
