"""The optional packages (transformers, peft: the extra ``vitplasticity[extras]``), imported
only where a stage needs them, with an error that says how to install them."""

from __future__ import annotations

import importlib
from typing import Any

EXTRA_HINT = "install the optional extra: pip install 'vitplasticity[extras]'"
"""How to get transformers and peft, quoted in every error about them."""


def require_transformers() -> Any:
    """The ``transformers`` module.

    Raises:
        ImportError: naming the optional extra when transformers is not installed.
    """
    return _import_extra("transformers", "transformers models need")


def require_peft() -> Any:
    """The ``peft`` module.

    Raises:
        ImportError: naming the optional extra when peft is not installed.
    """
    return _import_extra("peft", "the 'lora' configuration needs")


def _import_extra(module: str, needed_by: str) -> Any:
    """Import ``module`` of the optional extra; ``needed_by`` starts the error's message."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{needed_by} the '{module}' package: {EXTRA_HINT}") from error
