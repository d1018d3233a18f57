"""ProgressReporter: log lines every ~10% off a terminal; the bar closes however a loop ends."""

from __future__ import annotations

import logging

import pytest

from vitplasticity.utils.progress import ProgressReporter


class Bar:
    """Stands in for the tqdm bar a terminal would get (the test's stderr is no terminal)."""

    n = 0
    closed = False

    def update(self, step: int) -> None:
        self.n += step

    def close(self) -> None:
        self.closed = True


def test_leaving_the_block_closes_the_bar_also_on_an_error() -> None:
    bar = Bar()
    with pytest.raises(RuntimeError), ProgressReporter(10, "loop") as progress:
        progress._bar = bar
        progress(4)
        raise RuntimeError("the loop failed")
    assert bar.n == 4 and bar.closed


def test_log_lines_every_tenth(caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.INFO, logger="vitplasticity.utils.progress"),
        ProgressReporter(100, "pairs") as progress,
    ):
        for done in range(5, 101, 5):
            progress(done)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"pairs: {n}/100 ({n}%)" for n in range(10, 101, 10)]
