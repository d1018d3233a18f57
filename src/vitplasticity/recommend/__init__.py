"""Which components should I finetune? The paper's answer for any model and dataset, in minutes.

:mod:`.criteria` measures, per component of a timm ViT, its plasticity (the paper's
criterion) and three alternatives side by side; :mod:`.ranking` ranks configurations per
criterion, picks one under a trainable-parameter budget and writes the Markdown report;
:mod:`.figure` draws them. The ``vitplasticity recommend`` command wires them together.
"""

from vitplasticity.recommend.criteria import CRITERIA, Measurements, measure_criteria
from vitplasticity.recommend.ranking import (
    TABLE_SCHEMA,
    Recommendation,
    build_table,
    greedy_union,
    markdown,
    parse_budget,
    select,
)

__all__ = [
    "CRITERIA",
    "TABLE_SCHEMA",
    "Measurements",
    "Recommendation",
    "build_table",
    "greedy_union",
    "markdown",
    "measure_criteria",
    "parse_budget",
    "select",
]
