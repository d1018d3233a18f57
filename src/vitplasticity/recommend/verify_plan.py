"""What a budgeted verification verifies and how: the candidates, the configurations taken
from recommend's ranking (:func:`candidates`, written as ``candidates.json``), and
:class:`VerifyPlan`, read by the verification (:mod:`.verification`) and recorded with its
export (:mod:`.verification_record`). Torch-free (the Snakefile imports it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitplasticity.utils.io import read_json, write_json

BASELINES: tuple[str, ...] = ("head", "full", "lora")
"""Verified beside the recommender's picks: head only (the linear probe), every parameter,
and LoRA on the attention linears (rank ``finetune.lora.rank``, 8 in the paper)."""

VERIFIED_FORMATS: tuple[str, ...] = ("md", "parquet", "png", "json")
"""The verified report's files, ``PREFIX_verified.<format>`` (the last the export)."""

CANDIDATES_NAME = "candidates.json"
"""The candidates' file in a verification's folder (the CLI's ``--runs-dir``, the workflow's
``<results>/verify/<model>/<dataset>``)."""


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
    baselines: tuple[str, ...] = BASELINES


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


def write_candidates(path: str | Path, chosen: Sequence[Candidate]) -> None:
    """Write the candidates, in order, each with its reasons, as JSON."""
    write_json(
        path, [{"configuration": c.configuration, "reasons": list(c.reasons)} for c in chosen]
    )


def read_candidates(path: str | Path) -> list[Candidate]:
    """The candidates :func:`write_candidates` wrote at ``path``.

    Raises:
        FileNotFoundError: no file at ``path`` (naming what writes it).
    """
    if not Path(path).is_file():
        raise FileNotFoundError(
            f"{path}: no candidates (written by vitplasticity verify-candidates or "
            "recommend-verify)"
        )
    return [Candidate(row["configuration"], tuple(row["reasons"])) for row in read_json(path)]
