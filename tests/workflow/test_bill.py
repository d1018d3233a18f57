"""The bill of rule all (vitplasticity.workflow.bill) is what the jobs ask for: its GPU jobs and
their minutes equal the jobs asking for a GPU (``gpu=1`` or ``gres=gpu:...``) and their
``runtime`` resources in Snakemake's own dry run, for the demo and the paper; a pack is
counted as one job."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.configs import DEMO, PAPER, Configure, dry_run
from tests.helpers.text_entries import text_dataset
from vitplasticity.workflow.bill import Bill, BillLine, BillNotice, compute_bill
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.packs import finetune_packs
from vitplasticity.workflow.scheduling import asks_for_gpu
from vitplasticity.workflow.time_cap import cut_packs

DEMO_SLURM = DEMO.parent / "demo_slurm.yaml"


def dry_run_gpu_jobs(printed: str) -> dict[str, list[int]]:
    """Each GPU rule's jobs' runtimes, read from a dry run's job blocks."""
    jobs: dict[str, list[int]] = defaultdict(list)
    for block in re.split(r"\n(?=\[[^\n]*\]\n(?:local)?rule )", printed):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M)
        resources = re.search(r"^\s+resources: (.*)$", block, re.M)
        asked = (
            dict(item.split("=", 1) for item in resources.group(1).split(", ")) if resources else {}
        )
        if rule and asks_for_gpu(asked):  # gpu=1 or gres=gpu:...: the profile's GPU request
            jobs[rule.group(1)].append(int(asked["runtime"]))
    return jobs


def bill_minutes(bill: Bill, rule: str) -> int:
    return sum(line.minutes for line in bill.lines if line.rule == rule)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("configfiles", "edit"),
    [
        ((PAPER,), {"scheduler": {"gpu_class": "H200"}}),
        ((PAPER, DEMO, DEMO_SLURM), {"scheduler": {"max_runtime_minutes": 20}}),
        ((PAPER, DEMO), {"scheduler": {"max_runtime_minutes": 20}}),
    ],
    ids=["paper_h200", "demo_unpacked_capped", "demo_packed_capped"],
)
def test_the_bill_is_what_snakemakes_dry_run_asks_for(
    tmp_path: Path, configfiles: tuple[Path, ...], edit: dict
) -> None:
    result = dry_run(tmp_path, *configfiles, edit=edit)
    assert result.returncode == 0, result.stderr[-2000:]
    printed = result.stdout + result.stderr  # Snakemake logs to either, by version
    asked = dry_run_gpu_jobs(printed)
    assert any(rule.startswith("finetune") for rule in asked), "the dry run lists no finetune job"
    written = (tmp_path / ".snakemake/vitplasticity/bill.md").read_text()
    assert "The bill of rule all" in printed
    total_jobs = sum(len(minutes) for minutes in asked.values())
    assert f"in {total_jobs:,} GPU jobs" in written
    hours = sum(sum(minutes) for minutes in asked.values()) / 60
    assert f"{hours:,.1f} GPU-hours asked" in written
    for rule, minutes in asked.items():
        if rule.startswith("finetune_pack_"):  # billed as finetune runs, one job a pack's cell
            continue
        rows = [row for row in written.splitlines() if row.startswith(f"| {rule} |")]
        billed_runs = sum(int(row.split("|")[4].replace(",", "")) for row in rows)
        assert billed_runs == len(minutes), rule


def test_the_bill_sums_each_rules_runtime_function(demo_with: Configure) -> None:
    config = demo_with({"finetune": {"pack_runs": False}})
    runtimes = JobRuntimes(config)
    bill = compute_bill(config, runtimes)
    cells = [
        (m, d) for m in config["plasticity"]["models"] for d in config["plasticity"]["datasets"]
    ]
    expected = sum(runtimes.plasticity(SimpleNamespace(model=m, dataset=d), 1) for m, d in cells)
    assert bill_minutes(bill, "plasticity") == expected
    finetune = [line for line in bill.lines if line.rule == "finetune"]
    assert [line.precision for line in finetune] == [config["finetune"]["precision"]]
    assert bill.slurm_jobs == sum(line.runs for line in bill.lines)


def test_a_pack_is_one_job(demo_with: Configure) -> None:
    """The demo's 56 runs under a 31-minute cap, each of 1.06 s compute: alone, 15 minutes
    each (56 x 15 = 840); packed, 6 pack jobs of one allowance each (6 x 15 = 90)."""
    config = demo_with({"scheduler": {"max_runtime_minutes": 31}})
    runtimes = JobRuntimes(config)
    unpacked = compute_bill(config, runtimes)
    runs = sum(line.runs for line in unpacked.lines if line.rule == "finetune")
    assert (runs, bill_minutes(unpacked, "finetune")) == (56, 840)
    others = unpacked.slurm_jobs - runs
    packs = cut_packs(finetune_packs(config), config, runtimes)
    packed = compute_bill(config, runtimes, packs=packs)
    cells = sum(len(pack.models) * len(pack.datasets) for pack in packs)
    assert cells == 6 and packed.slurm_jobs == cells + others
    assert bill_minutes(packed, "finetune") == 90
    assert sum(line.runs for line in packed.lines if line.rule == "finetune") == runs


def test_transformers_models_without_a_cap_are_billed_apart() -> None:
    line = BillLine("finetune", "gpt", "fp32", runs=3, minutes=0, unestimated=3)
    text = Bill((line,), slurm_jobs=3).text()
    assert "(+3 at the partition's default time)" in text


@pytest.mark.parametrize(
    ("jobs", "minutes", "expected_hours"),
    [(50, 50 * 60, 50 / 10 / 3600), (300, 300 * 60, 300 * 1 / 300 * 200 / 100)],
)
def test_the_last_submission_waits_for_all_but_the_last_jobs_at_once(
    jobs: int, minutes: int, expected_hours: float
) -> None:
    bill = Bill((BillLine("finetune", "m", "fp32", jobs, minutes),), slurm_jobs=jobs)
    assert bill.last_submission_hours == pytest.approx(expected_hours)
    assert bill.submission_seconds == jobs / 10


def test_the_notice_prints_and_writes_once(demo_with: Configure, tmp_path: Path) -> None:
    config = demo_with({})
    runtimes = JobRuntimes(config)
    workflow = SimpleNamespace(group_settings=None, local_exec=True)
    said: list[str] = []
    target = tmp_path / "sub" / "bill.md"
    notice = BillNotice(
        workflow,
        config,
        runtimes,
        lambda: None,
        target,
        report=said.append,
    )
    assert notice(None) == [] and notice(None) == []
    assert len(said) == 1 and str(target) in said[0]
    assert target.read_text().startswith("# The bill of rule all")


def test_a_text_experiments_runs_are_billed_as_finetune_runs(demo_with: Configure) -> None:
    grid = {"configurations": ["mha", "fc1"], "lrs": [1e-3, 1e-4], "seeds": [0, 1, 2]}
    text = {"optimizer": "adamw", "models": ["gpt2"], "datasets": ["a", "b"]}
    datasets = {
        "models": {"gpt2": {"family": "transformers", "hf_id": "gpt2", "weights": "hub"}},
        "datasets": {name: text_dataset(f"{name}.txt") for name in ("a", "b")},
    }
    config = demo_with({**datasets, "experiments": {"text": {**text, **grid}}})
    bill = compute_bill(config, JobRuntimes(config))
    (line,) = [line for line in bill.lines if line.model == "gpt2"]
    assert (line.rule, line.runs) == ("finetune", 2 * 2 * 2 * 3)  # datasets x grid
    off = demo_with({**datasets, "experiments": {"text": {**text, **grid, "enabled": False}}})
    assert not [line for line in compute_bill(off, JobRuntimes(off)).lines if line.model == "gpt2"]


def test_streamed_plasticity_jobs_are_billed_as_whole_ones(demo_with: Configure) -> None:
    """A streamed job asks for the whole measurement's time (streaming took 0.74x of it on the
    CPU benchmark, docs/benchmarks.md): every plasticity and text plasticity job is on the bill
    whatever its stream mode, and the bill does not change with it."""
    text = text_dataset("t.txt")
    bills = []
    for stream in ("never", "always", "auto"):
        config = demo_with(
            {
                "models": {"gpt2": {"family": "transformers", "hf_id": "gpt2", "weights": "hub"}},
                "datasets": {"ref": text, "notes": text},
                "plasticity": {"stream": stream},
                "text_plasticity": {
                    "enabled": True, "run_models": ["gpt2"], "reference": "ref",
                    "datasets": ["notes"], "stream": stream,
                },
            }
        )  # fmt: skip
        bills.append(compute_bill(config, JobRuntimes(config)))
        runs = {line.rule: line.runs for line in bills[-1].lines}
        assert runs["plasticity"] == len(config["plasticity"]["datasets"]) == 3
        assert runs["text_plasticity"] == 1
    assert bills[0] == bills[1] == bills[2]
