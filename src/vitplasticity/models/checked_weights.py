"""What a weights loader checks of what it reads: each safetensors file whole (its header covers
the file: a truncated download or random bytes is named before a tensor is read), and every
loaded tensor finite (a file of NaN or inf bytes would load, and every measurement of its model
be NaN with exit 0).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

SAFETENSORS_SUFFIX = ".safetensors"


def check_safetensors_file(path: str | Path) -> None:
    """Raise unless ``path`` is a whole safetensors file (its header read, nothing more).

    Raises:
        ValueError: naming the file and what safetensors found wrong.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except SafetensorError as error:
        raise ValueError(
            f"{path}: not a whole safetensors file ({error}): a truncated or damaged "
            "download; replace it (the weights stage fetches it again once it is deleted)"
        ) from error


def check_safetensors_folder(folder: str | Path) -> None:
    """:func:`check_safetensors_file` of every safetensors file in a saved model folder."""
    for path in sorted(Path(folder).rglob(f"*{SAFETENSORS_SUFFIX}")):
        check_safetensors_file(path)


def check_finite(tensors: Iterable[tuple[str, torch.Tensor]], source: str | Path) -> None:
    """Raise unless every floating-point tensor of ``tensors`` (name, tensor) is finite.

    One reduction per tensor: a checkpoint of a billion values is checked in seconds.

    Raises:
        ValueError: naming ``source`` (the weights file or folder), the first tensor holding
            NaN or inf and how many of its values are.
    """
    for name, tensor in tensors:
        if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
            continue
        nan = int(torch.isnan(tensor).sum())
        inf = int(torch.isinf(tensor).sum())
        raise ValueError(
            f"{source}: tensor {name} is not finite ({nan} NaN and {inf} inf of "
            f"{tensor.numel()} values): the weights are damaged; replace them"
        )
