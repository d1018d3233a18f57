"""Budgeted verification of a recommendation: which configurations to finetune, the rungs of
successive halving over each one's learning rates, each rung's decision, and the compute it
spends beside the full grid's. Torch-free (the Snakefile imports it).

Successive halving, per configuration: every learning rate runs with the first seed to the
first rung's step; the better ``1/eta`` (by best validation accuracy so far) continue to the
next rung, and so on until one learning rate is left, which continues to the full budget;
then the other seeds of that learning rate run the full budget. Rung ``j`` of ``R`` ends at
``steps / eta**(R - j)`` (down to a multiple of ``val_every``, so a rung ends on a validation
point). A survivor continues its run from the rung's checkpoint under the schedule of the full
budget (:mod:`vitplasticity.finetune.rungs`): its final numbers are those of the same run in
the full grid, so the paused steps are not paid twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from vitplasticity.workflow.runtime import FINETUNE_EVAL_FACTOR, image_seconds

BASELINES: tuple[str, ...] = ("head", "full", "lora")
"""Verified beside the recommender's picks: head only (the linear probe), every parameter,
and LoRA on the attention linears (rank ``finetune.lora.rank``, 8 in the paper)."""


@dataclass(frozen=True)
class Candidate:
    """A configuration to verify and why it is verified (every reason that picked it)."""

    configuration: str
    reasons: tuple[str, ...]


def candidates(
    ranks: Iterable[Mapping[str, Any]],
    criterion: str,
    top_k: int,
    baselines: Sequence[str] = BASELINES,
) -> list[Candidate]:
    """The configurations to verify, from recommend's ranking: the ``top_k`` of
    ``criterion``, the ``baselines``, and each criterion's first pick; each once, in that
    order, with every reason that picked it.

    Args:
        ranks: rows with ``configuration``, ``criterion`` and ``rank`` (1 = finetune first;
            None where the criterion cannot rank the configuration), as in
            ``results/recommend/<model>/<dataset>.parquet``.
        criterion: the criterion whose top ``top_k`` are verified.
        top_k: how many of its configurations (>= 1).
        baselines: configurations verified whatever the ranking says.

    Raises:
        ValueError: ``top_k`` < 1, or ``criterion`` is not in ``ranks`` (naming those that are).
    """
    if top_k < 1:
        raise ValueError(f"recommend.verify.top_k: must be >= 1, got {top_k}")
    by_criterion: dict[str, list[tuple[int, str]]] = {}
    for row in ranks:
        ranked = by_criterion.setdefault(row["criterion"], [])
        if row["rank"] is not None:
            ranked.append((int(row["rank"]), row["configuration"]))
    if criterion not in by_criterion:
        known = ", ".join(sorted(by_criterion)) or "none"
        raise ValueError(
            f"recommend.verify.criterion: {criterion!r} is not in the ranking (it has: {known})"
        )
    reasons: dict[str, list[str]] = {}

    def pick(configuration: str, reason: str) -> None:
        reasons.setdefault(configuration, []).append(reason)

    for rank, configuration in sorted(by_criterion[criterion])[:top_k]:
        pick(configuration, f"{criterion} rank {rank}")
    for configuration in baselines:
        pick(configuration, "baseline")
    for name in sorted(by_criterion):
        if by_criterion[name]:
            pick(min(by_criterion[name])[1], f"{name} first pick")
    return [Candidate(c, tuple(why)) for c, why in reasons.items()]


def rung_steps(steps: int, val_every: int, n_lrs: int, eta: int = 2) -> list[int]:
    """The last step of every rung, the full budget last: ``steps / eta**(R - j)`` for rung
    ``j`` of ``R = ceil(log_eta(n_lrs))`` halvings, down to a multiple of ``val_every``.

    A rung that would end before the first validation point, or where the one before it
    ends, is left out (too short a budget to halve it so often).

    Raises:
        ValueError: ``eta`` < 2, or ``steps``, ``val_every`` or ``n_lrs`` < 1.
    """
    if eta < 2:
        raise ValueError(f"recommend.verify.eta: must be >= 2, got {eta}")
    if min(steps, val_every, n_lrs) < 1:
        raise ValueError("steps, val_every and the number of learning rates must be >= 1")
    halvings = _halvings(n_lrs, eta)
    ends: list[int] = []
    for j in range(halvings):
        end = (steps // eta ** (halvings - j)) // val_every * val_every
        if end >= val_every and (not ends or end > ends[-1]) and end < steps:
            ends.append(end)
    return [*ends, steps]


def _halvings(n: int, eta: int) -> int:
    """The smallest R with n / eta**R <= 1."""
    halvings = 0
    while math.ceil(n / eta**halvings) > 1:
        halvings += 1
    return halvings


def survivors_at(n_lrs: int, n_rungs: int, eta: int = 2) -> list[int]:
    """How many learning rates run in each rung (the first: all of them; the last: one).

    Rungs left out by :func:`rung_steps` compress the schedule: the cut of the leftover
    halvings happens at the last rung before the full budget.
    """
    counts = [max(1, math.ceil(n_lrs / eta**j)) for j in range(n_rungs)]
    counts[-1] = 1
    return counts


@dataclass(frozen=True)
class Decision:
    """A rung's decision for one configuration: which learning rates continue, and why."""

    configuration: str
    rung_step: int
    keep: tuple[float, ...]
    dropped: tuple[float, ...]
    scores: dict[float, float | None]  # best val accuracy up to the rung; None: diverged

    def record(self) -> dict[str, Any]:
        """The decision as the small JSON file a rung writes."""
        order = ", ".join(_score_text(lr, self.scores[lr]) for lr in (*self.keep, *self.dropped))
        return {
            "configuration": self.configuration,
            "rung_step": self.rung_step,
            "continue": list(self.keep),
            "stop": list(self.dropped),
            "best_val_accuracy": {repr(lr): score for lr, score in self.scores.items()},
            "why": f"best validation accuracy up to step {self.rung_step}, "
            f"the best {len(self.keep)} continue (ties: the smaller lr): {order}",
        }


def _score_text(lr: float, score: float | None) -> str:
    return f"lr {lr!r}: " + ("diverged" if score is None else f"{score:.4f}")


def decide(
    configuration: str, rung_step: int, scores: Mapping[float, float | None], keep: int
) -> Decision:
    """Keep the ``keep`` learning rates with the highest best validation accuracy up to
    ``rung_step`` (a diverged run, None, ranks last; ties keep the smaller lr).

    Raises:
        ValueError: ``keep`` is not between 1 and the number of learning rates.
    """
    if not 1 <= keep <= len(scores):
        raise ValueError(f"keep {keep} of {len(scores)} learning rates")
    order = sorted(scores, key=lambda lr: (scores[lr] is None, -(scores[lr] or 0.0), lr))
    return Decision(
        configuration, rung_step, tuple(order[:keep]), tuple(order[keep:]), dict(scores)
    )


@dataclass(frozen=True)
class Compute:
    """Optimizer steps of a verification and of the full grid it stands in for."""

    verify_steps: int
    grid_steps: int

    @property
    def share(self) -> Fraction:
        """The verification's steps over the grid's."""
        return Fraction(self.verify_steps, self.grid_steps)

    def gpu_hours(self, batch_size: int, timm_id: str, precision: str) -> tuple[Fraction, Fraction]:
        """(verification, grid) GPU-hours by the runtime model
        (:mod:`vitplasticity.workflow.runtime`: training FLOPs over a sustained throughput,
        +30% for evaluation; no start-up allowance)."""
        per_step = FINETUNE_EVAL_FACTOR * batch_size * image_seconds(timm_id, precision) / 3600
        return self.verify_steps * per_step, self.grid_steps * per_step


def configuration_steps(steps: int, val_every: int, n_lrs: int, n_seeds: int, eta: int = 2) -> int:
    """Optimizer steps that verifying one configuration takes: the rungs of the first seed
    (a survivor pays only the steps past its last rung) and the full budget of each other
    seed of the best learning rate."""
    ends = rung_steps(steps, val_every, n_lrs, eta)
    counts = survivors_at(n_lrs, len(ends), eta)
    done, total = 0, 0
    for end, count in zip(ends, counts, strict=True):
        total += count * (end - done)
        done = end
    return total + (n_seeds - 1) * steps


def compute(
    n_verified: int,
    n_grid: int,
    steps: int,
    val_every: int,
    n_lrs: int,
    n_seeds: int,
    eta: int = 2,
) -> Compute:
    """The steps of verifying ``n_verified`` configurations beside those of the full grid of
    ``n_grid`` configurations x ``n_lrs`` learning rates x ``n_seeds`` seeds."""
    per_configuration = configuration_steps(steps, val_every, n_lrs, n_seeds, eta)
    return Compute(n_verified * per_configuration, n_grid * n_lrs * n_seeds * steps)
