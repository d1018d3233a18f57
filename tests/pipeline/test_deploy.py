"""The workflow deployed as a Snakemake module into a folder of the user's own, the Snakemake
workflow catalog's way (`snakedeploy deploy-workflow`), then run there on that folder's config.

snakedeploy deploys from a local clone here (the test needs no network). Its local provider
writes the module's `snakefile:` relative to the clone's root (`"workflow/Snakefile"`), which
Snakemake reads relative to the deployed Snakefile; from a hosted repository it writes
`github("<owner>/vitplasticity", path="workflow/Snakefile", tag=...)` instead. So the test
points that one line at the clone, and checks everything else as deployed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.repo import REPO
from tests.helpers.workflow import PRESETS, planned_jobs

pytestmark = pytest.mark.slow

# The mini preset cut to one dataset: every rule of its `all` still runs (each experiment keeps
# two configurations beside head, as its Wilcoxon test needs), half its finetuning runs.
ONE_DATASET = {
    "plasticity": {"datasets": ["demo-stripes"]},
    "experiments": {"sgd": {"datasets": ["demo-stripes"], "configurations": ["mha", "fc1"]}},
}


def local_clone(destination: Path) -> Path:
    """The checkout's files as git sees them (tracked, and untracked but not ignored: no .venv,
    no results), copied into ``destination``: what a clone of this working tree holds."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listing.split("\0")):
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in the index
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return destination


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the clone, the folder snakedeploy deployed it into)."""
    root = tmp_path_factory.mktemp("deploy")
    clone = local_clone(root / "vitplasticity")
    folder = root / "my-project"
    bindir = Path(sys.executable).parent
    result = subprocess.run(
        [str(bindir / "snakedeploy"), "deploy-workflow", str(clone), str(folder), "--tag", "v0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return clone, folder


def test_snakedeploy_copies_the_config_and_profiles_and_declares_the_module(
    deployed: tuple[Path, Path],
) -> None:
    clone, folder = deployed
    for name in ("config.yaml", "README.md", "demo.yaml", "demo_slurm.yaml"):
        assert (folder / "config" / name).read_bytes() == (clone / "config" / name).read_bytes()
    assert (folder / "profiles/default/profile.yaml").is_file()  # the rules' resources
    assert (folder / "profiles/slurm/profile.yaml").is_file()  # --profile profiles/slurm
    snakefile = (folder / "workflow/Snakefile").read_text()
    assert re.search(r"^module vitplasticity:", snakefile, re.M), snakefile
    assert 'configfile: "config/config.yaml"' in snakefile
    assert "use rule * from vitplasticity" in snakefile


def test_the_demo_runs_in_the_deployed_folder_on_its_own_config(
    deployed: tuple[Path, Path],
) -> None:
    clone, folder = deployed
    snakefile = folder / "workflow/Snakefile"
    text = snakefile.read_text()
    assert '"workflow/Snakefile"' in text  # the local provider's path (module docstring)
    snakefile.write_text(
        text.replace('"workflow/Snakefile"', repr(str(clone / "workflow/Snakefile")))
    )
    # The user's own config, written to their folder and into a results folder of their
    # naming: the smallest demo that runs every stage, and their cut of it to one dataset.
    mini = PRESETS[-1]  # the smallest preset the workflow tests run
    assert mini.name == "mini.yaml"
    mine = yaml.safe_load(mini.read_text())
    mine["paths"] = {"resources": "resources/mine", "results": "results/mine"}
    (folder / "config/mine.yaml").write_text(yaml.safe_dump(mine))
    (folder / "config/one_dataset.yaml").write_text(yaml.safe_dump(ONE_DATASET))
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    snakemake = [str(bindir / "snakemake"), "--cores", "2"]
    configs = ["--configfile", "config/demo.yaml", "config/mine.yaml"]
    # What the whole mini preset would run (a dry run), then the run of the cut.
    run = {"cwd": folder, "env": env, "capture_output": True, "text": True}
    planned = subprocess.run([*snakemake, "-n", *configs, "--", "all"], timeout=300, **run)
    configs.append("config/one_dataset.yaml")
    result = subprocess.run([*snakemake, *configs, "--", "all"], timeout=1500, **run)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert "profiles/default" in result.stdout + result.stderr  # the deployed rule resources
    # The cut runs every rule that the whole mini preset would.
    assert set(planned_jobs(result)) == set(planned_jobs(planned)), planned.stdout[-3000:]
    results = folder / "results/mine"
    assert (results / "tables/sgd_accuracy.tex").is_file()
    assert list((results / "figures/plasticity_depth").glob("*.png"))
    assert list((results / "plasticity").glob("*/*.parquet"))
    # Everything was written in the user's folder; the workflow's own stays untouched.
    assert [path.name for path in (clone / "results").iterdir()] == ["README.md"]
    assert not (clone / "resources").exists() and not (clone / ".snakemake").exists()
