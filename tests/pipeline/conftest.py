"""The pipeline tests' shared fixture: the local SLURM of tests/helpers/slurm_harness.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.helpers.slurm_harness import LocalSlurm, why_no_slurm


@pytest.fixture(scope="module")
def local_slurm() -> Iterator[LocalSlurm]:
    """A running local SLURM for the module; stopped afterwards if started here. CI must have
    one (.ci/run starts it): there a missing cluster fails the test instead of skipping it."""
    reason = why_no_slurm()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SLURM tests, but: {reason}")
        pytest.skip(reason)
    cluster = LocalSlurm()
    cluster.start()
    yield cluster
    cluster.stop()
