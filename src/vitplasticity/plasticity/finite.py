"""A measurement that produced NaN or inf stops instead of becoming a result: one vectorised
check of a table's measured columns, naming the model and the first (block, component) at
fault. Damaged weights are refused when they load (:mod:`vitplasticity.models.checked_weights`);
what reaches here is an overflow in the forward pass (float16, huge activations).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import polars as pl

PAIR_MEASURED = ("numerator", "denominator")
"""The columns of a plasticity pairs table that are measured (its ratio is NaN, by design, for
a pair of identical inputs: 0 / 0)."""


def check_finite_rows(table: pl.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise unless every value of ``columns`` of ``table`` is finite (null values are not
    measured ones and pass).

    Args:
        table: rows with ``block`` and ``component`` columns (and maybe ``protocol``).
        columns: the measured float columns to check.
        what: the measurement, for the message (e.g. ``plasticity of model 'tiny' on pets``).

    Raises:
        ValueError: naming ``what``, the first row's protocol, block and component, the column
            and value, and how many rows are not finite.
    """
    if not columns or table.is_empty():
        return
    bad = table.filter(pl.any_horizontal(pl.col(name).is_finite().not_() for name in columns))
    if bad.is_empty():
        return
    row = bad.row(0, named=True)
    column = next(n for n in columns if row[n] is not None and not math.isfinite(row[n]))
    protocol = f"protocol {row['protocol']}, " if "protocol" in row else ""
    raise ValueError(
        f"{what}: {column} is {row[column]} at {protocol}block {row['block']}, component "
        f"{row['component']} ({len(bad)} of {len(table)} rows not finite): the model overflows "
        "or its weights are damaged; nothing was written (try dtype float32 or float64)"
    )
