"""The optional packages (transformers, peft: the extra ``vitplasticity[extras]``), imported
only where a stage needs them, with an error that says how to install them."""

from __future__ import annotations

from typing import Any

EXTRA_HINT = "install the optional extra: pip install 'vitplasticity[extras]'"
"""How to get transformers and peft, quoted in every error about them."""


def require_transformers() -> Any:
    """The ``transformers`` module.

    Raises:
        ImportError: naming the optional extra when transformers is not installed.
    """
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            f"transformers models need the 'transformers' package: {EXTRA_HINT}"
        ) from error
    return transformers


def require_peft() -> Any:
    """The ``peft`` module.

    Raises:
        ImportError: naming the optional extra when peft is not installed.
    """
    try:
        import peft
    except ImportError as error:
        raise ImportError(
            f"the 'lora' configuration needs the 'peft' package: {EXTRA_HINT}"
        ) from error
    return peft
