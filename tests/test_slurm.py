"""The workflow through a real local SLURM and snakemake-executor-plugin-slurm.

- A small demo (the mini preset, one dataset) through the shipped profiles (slurm/profile.yaml
  and workflow/profiles/default/profile.yaml, unmodified): every job COMPLETED in sacct with
  the profile's requests (finetune and plasticity one GPU each and 8 CPUs per GPU, CPU-only
  rules no GPU; memory; wall time from the rules' runtime formulas), and the results
  identical to a local run.
- A finetuning job cancelled mid-run (scancel) is resumed by a rerun from its checkpoint, and
  nothing else reruns; its numbers equal an uninterrupted run's. The profile's squeue status
  command is what lets the first run see the cancellation (plugin 2.4.0-2.8.0, slurm/profile.yaml).
- Many small jobs: the per-job overhead (submission to COMPLETED) of a trivial rule, and its
  packing into one SLURM job with Snakemake groups (docs/slurm.md, "Many small jobs").

The cluster comes from tests/slurm_harness.py (started here when needed, stopped at the end
by PID); its node advertises stand-in GPUs and a GPU node's CPUs and memory, so the shipped
requests are scheduled as asked. Without root or apt the tests skip and say why (in CI they
must run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest
import yaml
from snakemake.utils import update_config

from tests.slurm_harness import (
    REPO,
    WORKFLOW_PROFILE,
    LocalSlurm,
    alloc_tres,
    run_snakemake,
    run_uuids,
    shipped_profile_args,
    slurm_args,
    start_snakemake,
    timelimit_minutes,
    wait_for_accounting,
    why_no_slurm,
)
from vitplasticity import runtime

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

PRESETS = [
    REPO / "config.yaml",
    REPO / "workflow/presets/demo.yaml",
    REPO / "tests/presets/mini.yaml",
]
# One dataset, two finetuning runs: every kind of GPU and CPU job, few jobs (each SLURM job
# re-parses the Snakefile, seconds on this machine).
SMALL = {
    "plasticity": {"datasets": ["demo-stripes"]},
    "experiments": {
        "sgd": {"datasets": ["demo-stripes"], "configurations": ["mha", "head"]},
        "adam": {"enabled": False},
    },
}
TARGETS = ("finetune_all", "plasticity_all")
# Fields of summary.json that say when, where and how fast, not what was computed.
CIRCUMSTANTIAL = {
    "created",
    "host",
    "git_commit",
    "versions",
    "wall_seconds",
    "images_per_second",
    "steps_per_second",
    "resumed",
}


@pytest.fixture(scope="module")
def local_slurm() -> Iterator[LocalSlurm]:
    """A running local SLURM for the module; stopped afterwards if started here."""
    reason = why_no_slurm()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the SLURM tests, but: {reason}")
        pytest.skip(reason)
    cluster = LocalSlurm()
    cluster.start()
    yield cluster
    cluster.stop()


def workflow_args(workdir: Path, *extra_configs: dict) -> list[str]:
    """Options running the repository's Snakefile on the small demo inside `workdir`."""
    configfiles = [*map(str, PRESETS)]
    for i, extra in enumerate([SMALL, *extra_configs]):
        path = workdir / f"extra{i}.yaml"
        path.write_text(yaml.safe_dump(extra))
        configfiles.append(str(path))
    paths = {"resources": str(workdir / "resources"), "results": str(workdir / "results")}
    return [
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        *configfiles,
        "--config",
        f"paths={json.dumps(paths)}",
    ]


def slurm_workflow_args(workdir: Path, *extra_configs: dict) -> list[str]:
    """workflow_args through the shipped profiles, two SLURM jobs at a time."""
    return [*workflow_args(workdir, *extra_configs), *shipped_profile_args(jobs=2)]


def merged_config(*extra_configs: dict) -> dict:
    """The config a run of workflow_args(..., *extra_configs) sees, merged as Snakemake does."""
    config: dict = {}
    for preset in PRESETS:
        update_config(config, yaml.safe_load(preset.read_text()))
    for extra in [SMALL, *extra_configs]:
        update_config(config, extra)
    return config


# The wall-time estimates (minutes, attempt 1) of vitplasticity.runtime, which the rules send
# to SLURM (tests/test_runtime.py checks the estimates themselves): the test fails if the
# rules stop sending them.
def finetune_minutes(config: dict, model: str, dataset: str) -> int:
    return runtime.finetune_minutes(
        config["datasets"][dataset]["steps"],
        config["finetune"]["batch_size"],
        config["models"][model]["timm_id"],
        config["finetune"]["precision"],  # fp32: config.yaml's, which the presets keep
    )


def plasticity_minutes(config: dict, model: str) -> int:
    p = config["plasticity"]
    timm_id = config["models"][model]["timm_id"]
    return runtime.plasticity_minutes(p["n_pairs"], len(p["protocols"]), timm_id, p["dtype"])


def job_rule(row: dict[str, str]) -> str:
    """The rule of a job, from the comment the plugin gives it: rule_<rule>[_wildcards_<values>]."""
    return row["Comment"].removeprefix("rule_").split("_wildcards_")[0]


def expected_minutes(row: dict[str, str], config: dict, profile: dict) -> int:
    """The wall time the job of `row` should have asked for (first attempt).

    The plugin's comment joins the wildcard values with "_" (names may contain "_" too), so a
    job's (model, dataset) is the one pair whose names appear there, in order.
    """
    rule, comment = job_rule(row), row["Comment"]
    if rule in ("finetune", "plasticity"):
        pairs = [
            (model, dataset)
            for model in config["models"]
            for dataset in config["datasets"]
            if f"_{model}_{dataset}" in comment
        ]
        assert len(pairs) == 1, (comment, pairs)
        model, dataset = pairs[0]
        if rule == "finetune":
            return finetune_minutes(config, model, dataset)
        return plasticity_minutes(config, model)
    return profile["set-resources"][rule]["runtime"]


def check_requests(rows: list[dict[str, str]], config: dict) -> None:
    """Every job got what the shipped workflow profile and the rules ask for (sacct rows)."""
    profile = yaml.safe_load(WORKFLOW_PROFILE.read_text())
    for row in rows:
        rule, tres = job_rule(row), alloc_tres(row)
        wanted = profile["set-resources"][rule]
        # mem_mb is a number or a Snakemake resource expression of `attempt` (1 here).
        mem_mb = eval(str(wanted["mem_mb"]), {"__builtins__": {}, "min": min}, {"attempt": 1})
        assert tres["mem"] == mem_mb, row
        if rule in ("finetune", "plasticity"):
            assert wanted["gpu"] == 1, f"the shipped profile asks no GPU for {rule}"
        if wanted.get("gpu"):
            assert tres.get("gres/gpu") == wanted["gpu"], row
            assert tres["cpu"] == wanted["gpu"] * wanted["cpus_per_gpu"], row
        else:
            assert "gres/gpu" not in tres and tres["cpu"] == 1, row
        assert timelimit_minutes(row["Timelimit"]) == expected_minutes(row, config, profile), row


def summaries(results: Path) -> dict[str, dict]:
    """Every summary.json below `results`, without circumstantial fields, by relative path."""
    return {
        str(p.relative_to(results)): {
            k: v for k, v in json.loads(p.read_text()).items() if k not in CIRCUMSTANTIAL
        }
        for p in sorted(results.rglob("summary.json"))
    }


def tables(results: Path) -> dict[str, pl.DataFrame]:
    """Every Parquet table below `results`, without timing columns, by relative path."""
    out = {}
    for path in sorted(results.rglob("*.parquet")):
        frame = pl.read_parquet(path)
        timing = [c for c in frame.columns if any(w in c for w in ("second", "time", "created"))]
        out[str(path.relative_to(results))] = frame.drop(timing)
    return out


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small demo run locally (the reference for the SLURM run)."""
    workdir = tmp_path_factory.mktemp("local")
    run_snakemake([*workflow_args(workdir), "--cores", "2", *TARGETS], REPO)
    return workdir


def test_demo_through_slurm_completes_and_matches_a_local_run(
    local_slurm: LocalSlurm, local_run: Path, tmp_path: Path
) -> None:
    t0 = time.monotonic()
    proc = run_snakemake([*slurm_workflow_args(tmp_path), *TARGETS], REPO, timeout=900)
    wall = time.monotonic() - t0
    (uuid,) = run_uuids(proc.stdout)
    n_jobs = proc.stdout.count("has been submitted with SLURM jobid")
    rows = wait_for_accounting(uuid, n_jobs)
    # Every job but the two target rules (local) went through SLURM, and each kind is there.
    stats = proc.stdout[proc.stdout.index("Job stats:") :].split("\n\n")[0]
    planned = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M)}
    assert len(rows) == n_jobs == planned["total"] - len(TARGETS), proc.stdout[-3000:]
    assert {job_rule(r) for r in rows} == {"prepare", "reference", "finetune", "plasticity"}, rows
    assert {r["State"] for r in rows} == {"COMPLETED"}, rows
    check_requests(rows, merged_config())

    assert summaries(tmp_path / "results") == summaries(local_run / "results")
    ours, theirs = tables(tmp_path / "results"), tables(local_run / "results")
    assert sorted(ours) == sorted(theirs) and ours
    print(f"\nSLURM demo: {n_jobs} jobs, all COMPLETED, {wall:.0f} s wall")
    differ = [name for name, frame in ours.items() if not frame.equals(theirs[name])]
    assert not differ


def test_cancelled_finetune_job_resumes_from_its_checkpoint(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    # Long enough to be caught mid-run; checkpoints every 10 steps.
    longer = {
        "datasets": {"demo-stripes": {"steps": 400, "val_every": 100}},
        "finetune": {"checkpoint_every": 10},
        "experiments": {
            "sgd": {"configurations": ["head"], "lrs_by_dataset": {"demo-stripes": [0.05]}}
        },
    }
    # No retry, so that the cancelled job fails the first run. The profile polls with squeue:
    # with sacct, plugins 2.4.0-2.8.0 read "CANCELLED by <uid>" as still running and the
    # first run would wait forever (docs/slurm.md, "Resume").
    args = [*slurm_workflow_args(tmp_path, longer), "--retries", "0", "finetune_all"]
    run_dir = tmp_path / "results/finetune/sgd/demo_vit/demo-stripes/head/lr0.05_seed0"
    proc = start_snakemake(args, REPO, tmp_path / "first.log")
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoint.pt").exists():
        assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)
    (uuid,) = run_uuids((tmp_path / "first.log").read_text())
    queue = subprocess.run(
        ["squeue", "-h", "--name", uuid, "-o", "%i %k"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    running = [line.split()[0] for line in queue if " rule_finetune" in line]
    assert len(running) == 1, queue
    subprocess.run(["scancel", running[0]], check=True)
    assert proc.wait(timeout=300) != 0
    first_log = (tmp_path / "first.log").read_text()
    assert "CANCELLED" in first_log, first_log[-3000:]
    # The first run's jobs: the dataset's prepare (COMPLETED) and the cancelled finetune.
    first_rows = wait_for_accounting(uuid, 2)
    states = {r["JobID"]: r["State"] for r in first_rows}
    assert sorted(map(job_rule, first_rows)) == ["finetune", "prepare"], first_rows
    assert states[running[0]].startswith("CANCELLED"), first_rows
    check_requests(first_rows, merged_config(longer))
    assert not (run_dir / "summary.json").exists()
    assert (run_dir / "checkpoint.pt").exists()

    rerun = run_snakemake(args, REPO, timeout=600)
    (uuid2,) = run_uuids(rerun.stdout)
    rows = wait_for_accounting(uuid2, 1)
    assert [r["Comment"].split("_wildcards")[0] for r in rows] == ["rule_finetune"], rows
    assert rows[0]["State"] == "COMPLETED"
    check_requests(rows, merged_config(longer))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed"] is True and summary["status"] == "completed"
    log = tmp_path / "results/logs/finetune/sgd/demo_vit/demo-stripes/head/lr0.05_seed0.log"
    assert "resuming" in log.read_text()

    # The resumed run's numbers are those of an uninterrupted one (run locally here).
    clean = tmp_path / "uninterrupted"
    clean.mkdir()
    run_snakemake([*workflow_args(clean, longer), "--cores", "2", "finetune_all"], REPO)
    assert summaries(tmp_path / "results") == summaries(clean / "results")


def seconds_between(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def test_per_job_overhead_and_packing_into_one_job(local_slurm: LocalSlurm, tmp_path: Path) -> None:
    """Four trivial jobs as four SLURM jobs, then packed into one (a Snakemake group)."""
    n = 4
    measured = {}
    for mode, extra in {
        "one job per rule": [],
        "packed": ["--groups", "work=pack", "--group-components", f"pack={n}", "--cores", "2"],
    }.items():
        wf = tmp_path / mode.replace(" ", "_")
        (wf / "markers").mkdir(parents=True)
        shutil.copy(REPO / "tests/slurm/Snakefile", wf / "Snakefile")
        t0 = time.monotonic()
        proc = run_snakemake([*slurm_args(jobs=n), "--config", f"count={n}", *extra], wf)
        wall = time.monotonic() - t0
        (uuid,) = run_uuids(proc.stdout)
        expected = 1 if mode == "packed" else n
        rows = wait_for_accounting(uuid, expected)
        assert len(rows) == expected and {r["State"] for r in rows} == {"COMPLETED"}, rows
        assert sorted(p.name for p in (wf / "out").iterdir()) == [f"{i}.txt" for i in range(n)]
        per_job = [seconds_between(r["Submit"], r["End"]) for r in rows]
        measured[mode] = {
            "slurm_jobs": len(rows),
            "submit_to_completed_s": per_job,
            "workflow_wall_s": round(wall, 1),
            "wall_per_rule_job_s": round(wall / n, 1),
        }
    print(
        "\nper-job overhead of a trivial rule on the local SLURM:", json.dumps(measured, indent=1)
    )
