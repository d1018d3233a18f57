"""The per-group gradient norms a run logs: one column per group of :data:`GROUPS`, each
parameter counted in the group of the configuration that trains it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vitplasticity.models.architectures import (
    Owner,
    ParameterMap,
)

GROUPS: tuple[str, ...] = ("emb", "ln1", "mha", "ln2", "fc1", "fc2", "head")
"""Groups with their own gradient-norm column (:func:`gradient_group`)."""


def gradient_group(owner: Owner) -> str:
    """The gradient-norm column of a parameter: the configuration that trains it
    (:attr:`Owner.gradient_group`), except that LoRA adapters count as MHA's, the attention
    linears they adapt (:meth:`Architecture.lora_targets`), as the paper's runs log them."""
    return "mha" if owner.group == "lora" else owner.gradient_group


def group_grad_norms(
    named_parameters: list[tuple[str, nn.Parameter]], parameters: ParameterMap
) -> dict[str, float]:
    """L2 norm of the gradients of each group of :data:`GROUPS` (only groups with gradients),
    the squares summed in ``named_parameters`` order; ``parameters`` says whose each is."""
    squares: dict[str, torch.Tensor] = {}
    for name, parameter in named_parameters:
        if parameter.grad is None:
            continue
        group = gradient_group(parameters.owners[name])
        square = parameter.grad.detach().float().square().sum()
        squares[group] = squares[group] + square if group in squares else square
    return {group: math.sqrt(float(value)) for group, value in squares.items() if group in GROUPS}
