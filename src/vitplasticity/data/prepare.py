"""Prepare a dataset from its config entry: one entry point for every source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vitplasticity.data.imagefolder import prepare_image_folder
from vitplasticity.data.synthetic import prepare_synthetic
from vitplasticity.settings.sequences import TEXT_SOURCES


def prepare_dataset(
    name: str,
    spec: dict[str, Any],
    out_dir: str | os.PathLike[str],
    *,
    downloads: str | os.PathLike[str] = "resources/downloads",
) -> dict[str, int]:
    """Prepare dataset ``name`` (its config entry ``spec``) into ``out_dir``; return split sizes.

    Raises:
        ValueError: for an unknown source, naming the dataset and the known sources.
    """
    source = spec.get("source")
    if source in TEXT_SOURCES:
        raise ValueError(
            f"datasets.{name}: a text dataset (source: {source}) is not prepared: the text "
            "stages read its path as it is"
        )
    if source == "synthetic":
        return prepare_synthetic(out_dir, name, spec)
    if source == "image_folder":
        if "root" not in spec:
            raise ValueError(f"datasets.{name}.root: required for source 'image_folder'")
        return prepare_image_folder(spec["root"], out_dir, name)
    from vitplasticity.data import sources

    if source not in sources.SOURCES:
        known = ["synthetic", "image_folder", *sources.SOURCES, *TEXT_SOURCES]
        raise ValueError(f"datasets.{name}.source: unknown source {source!r}; known: {known}")
    return sources.SOURCES[source].prepare(name, spec, Path(out_dir), Path(downloads))
