"""How `make test` spreads the suite over pytest-xdist workers (``-n 3 --dist loadfile``).

Each test file goes to one worker, as xdist's loadfile does, except the files of the local
SLURM (``test_slurm*.py``): they form one unit, so that one worker runs them one after
another. They share one node with a few stand-in GPUs, and their checks read the cluster's
queue and accounting by the jobs they submitted; two of them at once would queue behind each
other's jobs and race their time limits. The SLURM unit goes out first (it is the longest:
about a third of the suite, mostly waiting on SLURM), then the files with slow tests, then the
rest, so that no worker is left with a long file at the end.

A test marked ``slurm`` outside a ``test_slurm*.py`` file would escape the unit: collection
refuses it, naming the test.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from xdist.scheduler import LoadFileScheduling

SLURM_FILE_PREFIX = "test_slurm"
SLURM_UNIT = "local SLURM"


def is_slurm_file(path: str) -> bool:
    """Whether the test file at ``path`` (relative, as in a node id) runs on the local SLURM."""
    return PurePosixPath(path).name.startswith(SLURM_FILE_PREFIX)


class SlurmApartScheduling(LoadFileScheduling):
    """xdist's loadfile, with every ``test_slurm*.py`` file in one unit, in collection order."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        # Keep the order the collection hook below gives (SLURM first, slow files next); xdist
        # would otherwise sort the units by their number of tests.
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return SLURM_UNIT if is_slurm_file(path) else path


def order_for_workers(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: SLURM files, then files with a ``slow`` test, then the rest
    (stable: the collection order within each).

    Raises:
        pytest.UsageError: naming a test marked ``slurm`` that lives outside a SLURM file.
    """
    misplaced = [
        item.nodeid
        for item in items
        if item.get_closest_marker("slurm") and not is_slurm_file(item.nodeid.split("::")[0])
    ]
    if misplaced:
        raise pytest.UsageError(
            f"tests marked slurm must live in a {SLURM_FILE_PREFIX}*.py file (one xdist unit, "
            f"tests/helpers/xdist_scopes.py): {', '.join(misplaced)}"
        )
    slow_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        if is_slurm_file(path):
            return 0
        return 1 if path in slow_files else 2

    items.sort(key=rank)
