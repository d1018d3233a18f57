"""Which components should I finetune? The paper's answer for any model and dataset, in minutes.

:mod:`.criteria` measures, per component of a timm ViT, its plasticity (the paper's
criterion) and four alternatives side by side (PLoP's NFN in :mod:`.nfn`); :mod:`.ranking`
ranks configurations per criterion, picks one under a trainable-parameter budget and writes
the Markdown report; :mod:`.figure` draws them; :mod:`.pipeline` is the stage (read the data,
build the model, measure, choose, write) that the ``vitplasticity recommend`` command calls.
"""

from vitplasticity.recommend.criteria import CRITERIA, Measurements, measure_criteria
from vitplasticity.recommend.pipeline import RecommendSettings, recommend, write_outputs
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
    "RecommendSettings",
    "Recommendation",
    "build_table",
    "greedy_union",
    "markdown",
    "measure_criteria",
    "parse_budget",
    "recommend",
    "select",
    "write_outputs",
]
