"""The Snakemake workflow catalog's standardized layout: the files the catalog and snakedeploy
look for are where they look, and the catalog file holds the keys the catalog reads."""

from __future__ import annotations

import re

import yaml

from tests.helpers.repo import REPO


def test_the_standardized_layout_is_in_place() -> None:
    for name in ("workflow/Snakefile", "config/config.yaml", "config/README.md"):
        assert (REPO / name).is_file(), name
    assert not (REPO / "Snakefile").exists() and not (REPO / "config.yaml").exists()
    # snakedeploy copies the root profiles/ folder: the rules' resources and the cluster's.
    assert (REPO / "profiles/default/profile.yaml").is_file()
    assert (REPO / "profiles/slurm/profile.yaml").is_file()


def test_the_catalog_file_has_the_keys_the_catalog_reads() -> None:
    catalog = yaml.safe_load((REPO / ".snakemake-workflow-catalog.yml").read_text())
    assert set(catalog) == {"usage"}
    usage = catalog["usage"]
    assert set(usage) == {"mandatory-flags", "software-stack-deployment", "report"}
    assert set(usage["mandatory-flags"]) == {"desc", "flags"}
    assert isinstance(usage["mandatory-flags"]["desc"], str)
    assert isinstance(usage["mandatory-flags"]["flags"], str)
    deployment = usage["software-stack-deployment"]
    assert set(deployment) <= {"conda", "apptainer", "apptainer+conda"}
    assert all(isinstance(value, bool) for value in deployment.values())
    # conda deployment is claimed only while the rules name the environment file
    assert deployment["conda"] == (REPO / "environment.yml").is_file()
    assert isinstance(usage["report"], bool)


def test_the_config_readme_names_files_that_exist() -> None:
    text = (REPO / "config/README.md").read_text()
    for name in re.findall(r"`(?:config/)?([\w.]+\.yaml)`", text):
        folder = REPO / "config" if (REPO / "config" / name).exists() else REPO
        assert list(folder.rglob(name)), f"config/README.md names {name}, which is nowhere"
    for path in re.findall(r"`((?:docs|workflow|slurm)/[\w./-]+)`", text):
        assert (REPO / path).exists(), f"config/README.md names {path}, which is not there"
