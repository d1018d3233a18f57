"""What one ``recommend --text`` recommendation takes beside its declared settings
(:class:`vitplasticity.recommend.settings.RecommendTextSettings`), and what it gives: shared by
the stage (:mod:`vitplasticity.recommend.text`) and its outputs
(:mod:`vitplasticity.recommend.text_report`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from vitplasticity.plasticity.settings import PROTOCOLS
from vitplasticity.recommend.criteria import Measurements
from vitplasticity.recommend.ranking import Recommendation
from vitplasticity.recommend.settings import (
    RecommendImageSettings,
    RecommendTextSettings,
    check_dtype,
)


@dataclass(frozen=True)
class TextRecommendInputs:
    """What one text recommendation is of: the model (its name in the outputs and its
    ``models:`` entry), the dataset's name, the reference and the user's text files (``texts``:
    ``--text``), and two flags the workflow leaves at their defaults (so no config key): the
    plasticity protocol and the compute dtype. Each field is the CLI flag of that name."""

    model: str
    dataset: str
    model_spec: dict[str, Any]
    reference: str
    texts: tuple[str, ...]
    protocol: str = "embedding"
    dtype: str = "float32"
    labelled_text: str | None = None
    """A labelled text dataset (:mod:`vitplasticity.data.labelled`) instead of ``texts``: the
    model is ranked as a sequence classifier with a new head, by the classification loss."""
    warmup_steps: int = RecommendImageSettings.warmup_steps
    """With ``labelled_text``: the new head's warm-up, as the image recommend's."""
    warmup_lr: float = RecommendImageSettings.warmup_lr

    def validate(self) -> None:
        """Check every file and value before any compute.

        Raises:
            ValueError: naming the CLI flag of the first bad value.
            FileNotFoundError: naming a text file that does not exist.
        """
        for flag, path in (("--reference", self.reference), *(("--text", t) for t in self.texts)):
            if not Path(path).is_file():
                raise FileNotFoundError(f"{flag}: text file not found: {path}")
        if self.labelled_text is None and not self.texts:
            raise ValueError("--text: no text file given")
        if self.labelled_text is not None:
            if self.texts:
                raise ValueError("recommend: give --text or --labelled-text, not both")
            if not Path(self.labelled_text).exists():
                raise FileNotFoundError(f"--labelled-text: not found: {self.labelled_text}")
            if self.warmup_steps < 0 or not self.warmup_lr > 0:
                raise ValueError("--warmup-steps must be >= 0 and --warmup-lr > 0")
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"--protocol: {self.protocol!r} not one of {', '.join(PROTOCOLS)}")
        check_dtype(self.dtype)


@dataclass(frozen=True)
class TextResult:
    """A text recommendation and what it was made from."""

    inputs: TextRecommendInputs
    settings: RecommendTextSettings
    table: pl.DataFrame
    recommendation: Recommendation
    measurements: Measurements
    reference_label: str
    notes: list[str]
    """What the report says below the table beyond the image recommend's text."""
    record: dict[str, Any]
    """The resolved settings and provenance, for the Parquet footer."""
    export: dict[str, Any]
    """The decision as data (:mod:`.export`), with where its names sit in the causal LM."""
