"""The settings of ``vitplasticity criteria``, declared once
(:mod:`vitplasticity.settings.declaration`): :class:`CriteriaSettings` (config
``report.criteria``). Torch-free: the Snakefile and every ``--help`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from vitplasticity.components import COMPONENTS
from vitplasticity.plasticity.settings import demo_setting
from vitplasticity.settings.declaration import setting

__all__ = ["CriteriaSettings"]


@dataclass(frozen=True, kw_only=True)
class CriteriaSettings:
    """How ``vitplasticity criteria`` scores the criteria (config ``report.criteria``)."""

    configurations: tuple[str, ...] = setting(
        COMPONENTS,
        help="configurations compared (the five components); 'all' for every configuration "
        "that has both a score and an accuracy",
        key="report.criteria.configurations",
        quote=True,
    )
    min_configurations: int = setting(
        3,
        help="fewest configurations a correlation is computed on",
        key="report.criteria.min_configurations",
        minimum=2,
    )
    parameters: bool = setting(
        True,
        help="leave out the trainable-parameter baseline criterion (more = predicted better)",
        key="report.criteria.parameters",
        switch=True,
        inverted=True,
    )
    demo: bool = demo_setting()
