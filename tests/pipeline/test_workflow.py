"""The workflow end to end through `snakemake`, on the mini preset, in a temporary directory.

One module-scoped run of `all` serves every test here: targets, caching, partial reruns after
a config edit, and the HTML report.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from tests.helpers.workflow import planned_jobs, snakemake
from vitplasticity.utils.io import read_parquet_metadata

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workflow")


def test_one_table_plans_only_its_own_chain(workdir: Path) -> None:
    """Before anything ran: no plasticity, no figures, no other experiment."""
    jobs = planned_jobs(snakemake(workdir, "-n", "results/demo/tables/sgd_accuracy.tex"))
    assert set(jobs) == {"prepare", "finetune", "aggregate_experiment", "table_accuracy", "total"}
    assert jobs["finetune"] == 2 * 3  # sgd: 2 datasets x 3 configurations
    assert jobs["prepare"] == 2  # not the reference set, not a dataset only adam uses


@pytest.fixture(scope="module")
def finished_run(workdir: Path) -> Path:
    """The mini preset run to completion once for the module's tests."""
    result = snakemake(workdir, "all")
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    return workdir


def test_every_stage_produced_its_files(finished_run: Path) -> None:
    results = finished_run / "results/demo"
    pairs = pl.read_parquet(results / "plasticity/demo_vit/demo-stripes.parquet")
    assert set(pairs["component"]) == {"ln1", "mha", "ln2", "fc1", "fc2"}
    assert pairs.height == 64 * 3 * 5  # pairs x blocks x components, embedding protocol
    assert (
        read_parquet_metadata(results / "plasticity/demo_vit/demo-stripes.parquet")["demo"] is True
    )
    summary_file = next((results / "finetune/sgd/demo_vit/demo-stripes/mha").glob("*/summary.json"))
    summary = json.loads(summary_file.read_text())
    assert summary["demo"] is True and summary["status"] in {"completed", "diverged"}
    assert not list(results.glob("finetune/**/checkpoint*")), (
        "checkpoints must go away on completion"
    )
    runs = pl.read_parquet(results / "aggregate/runs.parquet")
    assert runs.height == 2 * 3 + 2  # sgd: 2 datasets x 3 configurations; adam: 1 x 2
    for name in (
        "tables/sgd_accuracy.tex",
        "tables/sgd_wilcoxon.tex",
        "tables/plasticity.tex",
        "stats/sgd_wilcoxon.parquet",
        "figures/optimizers.png",
        "figures/plasticity_depth/demo_vit.pdf",
        "bounds/demo_vit.parquet",
    ):
        assert (results / name).is_file(), name
    assert (results / "tables/sgd_accuracy.tex").read_text().startswith("% DEMO")


def test_nothing_reruns_on_an_unchanged_config(finished_run: Path) -> None:
    assert planned_jobs(snakemake(finished_run, "-n", "all")) == {}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # A figure setting reruns figure rules only.
        ("report:\n  figures:\n    dpi: 120\n", None),
        # A plasticity setting reruns plasticity and what reads it, never finetuning.
        ("plasticity:\n  n_pairs: 32\n", {"plasticity": 2}),
        # A dataset's step count reruns that dataset's runs only (adam does not use demo-blobs),
        # and does not re-prepare the dataset.
        ("datasets:\n  demo-blobs:\n    steps: 12\n", {"finetune": 3}),
    ],
)
def test_editing_one_key_reruns_only_what_depends_on_it(
    finished_run: Path, tmp_path: Path, edit: str, expected: dict | None
) -> None:
    edit_file = tmp_path / "edit.yaml"
    edit_file.write_text(edit)
    jobs = planned_jobs(snakemake(finished_run, "-n", "all", extra_configfiles=(edit_file,)))
    jobs.pop("all", None)
    jobs.pop("total", None)
    assert jobs, "the edit must rerun something"
    if expected is None:
        # criteria_figure: on in the demo because recommend.enabled turns the criteria on.
        figure_rules = [rule for rule in jobs if rule.startswith("figure_")]
        assert set(jobs) - set(figure_rules) <= {"criteria_figure"}, jobs
        return
    for rule, count in expected.items():
        assert jobs.get(rule) == count, jobs
    assert "prepare" not in jobs and "reference" not in jobs
    if "plasticity" in expected:
        assert "finetune" not in jobs
    if "finetune" in expected:
        assert "plasticity" not in jobs


def test_html_report_holds_every_figure_and_table(finished_run: Path) -> None:
    report = finished_run / "report.html"
    result = snakemake(finished_run, "--report", str(report))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    html = report.read_text(errors="replace")
    for name in ("sgd_accuracy.tex", "plasticity.tex", "optimizers.png", "demo_vit.png"):
        assert name in html, name
