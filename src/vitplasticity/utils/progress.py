"""Progress of a long loop (the plasticity and bounds stages): a bar on a terminal, log lines
in a job's log file."""

from __future__ import annotations

import logging
import sys
from typing import Self

log = logging.getLogger(__name__)


class ProgressReporter:
    """Progress of a long loop: a tqdm bar on a terminal, else a log line every ~10%.

    A context manager: leaving the ``with`` block closes the bar, however it is left.
    """

    def __init__(self, total: int, description: str) -> None:
        self.total, self.description = total, description
        self._next_tenth = 1  # an int: summing 0.1s drifts (0.1 * 3 > 0.3) and skips a line
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=description, unit="pair")

    def __call__(self, done: int) -> None:
        """Report that ``done`` of the ``total`` items are done."""
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            return
        if 10 * done >= self._next_tenth * self.total or done == self.total:
            log.info(
                "%s: %d/%d (%.0f%%)", self.description, done, self.total, 100 * done / self.total
            )
            while self._next_tenth * self.total <= 10 * done:
                self._next_tenth += 1

    def close(self) -> None:
        """Close the bar (nothing to do for log lines)."""
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
