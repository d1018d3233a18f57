"""The learning-rate schedule of the paper: linear warmup from 0, then cosine decay to 0.

docs/protocol.md: "Cosine schedule to 0 with a 2,000-step linear warmup from 0". The formula is
the one of ``transformers.get_cosine_schedule_with_warmup`` (one half cosine wave), which a
``LambdaLR`` applies to the optimizer step with index ``step`` (0-based): the first update
runs at learning rate 0, the last one just above 0.

The schedule is a pure function of the step index, so the step counter stored in a
checkpoint is the scheduler's whole state.
"""

from __future__ import annotations

import math


def warmup_cosine_lr(step: int, base_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate of the optimizer update with 0-based index ``step``.

    ``base_lr * step / warmup_steps`` while ``step < warmup_steps``; afterwards
    ``base_lr * 0.5 * (1 + cos(pi * progress))`` with
    ``progress = (step - warmup_steps) / (total_steps - warmup_steps)``, clamped at 0.

    Args:
        step: index of the optimizer update, 0 for the first.
        base_lr: peak learning rate, reached at the end of the warmup.
        warmup_steps: length of the linear warmup (0: none).
        total_steps: number of updates of the whole run; the rate reaches 0 there.

    Raises:
        ValueError: for a negative step or warmup, or fewer than one total step.
    """
    if step < 0 or warmup_steps < 0 or total_steps < 1:
        raise ValueError(
            f"schedule needs step >= 0, warmup_steps >= 0 and total_steps >= 1; got "
            f"step={step}, warmup_steps={warmup_steps}, total_steps={total_steps}"
        )
    if step < warmup_steps:
        return base_lr * step / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return base_lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
