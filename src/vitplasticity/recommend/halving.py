"""Successive halving over the learning rates of a budgeted verification (recommend-verify,
and the workflow's verify rules): the rungs, how many learning rates each keeps, each rung's
decision and its file, and the compute spent beside the full grid's. Torch-free (the
Snakefile imports it).

Successive halving, per configuration: every learning rate runs with the first seed to the
first rung's step; the better ``1/eta`` (by best validation accuracy so far) continue to the
next rung, and so on until one learning rate is left, which continues to the full budget;
then the other seeds of that learning rate run the full budget. Rung ``j`` of ``R`` ends at
``steps / eta**(R - j)`` (down to a multiple of ``val_every``, so a rung ends on a validation
point). A survivor continues its run from the rung's checkpoint under the schedule of the full
budget (:mod:`vitplasticity.finetune.rungs`): its final numbers are those of the same run in
the full grid, so the paused steps are not paid twice.

Each decision is taken once, from the runs' rung records (:func:`decide_rung`: by the CLI's
loop, or the workflow's ``verify_decision`` job), and written as
``<configuration>/decision_step<s>.json`` (:func:`decision_name`) in the verification's folder;
the verified report reads the decisions back (:func:`read_decision`), never takes them again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from vitplasticity.utils.io import read_json, unreadable


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


@dataclass(frozen=True)
class HalvingKeys:
    """What a halving problem names its inputs by: the CLI's flags (:data:`CLI_KEYS`) or the
    workflow config's keys (``datasets.<name>.steps``, ``recommend.verify.eta``, ...)."""

    steps: str
    val_every: str
    lrs: str
    eta: str


CLI_KEYS = HalvingKeys("--steps", "--val-every", "--lrs", "--eta")
"""recommend-verify's flags."""


def halving_problems(
    steps: int, val_every: int, lrs: Sequence[float], eta: int, keys: HalvingKeys = CLI_KEYS
) -> list[str]:
    """What makes successive halving over ``lrs`` impossible, each problem one line naming its
    key (empty when it can run): the one check of recommend-verify (``check_plan``) and of the
    workflow's ``recommend.verify`` (``verify_problems``), so both refuse the same shapes.

    A shape is refused when ``eta`` < 2, a learning rate is not > 0 or is given twice (it
    would be halved against itself), or the budget leaves no rung before the full budget for
    more than one learning rate: the first rung must end on a validation point, so ``steps``
    must be at least ``eta * val_every``.
    """
    if eta < 2:
        return [f"{keys.eta}: must be >= 2, got {eta}"]
    if not lrs:
        return [f"{keys.lrs}: no learning rate"]
    bad = [lr for lr in lrs if not lr > 0]
    if bad:
        return [f"{keys.lrs}: every learning rate must be > 0, got {bad}"]
    twice = sorted({lr for lr in lrs if list(lrs).count(lr) > 1})
    if twice:
        return [
            f"{keys.lrs}: {', '.join(map(repr, twice))} given more than once (each would be "
            "halved against itself): give each learning rate once"
        ]
    if len(lrs) > 1 and min(steps, val_every) >= 1 and steps < eta * val_every:
        return [
            f"{keys.steps}: {steps} steps are too short to halve {len(lrs)} learning rates "
            f"({keys.lrs}) with {keys.eta} {eta}: no rung ends on a validation point "
            f"({keys.val_every} {val_every}) before the full budget; give at least "
            f"{eta * val_every} steps, a smaller {keys.val_every} or {keys.eta}, or one "
            "learning rate"
        ]
    return []


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
    # The step each learning rate's run reached by the rung (a diverged run stops earlier):
    # the steps the verification spent, which its report counts.
    final_steps: dict[float, int] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The decision as the small JSON file a rung writes (:func:`decision_name`)."""
        order = ", ".join(_score_text(lr, self.scores[lr]) for lr in (*self.keep, *self.dropped))
        return {
            "configuration": self.configuration,
            "rung_step": self.rung_step,
            "continue": list(self.keep),
            "stop": list(self.dropped),
            "best_val_accuracy": {repr(lr): score for lr, score in self.scores.items()},
            "final_step": {repr(lr): step for lr, step in self.final_steps.items()},
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


def rung_score(record: Mapping[str, Any]) -> float | None:
    """A run's score at a rung, from its rung record (or the summary of a run that ended
    before the rung): its best validation accuracy so far; None when it diverged."""
    return None if record.get("status") == "diverged" else record["best_val_accuracy"]


def decide_rung(
    configuration: str, rung_step: int, records: Mapping[float, Mapping[str, Any]], keep: int
) -> Decision:
    """The decision of the rung ending at ``rung_step``, from the record of every learning
    rate still in (:func:`decide` over their :func:`rung_score`).

    Raises:
        ValueError: ``keep`` is not between 1 and the number of learning rates.
    """
    scores = {lr: rung_score(record) for lr, record in records.items()}
    decision = decide(configuration, rung_step, scores, keep)
    final_steps = {lr: int(record["final_step"]) for lr, record in records.items()}
    return replace(decision, final_steps=final_steps)


def decision_name(rung_step: int | str) -> str:
    """The file name of the decision of the rung ending at ``rung_step``, in the
    configuration's folder of the verification (a run paused there holds its own record,
    ``rung_step<s>.json``): one name for recommend-verify's and the workflow's decisions."""
    return f"decision_step{rung_step}.json"


def decision_path(folder: str | Path, configuration: str, rung_step: int) -> Path:
    """Where the decision of ``configuration``'s rung ending at ``rung_step`` is, in the
    verification's ``folder``."""
    return Path(folder) / configuration / decision_name(rung_step)


def read_decision(path: str | Path) -> dict[str, Any]:
    """A decision :class:`Decision.record` wrote, with its learning rates as floats.

    Raises:
        FileNotFoundError: no file at ``path`` (a rung not decided yet).
        UnreadableFileError: not JSON, or a decision without its scores or steps.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"{path}: this rung is not decided yet (recommend-verify, or the workflow's "
            "verify_decision job, writes it)"
        )
    record = read_json(path)
    for key in ("best_val_accuracy", "final_step"):
        if not isinstance(record.get(key), dict):
            raise unreadable(path, f"not a rung decision (no {key!r} by learning rate)")
        record[key] = {float(lr): value for lr, value in record[key].items()}
    return record


@dataclass(frozen=True)
class Compute:
    """Optimizer steps of a verification and of the full grid it stands in for."""

    verify_steps: int
    grid_steps: int

    @property
    def share(self) -> Fraction:
        """The verification's steps over the grid's."""
        return Fraction(self.verify_steps, self.grid_steps)

    def gpu_hours(self, step_seconds: Fraction) -> tuple[Fraction, Fraction]:
        """(verification, grid) GPU-hours at ``step_seconds`` a step (the workflow's runtime
        model gives it, ``finetune_step_seconds``)."""
        return self.verify_steps * step_seconds / 3600, self.grid_steps * step_seconds / 3600


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
