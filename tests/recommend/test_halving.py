"""The plan of a budgeted verification: which configurations, which rungs, which learning
rates continue, and its compute beside the full grid's."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from vitplasticity.recommend.halving import (
    compute,
    configuration_steps,
    decide,
    decide_rung,
    decision_path,
    halving_problems,
    read_decision,
    rung_steps,
    survivors_at,
)
from vitplasticity.recommend.verify_plan import candidates, read_candidates, write_candidates
from vitplasticity.utils.io import write_json
from vitplasticity.workflow import runtime


def ranking(table: dict[str, list[str | None]]) -> list[dict]:
    """Rows as recommend's parquet holds them: ``table[criterion]`` lists configurations in
    rank order; None marks a configuration the criterion cannot rank (rank None)."""
    rows = []
    for criterion, order in table.items():
        for rank, configuration in enumerate(order, start=1):
            if configuration is None:
                continue
            rows.append({"criterion": criterion, "configuration": configuration, "rank": rank})
    rows.append({"criterion": "nfn", "configuration": "ln1", "rank": None})
    return rows


def test_candidates_are_the_top_k_the_baselines_and_every_first_pick_each_once() -> None:
    rows = ranking(
        {
            "plasticity": ["mha", "fc1", "ln1", "fc2"],
            "rgn": ["ln2", "mha", "fc1", "fc2"],
            "nfn": ["fc2", "fc1", "mha"],
        }
    )
    chosen = candidates(rows, "plasticity", top_k=2)
    assert [c.configuration for c in chosen] == ["mha", "fc1", "head", "full", "lora", "fc2", "ln2"]
    reasons = {c.configuration: c.reasons for c in chosen}
    assert reasons["mha"] == ("plasticity rank 1", "plasticity first pick")
    assert reasons["fc2"] == ("nfn first pick",)
    assert reasons["head"] == ("baseline",)


def test_candidates_refuse_an_unknown_criterion_and_a_top_k_below_one() -> None:
    rows = ranking({"plasticity": ["mha"]})
    with pytest.raises(ValueError, match=r"'snr' is not in the ranking \(it has: nfn, plasticity"):
        candidates(rows, "snr", top_k=1)
    with pytest.raises(ValueError, match="top_k: must be >= 1, got 0"):
        candidates(rows, "plasticity", top_k=0)


@pytest.mark.parametrize(
    ("steps", "val_every", "n_lrs", "eta", "ends", "counts"),
    [
        (10_000, 500, 4, 2, [2500, 5000, 10_000], [4, 2, 1]),  # the paper's shape
        (10_000, 500, 3, 2, [2500, 5000, 10_000], [3, 2, 1]),
        (10_000, 500, 4, 4, [2500, 10_000], [4, 1]),
        (10_000, 300, 4, 2, [2400, 4800, 10_000], [4, 2, 1]),  # down to a validation point
        (48, 12, 2, 2, [24, 48], [2, 1]),  # the demo
        (48, 12, 8, 2, [12, 24, 48], [8, 4, 1]),  # 48/8 has no validation point: left out
        (48, 12, 1, 2, [48], [1]),  # one learning rate: no rung
    ],
)
def test_rungs_end_on_validation_points_and_halve_the_learning_rates(
    steps: int, val_every: int, n_lrs: int, eta: int, ends: list[int], counts: list[int]
) -> None:
    assert rung_steps(steps, val_every, n_lrs, eta) == ends
    assert survivors_at(n_lrs, len(ends), eta) == counts


def test_exactly_the_budgets_that_leave_no_rung_are_refused() -> None:
    # Every shape of a small grid: the check refuses a budget where rung_steps finds no rung
    # before the full budget for more than one learning rate, and only there.
    for steps in range(1, 60):
        for val_every in range(1, 25):
            for n_lrs in range(1, 7):
                for eta in range(2, 5):
                    lrs = [0.001 * (i + 1) for i in range(n_lrs)]
                    refused = bool(halving_problems(steps, val_every, lrs, eta))
                    no_rung = n_lrs > 1 and rung_steps(steps, val_every, n_lrs, eta) == [steps]
                    assert refused == no_rung, (steps, val_every, n_lrs, eta)


def simulated_steps(steps: int, val_every: int, n_lrs: int, n_seeds: int, eta: int) -> int:
    """Successive halving played out run by run: each learning rate's run reaches the end of
    the last rung it took part in; every other seed trains the full budget."""
    reach = dict.fromkeys(range(n_lrs), 0)
    alive = list(range(n_lrs))
    for end, count in zip(
        rung_steps(steps, val_every, n_lrs, eta),
        survivors_at(n_lrs, len(rung_steps(steps, val_every, n_lrs, eta)), eta),
        strict=True,
    ):
        alive = alive[:count]
        for lr in alive:
            reach[lr] = end
    return sum(reach.values()) + (n_seeds - 1) * steps


@pytest.mark.parametrize(
    ("steps", "val_every", "n_lrs", "n_seeds", "eta"),
    [(10_000, 500, 4, 3, 2), (10_000, 500, 5, 3, 2), (48, 12, 2, 1, 2), (20_000, 500, 6, 2, 3)],
)
def test_a_configuration_s_steps_equal_its_runs_played_out(
    steps: int, val_every: int, n_lrs: int, n_seeds: int, eta: int
) -> None:
    assert configuration_steps(steps, val_every, n_lrs, n_seeds, eta) == simulated_steps(
        steps, val_every, n_lrs, n_seeds, eta
    )


def test_the_paper_s_shape_costs_a_third_of_a_configuration_s_grid() -> None:
    # 4 LRs x 3 seeds x 10,000 steps: 4 x 2,500 + 2 x 2,500 + 5,000 for seed 0, 2 x 10,000
    # for the others; the grid trains 12 x 10,000.
    assert configuration_steps(10_000, 500, 4, 3) == 40_000
    spent = compute(7, 7, 10_000, 500, 4, 3)
    assert (spent.verify_steps, spent.grid_steps) == (280_000, 840_000)
    assert spent.share == Fraction(1, 3)
    step_seconds = runtime.finetune_step_seconds(512, "vit_base_patch16_224.orig_in21k", "fp32")
    hours, grid_hours = spent.gpu_hours(step_seconds)
    per_step = Fraction(13, 10) * 512 * Fraction(105_147_150_336, 10**9) / (1000 * 14) / 3600
    assert (hours, grid_hours) == (280_000 * per_step, 840_000 * per_step)
    assert runtime.image_seconds("vit_base_patch16_224", "fp32") == Fraction(
        105_147_150_336, 14 * 10**12
    )


def test_a_decision_keeps_the_best_and_says_why() -> None:
    scores = {0.001: 0.5, 0.003: 0.75, 0.01: None, 0.03: 0.75}
    decision = decide("mha", 2500, scores, keep=2)
    assert decision.keep == (0.003, 0.03)  # tie at 0.75: the smaller lr first
    assert decision.dropped == (0.001, 0.01)  # diverged last
    record = json.loads(json.dumps(decision.record()))
    assert record["continue"] == [0.003, 0.03] and record["stop"] == [0.001, 0.01]
    assert record["best_val_accuracy"]["0.01"] is None
    assert "lr 0.01: diverged" in record["why"] and "step 2500" in record["why"]
    with pytest.raises(ValueError, match="keep 5 of 4"):
        decide("mha", 2500, scores, keep=5)


def test_a_rung_is_decided_from_its_records_and_read_back_from_its_file(tmp_path: Path) -> None:
    # The records of three runs at the rung ending at step 6: one diverged at step 4.
    records = {
        0.01: {"rung_step": 6, "status": "paused", "final_step": 6, "best_val_accuracy": 0.5},
        0.1: {"rung_step": 6, "status": "paused", "final_step": 6, "best_val_accuracy": 0.625},
        1.0: {"rung_step": 6, "status": "diverged", "final_step": 4, "best_val_accuracy": 0.9},
    }
    decision = decide_rung("mha", 6, records, keep=1)
    assert decision.keep == (0.1,) and decision.dropped == (0.01, 1.0)
    assert decision.scores == {0.01: 0.5, 0.1: 0.625, 1.0: None}
    path = decision_path(tmp_path, "mha", 6)
    assert path == tmp_path / "mha" / "decision_step6.json"
    write_json(path, decision.record())
    back = read_decision(path)
    assert back["continue"] == [0.1] and back["stop"] == [0.01, 1.0]
    assert back["final_step"] == {0.01: 6, 0.1: 6, 1.0: 4}
    assert back["best_val_accuracy"] == {0.01: 0.5, 0.1: 0.625, 1.0: None}


def test_candidates_are_written_and_read_back_in_order(tmp_path: Path) -> None:
    chosen = candidates(ranking({"plasticity": ["mha", "fc1"], "rgn": ["ln2"]}), "plasticity", 1)
    write_candidates(tmp_path / "candidates.json", chosen)
    assert read_candidates(tmp_path / "candidates.json") == chosen
    with pytest.raises(FileNotFoundError, match="no candidates"):
        read_candidates(tmp_path / "none.json")


def test_a_file_that_is_no_decision_is_refused_naming_it(tmp_path: Path) -> None:
    path = decision_path(tmp_path, "mha", 6)
    write_json(path, {"continue": [0.1], "stop": [0.01], "best_val_accuracy": {"0.1": 0.5}})
    with pytest.raises(
        ValueError, match=r"decision_step6\.json: not a rung decision \(no 'final_step'"
    ):
        read_decision(path)
