"""What a budgeted verification verifies and how (:class:`VerifyPlan`): read by the
verification (:mod:`.verification`) and recorded with its export (:mod:`.verification_record`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyPlan:
    """What to verify and how: the run identity's names, the learning rates and seeds, and
    the candidates' choice (recommend.verify's keys)."""

    experiment: str
    model: str
    dataset: str
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    criterion: str = "plasticity"
    top_k: int = 2
    eta: int = 2
    baselines: tuple[str, ...] = ("head", "full", "lora")
