"""vitplasticity.provenance records the version of every installed library that computes a
number of a result."""

from __future__ import annotations

from importlib import metadata

import pytest

from vitplasticity.provenance import versions

COMPUTING = ["torch", "timm", "transformers", "tokenizers", "peft", "numpy", "safetensors"]


@pytest.mark.parametrize("package", COMPUTING)
def test_the_version_of_each_installed_computing_library_is_recorded(package: str) -> None:
    try:
        installed = metadata.version(package)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed here")
    assert versions()[package] == installed
