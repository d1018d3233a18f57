"""recommend's ranking as the verification reads it: the ``configuration, criterion, rank``
rows, and in the Parquet footer the keys of the model it ranked where
:func:`vitplasticity.recommend.pipeline.footer_record` writes them (``model``, and its spec
under ``provenance.settings.model_spec``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from vitplasticity.utils.io import write_parquet


def ranking_file(
    path: Path, rows: Sequence[tuple[str, str, int]], model: str, model_spec: dict[str, Any]
) -> Path:
    """Write a ranking of ``model`` (spec ``model_spec``) with ``rows`` at ``path``."""
    table = pl.DataFrame(rows, schema=["configuration", "criterion", "rank"], orient="row")
    footer = {"model": model, "provenance": {"settings": {"model_spec": model_spec}}}
    write_parquet(path, table, footer)
    return path
