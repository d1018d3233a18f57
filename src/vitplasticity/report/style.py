"""One look for every figure: the component colours, the seaborn theme, the DEMO label.

The palette is Okabe-Ito (Okabe & Ito 2008), safe for the common colour-vision deficiencies.
Each component keeps its colour in every figure of the project, the bounds figure included:
import :data:`COMPONENT_COLOURS` rather than picking colours locally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vitplasticity.components import COMPONENTS

COMPONENT_COLOURS: dict[str, str] = {
    "ln1": "#56B4E9",  # sky blue
    "mha": "#D55E00",  # vermillion
    "ln2": "#0072B2",  # blue
    "fc1": "#E69F00",  # orange
    "fc2": "#009E73",  # bluish green
}
"""Component -> colour, the same in every figure."""

CONFIGURATION_COLOURS: dict[str, str] = {
    **COMPONENT_COLOURS,
    "full": "#000000",  # black
    "emb": "#CC79A7",  # reddish purple
    "head": "#999999",  # grey: linear probing, the baseline
}
"""Finetuning configuration -> colour: the components' colours plus full, emb and head."""

COMBINATION_COLOUR = "#666666"
"""Colour of a '+' combination of configurations (no fixed colour of its own)."""

COMPONENT_LABELS: dict[str, str] = {
    "ln1": "LN1",
    "mha": "MHA",
    "ln2": "LN2",
    "fc1": "FC1",
    "fc2": "FC2",
    "full": "Full",
    "emb": "Emb",
    "head": "LP",
}
"""How a configuration is printed in figures and tables (head = linear probing, LP)."""

DEMO_NOTE = "DEMO: synthetic data, tiny random-init ViT, not the paper's result"
"""The label every demo figure and table carries."""

# The order of vitplasticity.models.architectures.CONFIGURATIONS, restated so that the report stage
# does not import torch (the registry does) only to sort columns.
_COLUMN_ORDER: tuple[str, ...] = ("full", "emb", *COMPONENTS)

assert set(COMPONENT_COLOURS) == set(COMPONENTS), "a component has no colour"


def label(configuration: str) -> str:
    """The printed name of a configuration, combinations joined with '+' ("MHA+FC1")."""
    return "+".join(COMPONENT_LABELS.get(part, part) for part in configuration.split("+"))


def colour(configuration: str) -> str:
    """The colour of a configuration; combinations share :data:`COMBINATION_COLOUR`."""
    return CONFIGURATION_COLOURS.get(configuration, COMBINATION_COLOUR)


def palette(configurations: list[str]) -> dict[str, str]:
    """A seaborn palette mapping each configuration (as given) to its fixed colour."""
    return {name: colour(name) for name in configurations}


def apply_theme(context: str = "paper") -> None:
    """Set the Agg backend and the seaborn theme shared by every figure.

    Args:
        context: seaborn context (paper, notebook, talk, poster): scales fonts and lines.
    """
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(context=context, style="whitegrid", font_scale=0.9)
    matplotlib.rcParams.update(
        {
            "pdf.fonttype": 42,  # embed TrueType: text stays text in the paper's PDF
            "svg.fonttype": "none",  # SVG text stays searchable text
            "savefig.bbox": "tight",
            "axes.titlesize": "medium",
            "legend.frameon": False,
            # Tick labels say the value itself: no "+1e2" offset on a narrow accuracy axis.
            "axes.formatter.useoffset": False,
        }
    )


def mark_demo(figure: Any) -> None:
    """Write :data:`DEMO_NOTE` across the top of ``figure``, in red, where nobody can miss it."""
    figure.suptitle(DEMO_NOTE, color="#C00000", fontsize="small", fontweight="bold")


def configuration_order(configurations: Sequence[str]) -> list[str]:
    """Canonical column order: full, emb, the components, combinations, then head (LP)."""
    rank = {name: index for index, name in enumerate(_COLUMN_ORDER)}
    present = list(dict.fromkeys(configurations))
    return sorted(
        present,
        key=lambda name: (name == "head", rank.get(name, len(rank)), name),
    )


def component_order(names: Sequence[str]) -> list[str]:
    """The components among ``names`` in the paper's order (:data:`.components.COMPONENTS`),
    then any other names, sorted."""
    present = set(names)
    return [c for c in COMPONENTS if c in present] + sorted(present - set(COMPONENTS))
