"""Paired tests of one component against the others (public entry point).

``vitplasticity.stats.compare_components`` is the Wilcoxon signed-rank + paired t-test of the
paper's Table 1; the implementation lives in :mod:`vitplasticity.report.stats`.
"""

from vitplasticity.report.stats import compare_components, compare_selected

__all__ = ["compare_components", "compare_selected"]
