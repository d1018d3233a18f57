"""vitplasticity.workflow.onstart: the checks a run makes once its executor is known."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from snakemake.exceptions import WorkflowError

from vitplasticity.workflow.onstart import (
    PACKS_ON_A_CLUSTER,
    advise_gpu_resources,
    refuse_packs_on_a_cluster,
)


def test_packs_are_refused_under_a_cluster_executor_only() -> None:
    refuse_packs_on_a_cluster(SimpleNamespace(local_exec=True))
    with pytest.raises(
        WorkflowError, match=r"finetune\.pack_runs: true packs runs for one machine"
    ):
        refuse_packs_on_a_cluster(SimpleNamespace(local_exec=False))
    assert "slurm/profile.yaml" in PACKS_ON_A_CLUSTER and "pack_runs: false" in PACKS_ON_A_CLUSTER


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
