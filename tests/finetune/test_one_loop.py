"""One training loop for every task: a tiny ViT (classification), a tiny GPT2 (causal LM) and
a tiny BERT (masked LM) run through the same :func:`train_runs`, and each gets what the loop
gives: exact resume after SIGTERM, a rung stop continued to the uninterrupted run's numbers,
and several runs in one call (a pack) equal to each run alone. Compared bit for bit (CPU)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.helpers.text_entries import BERT_MLM, GPT2, LENGTH
from tests.helpers.tiny_finetune import settings_for
from tests.helpers.tiny_vit import TINY_SPEC
from vitplasticity.finetune import loop
from vitplasticity.finetune.loop import Preempted
from vitplasticity.finetune.outputs import TIMING_FIELDS
from vitplasticity.finetune.run import Run
from vitplasticity.finetune.settings import TextFinetuneSettings, TrainingSettings
from vitplasticity.finetune.text_run import TextSource
from vitplasticity.finetune.train import train_runs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STEPS = 9
VOLATILE = (*TIMING_FIELDS, "sequences_per_second", "created", "resumed")
KINDS = ("vit", "gpt2", "bert")


@dataclasses.dataclass(frozen=True)
class Case:
    """The runs of one input kind: their source and shared settings."""

    source: Any  # a dataset folder or a TextSource
    training: TrainingSettings
    runs: tuple[Run, Run]  # two runs of the same job (a pack)


def _case(kind: str, demo_dataset: Path, root: Path) -> Case:
    # Logged at 1, 4, 8, 9 and validated at 3, 6, 9: steps 2, 5, 7 stay on the device
    # (deferred read-backs); no periodic checkpoint, so each stop below writes its own.
    common = {"steps": STEPS, "val_every": 3, "log_every": 4, "checkpoint_every": 100}
    if kind == "vit":
        settings = settings_for(TINY_SPEC, configuration="mha+fc2", **common, num_workers=0)
        run, training, source = settings.run, settings.training, demo_dataset
    else:
        text = root / "pattern.txt"
        text.write_text(("abcdefgh" * 3 + "\n") * 24)
        training = TrainingSettings(
            model_spec=GPT2 if kind == "gpt2" else BERT_MLM,
            optimizer="adamw",
            batch_size=4,
            micro_batch_size=2,
            warmup_steps=2,
            device="cpu",
            val_fraction=0.25,
            **common,
        )
        run = Run("text", "tiny", "pattern", "mha+fc2", 1e-2, 0)
        source = TextSource(TextFinetuneSettings(sequence_length=LENGTH), text)
    other = dataclasses.replace(run, lr=run.lr / 2, seed=1)
    return Case(source, training, (run, other))


def _outputs(out: Path) -> tuple[dict[str, Any], pl.DataFrame]:
    summary = json.loads((out / "summary.json").read_text())
    comparable = {k: v for k, v in summary.items() if k not in VOLATILE}
    return comparable, pl.read_parquet(out / "metrics.parquet")


def _same(a: tuple[dict[str, Any], pl.DataFrame], b: tuple[dict[str, Any], pl.DataFrame]) -> None:
    assert a[0] == b[0]
    assert a[1].equals(b[1])  # polars compares floats exactly


@pytest.fixture(scope="module", params=KINDS)
def case(request, demo_dataset: Path, tmp_path_factory: pytest.TempPathFactory):
    """A kind's case and its two runs trained alone, uninterrupted."""
    root = tmp_path_factory.mktemp(request.param)
    case = _case(request.param, demo_dataset, root)
    alone = []
    for index, run in enumerate(case.runs):
        train_runs([(run, root / f"alone{index}")], case.training, case.source)
        alone.append(_outputs(root / f"alone{index}"))
    return request.param, case, alone


def test_each_kind_trains_its_task_with_deferred_steps(case) -> None:
    kind, _, alone = case
    summary, metrics = alone[0]
    assert summary["status"] == "completed" and summary["final_step"] == STEPS
    assert metrics.filter(pl.col("kind") == "train")["step"].to_list() == [1, 4, 8, 9]
    assert metrics.filter(pl.col("kind") == "val")["step"].to_list() == [3, 6, 9]
    if kind == "vit":
        assert "best_val_accuracy" in summary and "task" not in summary
    else:
        assert summary["task"] == ("causal" if kind == "gpt2" else "masked")
        best = metrics.filter(pl.col("kind") == "val").sort(["val_loss", "step"]).row(0, named=True)
        assert (summary["best_step"], summary["best_val_loss"]) == (best["step"], best["val_loss"])


def test_two_runs_in_one_call_equal_each_run_alone(case, tmp_path: Path) -> None:
    _, case, alone = case
    outs = [tmp_path / "packed0", tmp_path / "packed1"]
    train_runs(list(zip(case.runs, outs, strict=True)), case.training, case.source)
    for out, expected in zip(outs, alone, strict=True):
        _same(_outputs(out), expected)
    assert alone[0][1]["train_loss"].to_list() != alone[1][1]["train_loss"].to_list()


def test_a_run_stopped_by_sigterm_resumes_to_the_uninterrupted_numbers(
    case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM during step 5 (a deferred step): checkpoint after it, then the next process
    resumes and ends bit for bit where the uninterrupted run ends."""
    _, case, alone = case
    step_batch, taken = loop._step_batch, []

    def signalled(context, item):
        taken.append(item)
        if len(taken) == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return step_batch(context, item)

    monkeypatch.setattr(loop, "_step_batch", signalled)
    out = tmp_path / "run"
    with pytest.raises(Preempted, match="after step 5"):
        train_runs([(case.runs[0], out)], case.training, case.source)
    monkeypatch.setattr(loop, "_step_batch", step_batch)
    assert (out / "checkpoint.pt").is_file() and not (out / "summary.json").exists()
    summary = train_runs([(case.runs[0], out)], case.training, case.source)[0]
    assert summary["resumed"] is True
    _same(_outputs(out), alone[0])


def test_a_rung_stop_continued_equals_the_uninterrupted_run(case, tmp_path: Path) -> None:
    kind, case, alone = case
    out = tmp_path / "run"
    record = train_runs([(case.runs[0], out)], case.training, case.source, stop_at=4)[0]
    assert record["status"] == "paused" and record["final_step"] == 4
    metric = "best_val_accuracy" if kind == "vit" else "best_val_loss"
    first_val = alone[0][1].filter(pl.col("kind") == "val").row(0, named=True)
    assert (record["best_step"], record[metric]) == (3, first_val[metric.removeprefix("best_")])
    assert not (out / "summary.json").exists()
    train_runs([(case.runs[0], out)], case.training, case.source)
    _same(_outputs(out), alone[0])
