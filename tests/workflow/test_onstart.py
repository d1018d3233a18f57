"""vitplasticity.workflow.onstart: the checks a run makes once its executor is known."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from vitplasticity.workflow.onstart import advise_gpu_resources


def test_a_local_run_on_two_gpus_is_told_how_to_use_both(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with caplog.at_level(logging.INFO):
        advise_gpu_resources(SimpleNamespace(local_exec=True, global_resources={}))
    assert "--resources gpu=2" in caplog.text
    caplog.clear()
    for told in ({"gpu": 2}, None):
        workflow = SimpleNamespace(local_exec=told is not None, global_resources=told or {})
        with caplog.at_level(logging.INFO):
            advise_gpu_resources(workflow)
    assert caplog.text == ""  # given, or not a local run
