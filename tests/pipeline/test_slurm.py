"""The workflow through a real local SLURM and snakemake-executor-plugin-slurm.

- A small demo through the shipped profiles (slurm/profile.yaml and
  workflow/profiles/default/profile.yaml, unmodified), its runs packed as the demo preset packs
  them (finetune.pack_runs: one job and one process per cell): every job COMPLETED in sacct
  with the profile's requests (each pack those of one finetune run, plasticity one GPU each
  and 8 CPUs per GPU, CPU-only rules no GPU; memory, plasticity's from the rule's derivation
  (the demo's random ViT has no checkpoint: 32000 MB); wall time from the rules' runtime
  formulas, a pack's its runs' together), and the results identical to a local unpacked run.
- A finetuning job cancelled twice mid-run (scancel) is retried by the same run (the profile's
  retries) and finishes on its third attempt, resuming from its checkpoint each time, every
  attempt asking for memory the node has (the profile's, not growing with the attempt); nothing
  else reruns, and its numbers equal an uninterrupted run's. The profile's squeue status command
  is what lets the run see each cancellation (plugin 2.4.0-2.8.0, slurm/profile.yaml). A rerun
  of the same command after a cancellation that failed the run (--retries 0) starts the job
  the way a retry does and finds the same checkpoint (tests/pipeline/test_faults.py reruns an
  interrupted local run; tests/pipeline/test_pack_interrupted.py an interrupted pack).

The cluster comes from tests/helpers/slurm_harness.py (started here when needed, stopped at the end
by PID); its node advertises stand-in GPUs and a GPU node's CPUs and memory, so the shipped
requests are scheduled as asked. Without root or apt the tests skip and say why (in CI they
must run).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.helpers.demo_workflow import merged_config, summaries, tables, workflow_args
from tests.helpers.slurm_harness import (
    REPO,
    WORKFLOW_PROFILE,
    LocalSlurm,
    alloc_tres,
    node_memory_mb,
    run_snakemake,
    run_uuids,
    running_jobs,
    shipped_profile_args,
    signal_group,
    start_snakemake,
    timelimit_minutes,
    wait_for_accounting,
)
from vitplasticity.workflow import runtime
from vitplasticity.workflow.memory import JobMemory

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TARGETS = ("finetune_all", "plasticity_all")
PACK_PREFIX = "finetune_pack_"


def slurm_workflow_args(workdir: Path, *extra_configs: dict) -> list[str]:
    """workflow_args through the shipped profiles, two SLURM jobs at a time."""
    return [*workflow_args(workdir, *extra_configs), *shipped_profile_args(jobs=2)]


# The wall-time estimates (minutes) of vitplasticity.workflow.runtime, which the rules send to SLURM
# (tests/workflow/test_runtime.py checks the estimates themselves): the test fails if the rules stop
# sending them.
def finetune_minutes(config: dict, model: str, dataset: str, attempt: int = 1) -> int:
    return runtime.finetune_minutes(
        config["datasets"][dataset]["steps"],
        config["finetune"]["batch_size"],
        config["models"][model]["timm_id"],
        config["finetune"]["precision"],  # fp32: config.yaml's, which the presets keep
        attempt,
    )


def plasticity_minutes(config: dict, model: str) -> int:
    p = config["plasticity"]
    timm_id = config["models"][model]["timm_id"]
    return runtime.plasticity_minutes(p["n_pairs"], len(p["protocols"]), timm_id, p["dtype"])


def job_rule(row: dict[str, str]) -> str:
    """The rule of a job, from the comment the plugin gives it: rule_<rule>[_wildcards_<values>]."""
    return row["Comment"].removeprefix("rule_").split("_wildcards_")[0]


def profile_rule(rule: str) -> str:
    """The workflow profile's entry for `rule`: a pack (finetune.pack_runs) asks for finetune's."""
    return "finetune" if rule.startswith(PACK_PREFIX) else rule


def expected_minutes(
    row: dict[str, str], config: dict, profile: dict, attempt: int, results: Path | None
) -> int:
    """The wall time the job of `row` should have asked for on its `attempt`.

    The plugin's comment joins the wildcard values with "_" (names may contain "_" too), so a
    job's (model, dataset) is the one pair whose names appear there, in order. A pack's is one
    start-up allowance and its runs' compute: every run of its cell (in `results`) when no
    time cap cuts it.
    """
    rule, comment = job_rule(row), row["Comment"]
    if rule.startswith(PACK_PREFIX):
        assert config["scheduler"]["max_runtime_minutes"] is None and results is not None
        experiment = rule.removeprefix(PACK_PREFIX).rsplit("_", 1)[0]
        model, dataset = cell_of(comment, config)
        runs = len(list((results / "finetune" / experiment / model / dataset).glob("*/*/")))
        seconds = runtime.finetune_compute_seconds(
            config["datasets"][dataset]["steps"],
            config["finetune"]["batch_size"],
            config["models"][model]["timm_id"],
            config["finetune"]["precision"],
        )
        return runtime.pack_minutes([seconds] * runs, attempt)
    if rule in ("finetune", "plasticity"):
        model, dataset = cell_of(comment, config)
        if rule == "finetune":
            return finetune_minutes(config, model, dataset, attempt)
        return plasticity_minutes(config, model)
    return profile["set-resources"][rule]["runtime"]


def expected_mem_mb(row: dict[str, str], config: dict, wanted: dict, attempt: int) -> int:
    """The memory the job of `row` should have asked for: the plasticity rule's, derived from
    its model's checkpoint (vitplasticity.workflow.memory: the demo's random ViT has none, so
    32000); another rule's, the workflow profile's (a number or a Snakemake resource expression
    of `attempt`)."""
    if job_rule(row) == "plasticity":
        model, dataset = cell_of(row["Comment"], config)
        return JobMemory(config).plasticity(SimpleNamespace(model=model, dataset=dataset))
    env = {"__builtins__": {}, "min": min}
    return eval(str(wanted["mem_mb"]), env, {"attempt": attempt})


def cell_of(comment: str, config: dict) -> tuple[str, str]:
    """The one (model, dataset) whose names appear, in order, in a job's comment."""
    pairs = [
        (model, dataset)
        for model in config["models"]
        for dataset in config["datasets"]
        if f"_{model}_{dataset}" in comment
    ]
    assert len(pairs) == 1, (comment, pairs)
    return pairs[0]


def check_requests(
    rows: list[dict[str, str]], config: dict, attempt: int = 1, results: Path | None = None
) -> None:
    """Every job asked for and got what the shipped workflow profile and the rules ask for on
    `attempt` (sacct rows), and no more memory than the node has (`results`: a packed run's
    results). A GPU job's request is the shipped form, {gpu: 1, cpus_per_gpu: 8}: this is the
    check of that form on the cluster (tests/pipeline/test_slurm_gpu_forms.py submits the
    others)."""
    profile = yaml.safe_load(WORKFLOW_PROFILE.read_text())
    node_mb = node_memory_mb()
    for row in rows:
        rule, tres = profile_rule(job_rule(row)), alloc_tres(row)
        wanted = profile["set-resources"][rule]
        mem_mb = expected_mem_mb(row, config, wanted, attempt)
        assert tres["mem"] == mem_mb <= node_mb, row
        if rule in ("finetune", "plasticity"):
            assert wanted["gpu"] == 1, f"the shipped profile asks no GPU for {rule}"
        if wanted.get("gpu"):
            # Asked for (ReqTRES: sbatch --gpus=1 --cpus-per-gpu=8) and got (AllocTRES) one GPU.
            for column in ("ReqTRES", "AllocTRES"):
                asked_got = alloc_tres(row, column)
                assert asked_got.get("gres/gpu") == wanted["gpu"], (column, row)
                assert asked_got["mem"] == mem_mb, (column, row)
            assert tres["cpu"] == wanted["gpu"] * wanted["cpus_per_gpu"], row
        else:
            assert "gres/gpu" not in tres and tres["cpu"] == 1, row
        expected = expected_minutes(row, config, profile, attempt, results)
        assert timelimit_minutes(row["Timelimit"]) == expected, row


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo run locally (the reference for the SLURM run)."""
    workdir = tmp_path_factory.mktemp("local")
    run_snakemake([*workflow_args(workdir), "--cores", "2", *TARGETS], REPO)
    return workdir


def test_demo_through_slurm_completes_and_matches_a_local_run(
    local_slurm: LocalSlurm, local_run: Path, tmp_path: Path
) -> None:
    # The demo preset packs its runs (finetune.pack_runs): one job and one process per cell.
    packed = {"finetune": {"pack_runs": True}}
    args = [*workflow_args(tmp_path, packed), *shipped_profile_args(jobs=2)]
    t0 = time.monotonic()
    proc = run_snakemake([*args, *TARGETS], REPO, timeout=900)
    wall = time.monotonic() - t0
    (uuid,) = run_uuids(proc.stdout)
    n_jobs = proc.stdout.count("has been submitted with SLURM jobid")
    rows = wait_for_accounting(uuid, n_jobs)
    # Every job but the two target rules (local) went through SLURM, and each kind is there.
    stats = proc.stdout[proc.stdout.index("Job stats:") :].split("\n\n")[0]
    planned = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)}
    assert len(rows) == n_jobs == planned["total"] - len(TARGETS), proc.stdout[-3000:]
    rules = {profile_rule(job_rule(r)) for r in rows}
    assert rules == {"prepare", "reference", "finetune", "plasticity"}, rows
    finetune_jobs = [job_rule(r) for r in rows if profile_rule(job_rule(r)) == "finetune"]
    assert all(rule.startswith(PACK_PREFIX) for rule in finetune_jobs), finetune_jobs
    assert {r["State"] for r in rows} == {"COMPLETED"}, rows
    check_requests(rows, merged_config(packed), results=tmp_path / "results")

    assert summaries(tmp_path / "results") == summaries(local_run / "results")
    ours, theirs = tables(tmp_path / "results"), tables(local_run / "results")
    assert sorted(ours) == sorted(theirs) and ours
    print(f"\nSLURM demo, packed: {n_jobs} jobs, all COMPLETED, {wall:.0f} s wall")
    differ = [name for name, frame in ours.items() if not frame.equals(theirs[name])]
    assert not differ


# One run, long enough to be caught mid-run; checkpoints every 10 steps.
ONE_LONGER_RUN = {
    "datasets": {"demo-stripes": {"steps": 400, "val_every": 100}},
    "finetune": {"checkpoint_every": 10},
    "experiments": {
        "sgd": {"configurations": ["head"], "lrs_by_dataset": {"demo-stripes": [0.05]}}
    },
}
RUN = "finetune/sgd/demo_vit/demo-stripes/head/lr0.05_seed0"


RESUMED_AT = re.compile(r"resuming \S+ from step (\d+)")


def test_finetune_job_cancelled_twice_finishes_on_its_third_attempt_within_the_node(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    """The profile's retries (2) in one run: attempt 1 and 2 are cancelled after a checkpoint,
    attempt 3 completes. Each retry resumes from the checkpoint its predecessor left, and every
    attempt's memory request is the profile's, within the node (sinfo's RealMemory). Nothing
    but the finetuning job is retried (the dataset's prepare job ran once), and the run's
    numbers equal an uninterrupted run's."""
    args = [*slurm_workflow_args(tmp_path, ONE_LONGER_RUN), "finetune_all"]
    proc = start_snakemake(args, REPO, tmp_path / "snakemake.log")
    # The uninterrupted run to compare with, made locally meanwhile: most of this test waits on
    # SLURM (submissions, status polls, cancellations), and a slower cluster job is only easier
    # to catch between its checkpoints.
    clean = tmp_path / "uninterrupted"
    clean.mkdir()
    clean_args = [*workflow_args(clean, ONE_LONGER_RUN), "--cores", "2", "finetune_all"]
    uninterrupted = start_snakemake(clean_args, REPO, tmp_path / "uninterrupted.log")
    try:
        check_cancelled_twice(proc, tmp_path)
    except BaseException:
        if uninterrupted.poll() is None:  # not left running after a failure
            signal_group(uninterrupted, signal.SIGTERM)
        raise
    assert uninterrupted.wait(timeout=600) == 0, (tmp_path / "uninterrupted.log").read_text()
    assert summaries(tmp_path / "results") == summaries(clean / "results")


def check_cancelled_twice(proc: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """The checks of the test above on its SLURM run `proc` (in `tmp_path`)."""
    run_dir = tmp_path / "results" / RUN
    log = tmp_path / f"results/logs/{RUN}.log"

    def wait_for(condition, what: str) -> None:
        deadline = time.monotonic() + 300
        while not condition():
            assert proc.poll() is None, (tmp_path / "snakemake.log").read_text()[-3000:]
            assert time.monotonic() < deadline, what
            time.sleep(0.1)

    def cancel_the_running_attempt(cancelled: list[str]) -> None:
        (uuid,) = run_uuids((tmp_path / "snakemake.log").read_text())
        running = [job for job in running_jobs(uuid, "rule_finetune") if job not in cancelled]
        assert len(running) == 1, running
        subprocess.run(["scancel", running[0]], check=True)
        cancelled.append(running[0])

    def resumed_at() -> int | None:
        found = RESUMED_AT.search(log.read_text()) if log.exists() else None
        return int(found[1]) if found else None

    cancelled: list[str] = []
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), "no checkpoint appeared")
    cancel_the_running_attempt(cancelled)
    # The retry resumes (its log says from which step), then writes a checkpoint of its own.
    wait_for(lambda: resumed_at() is not None, "the second attempt did not resume")
    second_from = resumed_at()
    resumed_checkpoint = (run_dir / "checkpoint.pt").stat().st_mtime
    wait_for(
        lambda: (run_dir / "checkpoint.pt").stat().st_mtime > resumed_checkpoint,
        "the second attempt wrote no checkpoint",
    )
    cancel_the_running_attempt(cancelled)
    assert proc.wait(timeout=600) == 0, (tmp_path / "snakemake.log").read_text()[-3000:]

    third_from = resumed_at()  # the log of the last attempt
    assert second_from is not None and third_from is not None
    assert 10 <= second_from < third_from < 400, (second_from, third_from)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] is True and summary["status"] == "completed"

    (uuid,) = run_uuids((tmp_path / "snakemake.log").read_text())
    all_rows = wait_for_accounting(uuid, 4)
    rows = sorted((r for r in all_rows if job_rule(r) == "finetune"), key=lambda r: int(r["JobID"]))
    assert [r["JobID"] for r in rows[:2]] == cancelled, rows
    assert [r["State"].split()[0] for r in rows] == ["CANCELLED", "CANCELLED", "COMPLETED"], rows
    # Nothing else ran again: the run's one other job, the dataset's prepare, ran once.
    others = [r for r in all_rows if job_rule(r) != "finetune"]
    assert [job_rule(r) for r in others] == ["prepare"], all_rows
    assert others[0]["State"] == "COMPLETED", others
    config = merged_config(ONE_LONGER_RUN)
    check_requests(others, config)
    for attempt, row in enumerate(rows, start=1):
        check_requests([row], config, attempt)  # memory within the node; wall time grows
    print(
        f"\nattempts: {[(r['JobID'], r['State'], r['AllocTRES'], r['Timelimit']) for r in rows]};"
        f" resumed from steps {second_from} and {third_from}; node {node_memory_mb()} MB"
    )
