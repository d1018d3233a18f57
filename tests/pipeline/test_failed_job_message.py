"""A failed job says why on the console: the workflow's onerror handler adds the last error
line of each failed job's log to Snakemake's report, which names the log only. End to end on
a tiny failing demo job (an image_folder dataset whose images do not decode) with
--keep-going beside one that succeeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.demo_workflow import workflow_args
from tests.helpers.slurm_harness import REPO, run_snakemake

pytestmark = pytest.mark.slow


def undecodable_image_folder(root: Path) -> Path:
    """A <class>/<image> tree whose images are text."""
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        (root / label / "x.png").write_text("not a png")
    return root


def test_the_console_names_why_each_failed_job_failed(tmp_path: Path) -> None:
    root = undecodable_image_folder(tmp_path / "mine")
    dataset = {"source": "image_folder", "root": str(root), "steps": 1, "val_every": 1}
    args = workflow_args(tmp_path, {"datasets": {"mine": dataset}})
    targets = [f"{tmp_path}/resources/datasets/{name}" for name in ("mine", "demo-stripes")]
    result = run_snakemake([*args, "--cores", "1", "--keep-going", *targets], REPO, check=False)
    out = result.stdout
    assert result.returncode != 0, out
    report = out[out.index("Why each failed job failed (the last error line of its log):") :]
    line = report.splitlines()[1]
    assert line.startswith(f"  prepare ({tmp_path}/resources/logs/prepare/mine.log): "), report
    assert "x.png: not a decodable image" in line and "datasets.mine.root" in line, report
    assert len([x for x in report.splitlines() if x.startswith("  prepare (")]) == 1, report
    assert (tmp_path / "resources/datasets/demo-stripes").is_dir()  # the other job completed
