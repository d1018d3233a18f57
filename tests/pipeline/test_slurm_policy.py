"""The small demo on the local SLURM with its runs packed (finetune.pack_runs), under a
20-minute time cap (the test cluster's `capped` partition, MaxTime 20) and with CPU-only rules
routed to its `cpu` partition (scheduler.cpu_partition): every job COMPLETED, none asked for
more than 20 minutes (a pack of the demo's runs, one 15-minute start-up allowance and seconds
of compute, fits whole), CPU-only jobs ran on
`cpu` and GPU jobs on `capped`, the reference and plasticity jobs were submitted before the
first finetuning job (the datasets are prepared first, locally, so that the reference job and
the finetuning jobs are ready at once; one job at a time, so that Snakemake chooses), and the
finetuning jobs asked SLURM for a lower priority (--nice). The per-job start-up
(sacct elapsed against each run's own compute) is printed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.demo_workflow import outputs, workflow_args
from tests.helpers.slurm_harness import (
    GLOBAL_PROFILE,
    REPO,
    LocalSlurm,
    run_snakemake,
    run_uuids,
    shipped_profile_args,
    timelimit_minutes,
)
from vitplasticity.workflow.scheduling import FIRST_RESULT_RULES, is_gpu_rule

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CAP = 20
DATASETS = ["demo-stripes", "demo-reference"]  # the small demo's finetuning and reference sets
CAPPED_PARTITION, CPU_PARTITION = "capped", "cpu"
FIELDS = [
    "JobID",
    "State",
    "Partition",
    "Timelimit",
    "Submit",
    "ElapsedRaw",
    "SubmitLine",
    "Comment",
]


def accounting(job_name: str, expected: int) -> list[dict[str, str]]:
    """sacct's allocation rows of the run `job_name`, with partition and submit line, once
    all `expected` jobs are there."""
    deadline = time.monotonic() + 60
    while True:
        out = subprocess.run(
            ["sacct", "-X", "-P", "-n", "--name", job_name, "-o", ",".join(FIELDS)],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        rows = [dict(zip(FIELDS, line.split("|"), strict=False)) for line in out.splitlines()]
        rows = [row for row in rows if row.get("JobID")]
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def rule_of(row: dict[str, str]) -> str:
    """The job's rule (a pack's: finetune_pack_<experiment>_<digest>)."""
    return row["Comment"].removeprefix("rule_").split("_wildcards_")[0]


def is_finetune(row: dict[str, str]) -> bool:
    return rule_of(row) == "finetune" or rule_of(row).startswith("finetune_pack")


def test_capped_packed_run_routes_cpu_rules_and_submits_first_results_first(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    shipped = yaml.safe_load((GLOBAL_PROFILE / "profile.yaml").read_text())
    profile = tmp_path / "profile"
    profile.mkdir()
    # The GPU partition is the capped one: what a user fills in as slurm_partition.
    defaults = {**shipped["default-resources"], "slurm_partition": CAPPED_PARTITION}
    (profile / "profile.yaml").write_text(
        yaml.safe_dump({**shipped, "default-resources": defaults})
    )
    scheduler = {
        "scheduler": {"max_runtime_minutes": CAP, "cpu_partition": CPU_PARTITION},
        "finetune": {"pack_runs": True},
    }
    # The datasets first, on this machine: then the reference job and the finetuning jobs are
    # ready at the same moment, and the order of their submission is the workflow's choice,
    # not which dataset's preparation happened to end first.
    datasets = [str(tmp_path / "resources/datasets" / d) for d in DATASETS]
    run_snakemake([*workflow_args(tmp_path, scheduler), "--cores", "2", *datasets], REPO)
    # One job at a time: each time a slot frees, Snakemake picks among the ready jobs, and
    # picks by priority (the jobs of one round go to sbatch in no set order).
    args = [*workflow_args(tmp_path, scheduler), *shipped_profile_args(jobs=1, profile=profile)]
    proc = run_snakemake([*args, "finetune_all", "plasticity_all"], REPO, timeout=1200)
    (uuid,) = run_uuids(proc.stdout)
    n_jobs = proc.stdout.count("has been submitted with SLURM jobid")
    rows = accounting(uuid, n_jobs)
    assert len(rows) == n_jobs and {r["State"] for r in rows} == {"COMPLETED"}, rows

    rules = {rule_of(r) for r in rows}
    assert {"reference", "plasticity"} <= rules and "prepare" not in rules, rows
    assert any(rule.startswith("finetune_pack") for rule in rules), rows
    for row in rows:
        # A pack: at most one start-up allowance and its runs' seconds.
        assert timelimit_minutes(row["Timelimit"]) <= (15 if is_finetune(row) else CAP), row
        gpu = is_finetune(row) or is_gpu_rule(rule_of(row))
        assert row["Partition"] == (CAPPED_PARTITION if gpu else CPU_PARTITION), row
        # The grid yields to every other job in SLURM's queue.
        assert ("--nice=100" in row["SubmitLine"]) == is_finetune(row), row

    # Submission order: JobIDs grow with submission. The reference job, ready with the
    # finetuning runs, went first, then the plasticity job it made ready, then the runs.
    first_finetune = min(int(r["JobID"]) for r in rows if is_finetune(r))
    first_results = [r for r in rows if rule_of(r) in FIRST_RESULT_RULES]
    assert {"reference", "plasticity"} <= {rule_of(r) for r in first_results}, rows
    assert all(int(r["JobID"]) < first_finetune for r in first_results), rows

    # Start-up per finetuning job: SLURM's elapsed against the run's own compute.
    compute = {
        p.parent.name: json.loads(p.read_text())["wall_seconds"]
        for p in outputs(tmp_path / "results", "summary.json")
    }
    finetune_rows = [r for r in rows if is_finetune(r)]
    elapsed = sum(int(r["ElapsedRaw"]) for r in finetune_rows)
    print(
        "\nfinetune jobs under a 20-minute cap:",
        json.dumps(
            {
                "jobs": len(finetune_rows),
                "sacct_elapsed_s": elapsed,
                "runs_compute_s": round(sum(compute.values()), 1),
                "start_up_per_job_s": round(
                    (elapsed - sum(compute.values())) / len(finetune_rows), 1
                ),
            }
        ),
    )
