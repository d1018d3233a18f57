"""The selection criteria, one :class:`Criterion` entry each (plain Python, no imports of the
package): what a criterion is called, which end of it is finetuned first, when it has no value
and why, and where ``recommend`` finds the items it pools.

Everything that names criteria reads this registry: recommend's measurement
(:meth:`vitplasticity.recommend.criteria.Measurements.estimates`), its ranking, report and
figure (:mod:`vitplasticity.recommend.ranking`, :mod:`vitplasticity.recommend.figure`), the
``--criterion`` flag and ``recommend.criterion`` key (:mod:`vitplasticity.recommend.settings`),
and the criteria check's labels and n/a notes (:mod:`vitplasticity.report.criteria`).
workflow/schemas/config.schema.yaml restates :data:`RECOMMEND_CRITERIA` as its enum
(tests/test_criteria_registry.py keeps the two equal). Torch-free: the Snakefile imports the
settings that read it.

Adding a criterion: one entry in :data:`REGISTRY`; for one recommend measures, also the
column its items are written in by what measures them (the :class:`Items` it names), and the
name in the schema's ``recommend.criterion`` enum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Direction = Literal["higher", "lower"]
"""Which end of a criterion is finetuned first (rank 1)."""

SOURCES: tuple[str, ...] = ("recommend", "plasticity", "parameters")
"""Where the criteria check takes a criterion's scores from: ``vitplasticity recommend``'s
tables, the measured plasticity summaries, or the finetuning table's parameter counts."""

PAPER_PLASTICITY = "plasticity_paper_protocol"
"""The measured plasticity under the paper's protocol (embedding), as the criteria check
names it (another protocol ``p``: ``plasticity_<p>``)."""

PARAMETERS = "trainable_parameters"
"""The trainable-parameter baseline of the criteria check (more = predicted better)."""


@dataclass(frozen=True)
class Items:
    """Where recommend finds a criterion's per-item values (ratios, tensors, blocks, maps) and
    how a configuration pools them: the unweighted mean over the rows of its components
    (:func:`vitplasticity.recommend.criteria.pooled_estimate`)."""

    measured: str
    """The field of :class:`vitplasticity.recommend.criteria.Measurements` holding the rows."""
    column: str
    """The rows' column holding the criterion's value (the rows' ``component`` says whose)."""
    drop_undefined: bool = True
    """Leave items whose value is not finite out (a tensor of weight norm 0, a norm's NFN);
    False: one NaN item makes the configuration n/a (the weight statistic refused for a
    component: ``mha+fc1`` must not become the mean of fc1 alone)."""
    interval: bool = False
    """Whether the value has a 95% CI: mean +/- 1.96 std / sqrt(n) over the n pooled items
    (ddof 1; none below 2 items)."""


@dataclass(frozen=True)
class Criterion:
    """One selection criterion: a score per configuration that says what to finetune first."""

    name: str
    """As in the ``criterion`` column of recommend's and the criteria check's tables."""
    label: str
    """How recommend's report and figure print it."""
    short_label: str
    """How the criteria check's tables and figures print it (seven fit a page's width)."""
    source: str
    """Where the criteria check takes its scores from (:data:`SOURCES`)."""
    direction: Direction = "higher"
    """Which end is finetuned first: the highest value, or the lowest (PLoP's NFN,
    KappaTune's condition number)."""
    norms_na: str | None = None
    """Why it has no value for a configuration of norms alone (LN1, LN2); None: it has one."""
    linear_na: str | None = None
    """Why it can have no value for a configuration holding a linear component (every item of
    it n/a); None: it always has one there."""
    items: Items | None = None
    """What recommend measures and pools; None for a criterion recommend does not measure."""
    basis: str | None = None
    """What a recommendation by it rests on, completing "This is ...": the heuristic and its
    source (recommend's criteria, and only they, have one)."""

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(
                f"criterion {self.name!r}: source {self.source!r} not one of {', '.join(SOURCES)}"
            )
        if (self.items is not None) != (self.source == "recommend"):
            raise ValueError(
                f"criterion {self.name!r}: recommend's criteria (and only they) name their items"
            )
        if (self.basis is not None) != (self.source == "recommend"):
            raise ValueError(
                f"criterion {self.name!r}: recommend's criteria (and only they) state their basis"
            )

    @property
    def lower_first(self) -> bool:
        """Whether the *lowest* value is finetuned first."""
        return self.direction == "lower"

    @property
    def preference(self) -> float:
        """+1 when the highest value is finetuned first, -1 when the lowest is."""
        return -1.0 if self.lower_first else 1.0


_NO_MATRIX = "a norm holds no weight matrix, so it has no"
_PAPER = (
    "a heuristic from the paper's finding that components of higher plasticity gain more from "
    "finetuning (Odonnat et al., arXiv 2602.06883)"
)

REGISTRY: Mapping[str, Criterion] = MappingProxyType(
    {
        entry.name: entry
        for entry in (
            # Odonnat et al.: the paper's measurement (plasticity.measure), per (block, pair).
            Criterion(
                "plasticity",
                "plasticity",
                "Plast. (rec.)",
                "recommend",
                items=Items("pairs", "ratio", interval=True),
                basis=_PAPER,
            ),
            # Auto-RGN (Lee et al. 2023, Surgical Fine-Tuning): ||g|| / ||w|| per tensor.
            Criterion(
                "relative_gradient_norm",
                "relative gradient norm",
                "Rel. grad.",
                "recommend",
                items=Items("tensors", "relative_gradient_norm"),
                basis=(
                    "Surgical Fine-Tuning's Auto-RGN heuristic that the tensors of largest "
                    "gradient norm relative to their weight norm gain most from finetuning "
                    "(Lee et al., ICLR 2023)"
                ),
            ),
            Criterion(
                "gradient_snr",
                "gradient SNR",
                "Grad. SNR",
                "recommend",
                items=Items("tensors", "gradient_snr"),
                basis=(
                    "the heuristic that the tensors whose gradient agrees most across batches "
                    "(highest gradient signal-to-noise ratio) learn the task most readily"
                ),
            ),
            # The weight factor of the paper's Section 4 bounds, per (block, component).
            Criterion(
                "weight_spectral",
                "weight spectral",
                "Spectral",
                "recommend",
                items=Items("weights", "weight_spectral", drop_undefined=False),
                basis=(
                    "a heuristic from the paper's bounds, in which a component's weight "
                    "spectral norm bounds its plasticity (Odonnat et al., arXiv 2602.06883, "
                    "Section 4)"
                ),
            ),
            # PLoP (Hayou et al., ICLR 2026) places its adapters on the modules of lowest NFN,
            # the least aligned with the task's inputs, and shows the highest (its PLoP^-1)
            # do worse: for NFN, higher is not better.
            Criterion(
                "nfn",
                "NFN",
                "NFN",
                "recommend",
                direction="lower",
                norms_na="a norm holds no linear map, so it has no NFN",
                linear_na="no linear map of it had an input of nonzero norm, so it has no NFN",
                items=Items("features", "nfn"),
                basis=(
                    "PLoP's heuristic that the modules least aligned with the task's inputs "
                    "(lowest NFN) gain most from adaptation (Hayou et al., ICLR 2026)"
                ),
            ),
            # Spectrum (Hartford et al. 2024): recommend/matrix_criteria.py says why per matrix.
            Criterion(
                "spectrum_snr",
                "Spectrum SNR",
                "Spectrum SNR",
                "recommend",
                norms_na=f"{_NO_MATRIX} Spectrum SNR",
                linear_na=(
                    "Spectrum's SNR is n/a for every weight matrix of it: no singular value at "
                    "or below the Marchenko-Pastur threshold (Spectrum's value would be "
                    "sum(s)/s_max, not a signal-to-noise ratio: e.g. a random-init FC1 or FC2, "
                    "whose singular values bunch), or a zero matrix "
                    "(recommend/matrix_criteria.py)"
                ),
                items=Items("matrices", "spectrum_snr"),
                basis=(
                    "Spectrum's heuristic that the weight matrices of highest signal-to-noise "
                    "ratio carry the most to finetune (Hartford et al., 2024)"
                ),
            ),
            # KappaTune (Ludwig 2025) finetunes the tensors of lowest condition number, the
            # least anisotropic.
            Criterion(
                "kappa",
                "kappa",
                "kappa",
                "recommend",
                direction="lower",
                norms_na=f"{_NO_MATRIX} condition number",
                linear_na=(
                    "every weight matrix of it is zero or singular, so it has no condition number"
                ),
                items=Items("matrices", "kappa"),
                basis=(
                    "KappaTune's heuristic that the weight tensors of lowest condition number, "
                    "the least anisotropic, can be finetuned with the least forgetting "
                    "(Ludwig, 2025)"
                ),
            ),
            # The measured plasticity summaries (the paper's reading: more plasticity, better).
            Criterion(PAPER_PLASTICITY, "plasticity (paper)", "Plast. (paper)", "plasticity"),
            Criterion(
                "plasticity_in_situ", "plasticity (in situ)", "Plast. (in situ)", "plasticity"
            ),
            # The naive baseline any criterion should beat.
            Criterion(PARAMETERS, "trainable parameters", "Params", "parameters"),
        )
    }
)
"""Every known criterion by name, recommend's first in the order of their table's columns."""

RECOMMEND_CRITERIA: tuple[str, ...] = tuple(
    name for name, entry in REGISTRY.items() if entry.source == "recommend"
)
"""The criteria recommend measures and ranks by, in the order of its report's columns (the
``--criterion`` choices)."""

LOWER_FIRST: frozenset[str] = frozenset(n for n, e in REGISTRY.items() if e.lower_first)
"""The criteria whose *lowest* value is finetuned first."""

NA_FOR_NORMS: frozenset[str] = frozenset(n for n, e in REGISTRY.items() if e.norms_na)
"""The criteria that have no value for a configuration of norms alone."""


def short_label(name: str) -> str:
    """How the criteria check prints criterion ``name`` (an unknown one as it is named)."""
    entry = REGISTRY.get(name)
    return name if entry is None else entry.short_label
