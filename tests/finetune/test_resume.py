"""Resume: a run stopped by SIGTERM or killed by SIGKILL continues from its checkpoint and
ends bit-identical (on CPU) to an uninterrupted run."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch

from tests.helpers.tiny_finetune import settings_for
from vitplasticity import cli
from vitplasticity.finetune.checkpoint import load_checkpoint, save_checkpoint
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.finetune.outputs import TIMING_FIELDS
from vitplasticity.finetune.train import train
from vitplasticity.models.spec import TimmSpec

STEPS = 24
# Fields a resumed run may differ in: timing, when, and the resumed flag itself.
VOLATILE = (*TIMING_FIELDS, "created", "resumed")


# One intra-op thread per module (conftest.py: tiny models run fastest so).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def resume_settings(spec: TimmSpec, optimizer: str) -> FinetuneSettings:
    """A run of two components long enough for several checkpoints (every 4 of 24 steps)."""
    return settings_for(
        spec,
        experiment="resume",
        configuration="mha+fc2",
        optimizer=optimizer,
        lr=0.05 if optimizer == "sgd" else 1e-3,
        seed=3,
        steps=STEPS,
        val_every=6,
        warmup_steps=5,
        log_every=5,
        checkpoint_every=4,
    )


def cli_args(settings: FinetuneSettings, dataset: Path, out: Path) -> list[str]:
    """The CLI flags that give ``settings`` (as the finetune rule passes them)."""
    fields = settings.record()
    betas = fields.pop("adam_betas")
    fields.pop("demo")
    fields["model_spec"] = json.dumps(fields["model_spec"])
    argv = ["finetune", "--dataset-dir", str(dataset), "--out-dir", str(out)]
    argv += ["--adam-betas", *map(str, betas)]
    for key, value in fields.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


@pytest.fixture(scope="module")
def reference_runs(
    demo_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[dict[str, Any], pl.DataFrame]]:
    """Uninterrupted runs (SGD and AdamW): their summaries and metrics."""
    from tests.helpers.tiny_vit import TINY_SPEC

    out: dict[str, tuple[dict[str, Any], pl.DataFrame]] = {}
    for optimizer in ("sgd", "adamw"):
        folder = tmp_path_factory.mktemp(f"reference-{optimizer}")
        settings = resume_settings(TINY_SPEC, optimizer)
        summary = train(settings.run, settings.training, demo_dataset, folder)
        out[optimizer] = (summary, pl.read_parquet(folder / "metrics.parquet"))
    return out


@pytest.fixture
def sigterm_guard() -> Iterator[None]:
    """Ignore a SIGTERM that would arrive after the run restored the default handler."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGTERM, previous)


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run exited ({process.returncode}) before {path} appeared")
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.002)


def assert_same_as_reference(
    out: Path, summary: dict[str, Any], reference: tuple[dict[str, Any], pl.DataFrame]
) -> None:
    ref_summary, ref_metrics = reference
    metrics = pl.read_parquet(out / "metrics.parquet")
    # Bitwise: polars' equals compares floats exactly.
    assert metrics.equals(ref_metrics)
    assert len(metrics.filter(pl.col("kind") == "val")) == STEPS // 6
    strip = lambda s: {k: v for k, v in s.items() if k not in VOLATILE}  # noqa: E731
    assert strip(summary) == strip(ref_summary)
    assert summary["resumed"] is True and ref_summary["resumed"] is False
    assert not (out / "checkpoint.pt").exists()


def test_sigterm_writes_a_checkpoint_and_the_run_resumes_bitwise(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, reference_runs, sigterm_guard
) -> None:
    settings = resume_settings(tiny_spec, "adamw")
    out = tmp_path / "run"
    checkpoint = out / "checkpoint.pt"

    returned = threading.Event()

    def preempt() -> None:  # what SLURM does before preemption
        while not checkpoint.exists():
            if returned.is_set():  # the run ended (or failed) first: the assertions say so
                return
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=preempt)
    killer.start()
    try:
        code = cli.main(cli_args(settings, demo_dataset, out))
    finally:
        returned.set()
        killer.join()
    assert code == 143
    assert checkpoint.exists() and not (out / "summary.json").exists()
    state = torch.load(checkpoint, weights_only=True)
    assert 4 <= state["step"] < STEPS

    summary = train(settings.run, settings.training, demo_dataset, out)
    assert_same_as_reference(out, summary, reference_runs["adamw"])


def test_sigkill_then_rerun_continues_bitwise(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, reference_runs
) -> None:
    settings = resume_settings(tiny_spec, "sgd")
    out = tmp_path / "run"
    # The same thread count as this process: CPU kernels may sum in another order otherwise.
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    command = [sys.executable, "-m", "vitplasticity.cli", *cli_args(settings, demo_dataset, out)]
    with open(tmp_path / "killed.log", "w") as log_file:
        process = subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            wait_for(out / "checkpoint.pt", process)
        finally:
            process.kill()  # SIGKILL: no handler runs
            process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not (out / "summary.json").exists() and not (out / "metrics.parquet").exists()

    summary = train(settings.run, settings.training, demo_dataset, out)
    assert_same_as_reference(out, summary, reference_runs["sgd"])


def test_checkpoint_of_other_settings_is_not_resumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 7, "weights": torch.arange(3.0)}, key="settings-a")
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically: no temporary left
    state = load_checkpoint(path, key="settings-a")
    assert state is not None and state["step"] == 7
    torch.testing.assert_close(state["weights"], torch.arange(3.0))
    with caplog.at_level(logging.WARNING):
        assert load_checkpoint(path, key="settings-b") is None
    assert "other settings" in caplog.text
    assert load_checkpoint(tmp_path / "absent.pt", key="settings-a") is None
