"""The hand-written reference loop: what a user writes around timm with the data already on
the device, no loader, no logging, no clipping, nothing read back. The project's loop against
it is the cost of everything the project adds (its loader, clipping, schedule, checks)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch
import torch.nn.functional as functional
from torch import nn

from vitplasticity.finetune.precision import tf32_matmuls


def precision_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast, TF32 CUDA matmuls, or nothing (fp32), as a hand loop would set them."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "tf32" and device.type == "cuda":
        return tf32_matmuls()
    return contextlib.nullcontext()


def hand_loop(
    model: nn.Module,
    batch_size: int,
    input_size: int,
    num_classes: int,
    precision: str,
    steps: int,
    device: torch.device,
) -> Callable[[], None]:
    """``steps`` SGD steps (momentum 0.9) of a copy of ``model`` on one random batch already on
    ``device``, in ``precision``: the call a benchmark times."""
    model = copy.deepcopy(model).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch_size, 3, input_size, input_size, generator=generator).to(device)
    labels = torch.randint(num_classes, (batch_size,), generator=generator).to(device)

    def run() -> None:
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            with precision_context(device, precision):
                logits = model(images)
            functional.cross_entropy(logits.float(), labels).backward()
            optimizer.step()

    return run
