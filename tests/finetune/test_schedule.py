"""The warmup + cosine schedule against its formula, evaluated independently here."""

from __future__ import annotations

import numpy as np
import pytest

from vitplasticity.finetune.schedule import warmup_cosine_lr


def reference_lr(step: int, base: float, warmup: int, total: int) -> float:
    """The schedule written out in float64 with numpy, piece by piece."""
    if step < warmup:
        return float(np.float64(base) * step / warmup)
    progress = np.float64(step - warmup) / max(1, total - warmup)
    return float(base * max(0.0, 0.5 * (1.0 + np.cos(np.pi * progress))))


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, 0.0),  # warmup starts from 0
        (500, 0.0025),  # a quarter of the warmup
        (1000, 0.005),
        (1999, 0.01 * 1999 / 2000),
        (2000, 0.01),  # peak at the end of the warmup
        (6000, 0.005),  # half-way through the cosine: half the peak
        (10000, 0.0),  # the end: 0
    ],
)
def test_paper_schedule_at_chosen_steps(step: int, expected: float) -> None:
    # docs/protocol.md: 2,000 warmup steps, 10,000 steps (cifar), here with LR 0.01.
    assert warmup_cosine_lr(step, 0.01, 2000, 10000) == pytest.approx(expected, abs=1e-15)


def test_cosine_part_matches_formula() -> None:
    steps = [2000, 2001, 3000, 4000, 5555, 8000, 9999]
    got = [warmup_cosine_lr(s, 0.03, 2000, 10000) for s in steps]
    want = [reference_lr(s, 0.03, 2000, 10000) for s in steps]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # 3/4 of the way through the cosine: (1 + cos(3 pi / 4)) / 2 of the peak.
    assert warmup_cosine_lr(8000, 0.03, 2000, 10000) == pytest.approx(
        0.03 * (1 - np.sqrt(0.5)) / 2, rel=1e-12
    )


def test_schedule_is_monotone_up_then_down() -> None:
    values = np.array([warmup_cosine_lr(s, 1.0, 8, 48) for s in range(48)])
    assert np.all(np.diff(values[:9]) > 0)
    assert np.all(np.diff(values[8:]) < 0)
    assert values[-1] > 0  # the last update is just above 0; 0 is reached at step 48


def test_no_warmup_and_warmup_longer_than_run() -> None:
    assert warmup_cosine_lr(0, 0.1, 0, 100) == pytest.approx(0.1)
    assert warmup_cosine_lr(50, 0.1, 0, 100) == pytest.approx(0.05)
    # A warmup longer than the run never reaches the peak.
    assert warmup_cosine_lr(9, 0.1, 20, 10) == pytest.approx(0.1 * 9 / 20)


@pytest.mark.parametrize(("step", "warmup", "total"), [(-1, 2, 10), (0, -1, 10), (0, 2, 0)])
def test_bad_arguments_raise(step: int, warmup: int, total: int) -> None:
    with pytest.raises(ValueError, match="schedule needs"):
        warmup_cosine_lr(step, 0.1, warmup, total)
