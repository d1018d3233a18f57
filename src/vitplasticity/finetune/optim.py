"""A run's optimizer (docs/protocol.md, "Finetuning"): SGD with momentum or AdamW, no weight
decay, over the trained parameters only.
"""

from __future__ import annotations

import torch
from torch import nn

from vitplasticity.finetune.identity import FinetuneSettings


def build_optimizer(
    trainable: list[tuple[str, nn.Parameter]], settings: FinetuneSettings
) -> torch.optim.Optimizer:
    """SGD (momentum, no nesterov) or AdamW, both without weight decay (docs/protocol.md).

    Only the trained parameters are handed over, so frozen ones get no optimizer state.
    """
    parameters = [parameter for _, parameter in trainable]
    # The learning rate is set before every step from the schedule; lr here is a placeholder.
    if settings.training.optimizer == "sgd":
        return torch.optim.SGD(
            parameters,
            lr=settings.run.lr,
            momentum=settings.training.momentum,
            weight_decay=0.0,
            nesterov=False,
        )
    return torch.optim.AdamW(
        parameters, lr=settings.run.lr, betas=tuple(settings.training.adam_betas), weight_decay=0.0
    )
