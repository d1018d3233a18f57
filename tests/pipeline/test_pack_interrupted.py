"""The demo's packed finetuning (finetune.pack_runs: one job runs a cell's runs) interrupted
locally after some of its runs, as a user would (Ctrl-C, SIGTERM or SIGKILL to Snakemake
and its jobs), then the same command again: Snakemake deletes the interrupted job's
outputs, the pack puts back the runs it had finished (vitplasticity.finetune.finished) and
trains only the others, the interrupted one from its checkpoint; the results equal an
uninterrupted run's."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.demo_workflow import summaries, tables, workflow_args
from tests.helpers.slurm_harness import REPO, run_snakemake, signal_group, start_snakemake

pytestmark = pytest.mark.slow

CONFIGURATIONS = ["mha", "ln1", "fc1", "head"]
# One pack of four runs, each long enough to be caught mid-run (a checkpoint every 5 steps).
FOUR_RUNS = {
    "finetune": {"pack_runs": True, "checkpoint_every": 5},
    "datasets": {"demo-stripes": {"steps": 60, "val_every": 30}},
    "experiments": {
        "sgd": {"configurations": CONFIGURATIONS, "lrs_by_dataset": {"demo-stripes": [0.05]}}
    },
}
CELL = "results/finetune/sgd/demo_vit/demo-stripes"
TRAINED = re.compile(r"finetune\.setup: run (\S+):")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("uninterrupted")
    run_snakemake([*workflow_args(workdir, FOUR_RUNS), "--cores", "2", "finetune_all"], REPO)
    return workdir


def pack_log(workdir: Path) -> Path:
    (log,) = (workdir / "results/logs/finetune/sgd/demo_vit/demo-stripes").glob("*.log")
    return log


# Ctrl-C in the terminal; a shutdown or a scheduler's stop, which the pack job gets too and
# writes its checkpoint (SIGTERM to Snakemake alone stops it gracefully: it waits for the pack
# to finish); the job group killed, with no clean-up at all.
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_a_rerun_trains_only_the_runs_the_interrupted_pack_did_not_finish(
    uninterrupted: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    args = [*workflow_args(tmp_path, FOUR_RUNS), "--cores", "2", "finetune_all"]
    folders = [tmp_path / CELL / f"{c}/lr0.05_seed0" for c in CONFIGURATIONS]
    proc = start_snakemake(args, REPO, tmp_path / "first.log")
    deadline = time.monotonic() + 600
    while not (folders[2] / "checkpoint.pt").exists():
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the third run wrote no checkpoint"
        time.sleep(0.05)
    signal_group(proc, sig)
    assert proc.wait(timeout=300) != 0
    assert all((f / "pack_finished/record.json").is_file() for f in folders[:2])
    assert not (folders[3] / "summary.json").exists()
    if sig == signal.SIGKILL:  # a killed Snakemake leaves its lock (docs/slurm.md, "Resume")
        run_snakemake([*args, "--unlock"], REPO)

    rerun = run_snakemake(args, REPO, timeout=600)  # the same command
    assert "Error" not in rerun.stdout, rerun.stdout[-3000:]
    log = pack_log(tmp_path).read_text()
    assert TRAINED.findall(log) == [str(f) for f in folders[2:]], log[-3000:]
    assert log.count("finished by an earlier attempt of the pack, kept") == 2
    assert re.search(rf"resuming {re.escape(str(folders[2]))}/checkpoint.pt from step", log)
    assert summaries(tmp_path / "results") == summaries(uninterrupted / "results")
    ours, theirs = tables(tmp_path / "results"), tables(uninterrupted / "results")
    assert sorted(ours) == sorted(theirs) and all(ours[n].equals(theirs[n]) for n in ours)
    for folder in folders:  # each as an unpacked run leaves it
        assert sorted(p.name for p in folder.iterdir()) == ["metrics.parquet", "summary.json"]
