"""Per-job start-up on the local SLURM: each finetuning job's sacct elapsed time against the
compute of the runs it holds, for one or more checkouts side by side, packed each way or not.

Every job pays what its runs do not: SLURM's job start, a Snakemake process re-parsing the
Snakefile on the node, Python importing torch and timm, then the run's own set-up. Start-up
here is a job's elapsed time (sacct End - Start) minus its runs' compute (each run's
``wall_seconds`` in summary.json). Checkouts (``--checkout``, e.g. a
``git worktree`` of an older commit) run the same jobs in turns, so they meet the same load;
each imports its own ``src`` (PYTHONPATH), in this venv. Jobs run one at a time (``--jobs 1``),
so that an elapsed time is the job's own, not a share of the node.

    .ci/start_local_slurm.sh "$PWD/.slurm-local"
    python -m benchmarks.job_startup --checkout ../before --checkout . --runs 4
    python -m benchmarks.job_startup --packing none pack_runs --steps 400   # packing

Packing (``--packing``): ``none``, one SLURM job per run; ``pack_runs``,
``finetune.pack_runs: true``, the runs in one job and one process. (Snakemake job groups, the
third way measured in docs/benchmarks.md, each run still its own process, were removed after
that measurement.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml
from tests.helpers.demo_workflow import outputs
from tests.helpers.slurm_harness import (
    FAST_POLLING,
    VENV_BIN,
    run_uuids,
    sacct_jobs,
    snakemake_env,
    wait_for_accounting,
)

CONFIGURATIONS = ["mha", "ln1", "ln2", "fc1", "fc2", "head", "emb", "full"]
DATASET = "demo-stripes"


PACKINGS = ("none", "pack_runs")


@dataclass(frozen=True)
class Contender:
    """One way to run the same runs: a checkout and its packing (:data:`PACKINGS`)."""

    checkout: Path
    packing: str = "none"

    @property
    def name(self) -> str:
        commit = subprocess.run(
            ["git", "-C", str(self.checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(self.checkout), "diff", "--quiet", "HEAD"], check=False
        ).returncode
        packing = "" if self.packing == "none" else f" {self.packing}"
        return f"{commit or self.checkout}{'+' if dirty else ''}{packing}"


def grid(runs: int, steps: int, pack_runs: bool = False) -> dict:
    """The demo cut to ``runs`` SGD runs on one dataset (one learning rate, one seed)."""
    return {
        "plasticity": {"datasets": [DATASET]},
        "datasets": {DATASET: {"steps": steps, "val_every": steps}},
        "finetune": {"pack_runs": pack_runs},
        "experiments": {
            "sgd": {
                "datasets": [DATASET],
                "configurations": CONFIGURATIONS[:runs],
                "lrs_by_dataset": {DATASET: [0.05]},
            },
            "adam": {"enabled": False},
        },
    }


def snakemake(contender: Contender, workdir: Path, options: list[str]) -> str:
    """Run the contender's Snakefile on the cut demo inside ``workdir``; its output."""
    extra = workdir / "grid.yaml"
    checkout = contender.checkout
    env = snakemake_env() | {"PYTHONPATH": str(checkout / "src")}
    paths = {"resources": str(workdir / "resources"), "results": str(workdir / "results")}
    command = [
        str(VENV_BIN / "snakemake"),
        "--snakefile",
        str(checkout / "workflow/Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(checkout / "config/config.yaml"),
        str(checkout / "config/demo.yaml"),
        str(extra),
        "--config",
        f"paths={json.dumps(paths)}",
        *options,
    ]
    proc = subprocess.run(
        command, cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stdout[-3000:]}{proc.stderr}")
    return proc.stdout + proc.stderr


def seconds_between(start: str, end: str) -> float:
    """Seconds from one sacct timestamp to another."""
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def run_compute(results: Path) -> list[float]:
    """Each run's compute: its summary.json's ``wall_seconds`` (set-up to its last step)."""
    return [json.loads(p.read_text())["wall_seconds"] for p in outputs(results, "summary.json")]


def measure(contender: Contender, runs: int, steps: int) -> dict[str, float]:
    """The contender's finetuning jobs through SLURM: jobs, their elapsed and compute sums."""
    with tempfile.TemporaryDirectory(prefix="job_startup_") as folder:
        workdir = Path(folder)
        packed = contender.packing == "pack_runs"
        (workdir / "grid.yaml").write_text(yaml.safe_dump(grid(runs, steps, packed)))
        dataset = str(workdir / "resources/datasets" / DATASET)
        snakemake(contender, workdir, ["--cores", "2", dataset])  # the data, locally
        profile = ["--profile", str(contender.checkout / "slurm"), "--jobs", "1"]
        output = snakemake(
            contender, workdir, [*profile, "--latency-wait", "10", *FAST_POLLING, "finetune_all"]
        )
        (uuid,) = set(run_uuids(output))
        rows = wait_for_accounting(uuid, expected=len(sacct_jobs(uuid)), timeout=60)
        finetune_jobs = [r for r in rows if "finetune" in r["Comment"]]
        if any(r["State"] != "COMPLETED" for r in finetune_jobs):
            raise RuntimeError(f"{contender.name}: not every job completed: {finetune_jobs}")
        elapsed = [seconds_between(r["Start"], r["End"]) for r in finetune_jobs]
        compute = run_compute(workdir / "results")
    if len(compute) != runs:
        raise RuntimeError(f"{contender.name}: {len(compute)} run logs for {runs} runs")
    return {
        "jobs": len(elapsed),
        "elapsed_s": sum(elapsed),
        "compute_s": sum(compute),
        "startup_per_job_s": (sum(elapsed) - sum(compute)) / len(elapsed),
        "startup_per_run_s": (sum(elapsed) - sum(compute)) / runs,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkout",
        type=Path,
        action="append",
        help="a checkout to measure (repeat to compare; default: this one)",
    )
    parser.add_argument("--runs", type=int, default=4, help="finetuning runs (at most 8)")
    parser.add_argument("--steps", type=int, default=48, help="training steps per run")
    parser.add_argument("--rounds", type=int, default=1, help="turns per contender")
    parser.add_argument(
        "--packing",
        nargs="+",
        choices=PACKINGS,
        default=["none"],
        help="ways to run the runs, each measured per checkout: one job per run (none), one"
        " job and process (pack_runs)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= len(CONFIGURATIONS):
        parser.error(f"--runs: 1 to {len(CONFIGURATIONS)}, got {args.runs}")
    missing = [c for c in args.checkout or () if not (c / "workflow/Snakefile").is_file()]
    if missing:
        parser.error(f"--checkout: no Snakefile in {', '.join(map(str, missing))}")
    return args


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Measure every contender in turns and print the medians over rounds, with ratios to the
    first contender."""
    args = parse(argv)
    checkouts = [c.resolve() for c in args.checkout or [Path(__file__).resolve().parents[1]]]
    contenders = [Contender(c, p) for c in checkouts for p in dict.fromkeys(args.packing)]
    # Named once: a commit made while it runs must not rename a contender.
    names = {contender: contender.name for contender in contenders}
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in names.values()}
    for _ in range(args.rounds):
        for contender in contenders:
            rounds[names[contender]].append(measure(contender, args.runs, args.steps))
    medians = {
        name: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for name, results in rounds.items()
    }
    first = next(iter(medians.values()))
    print(f"{args.runs} runs of {args.steps} steps, {args.rounds} round(s), jobs one at a time")
    print(
        f"{'contender':<22}{'jobs':>5}{'elapsed s':>11}{'compute s':>11}{'start-up/job s':>16}"
        f"{'start-up/run s':>16}"
    )
    for name, m in medians.items():
        print(
            f"{name:<22}{m['jobs']:>5.0f}{m['elapsed_s']:>11.1f}{m['compute_s']:>11.1f}"
            f"{m['startup_per_job_s']:>16.1f}{m['startup_per_run_s']:>16.1f}"
            f"   elapsed x{m['elapsed_s'] / first['elapsed_s']:.2f},"
            f" start-up/run x{m['startup_per_run_s'] / first['startup_per_run_s']:.2f}"
        )
    return medians


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
