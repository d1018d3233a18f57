"""The report's tables and figures, each declared once: the rule that makes one and the
targets that ask for it (``rule all``) read the same declaration.

A table is a .tex and a .csv file, both shown in the HTML report (``snakemake --report``); a
figure is one file per configured format (``report.figures.formats``), the PNG (else the first
format) shown. Figure rules take only the ``report.figures`` settings (:meth:`ReportFiles.
figure_params`), so editing one of those reruns only figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snakemake.io import expand
from snakemake.io import report as report_flag

from vitplasticity.workflow.params import demo_flag

# Where the captions are, relative to the rule files (Snakemake resolves a caption against
# the folder of the file that defines the rule): workflow/report/<caption>.rst.
CAPTIONS = "../report"
TABLE_FORMATS = ("tex", "csv")
# The end of every figure command: its report.figures settings, the demo label, the outputs.
FIGURE_FLAGS = (
    " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
    " {params.demo_flag} --out {output:q} > {log:q} 2>&1"
)


@dataclass(frozen=True)
class Shown:
    """A table or figure of the report.

    Attributes:
        stem: its path below ``<results>/tables`` or ``<results>/figures``, without the
            format; may hold wildcards (``accuracy/{experiment}``).
        caption: its caption's file name in workflow/report, without ``.rst``.
        subcategory: where the HTML report files it (may hold the stem's wildcards).
    """

    stem: str
    caption: str
    subcategory: str


TABLES: dict[str, Shown] = {
    "accuracy": Shown("{experiment}_accuracy", "table_accuracy", "{experiment}"),
    "wilcoxon": Shown("{experiment}_wilcoxon", "table_wilcoxon", "{experiment}"),
    "plasticity": Shown("plasticity", "table_plasticity", "plasticity"),
    "criteria": Shown("{experiment}_criteria", "criteria_table", "{experiment}"),
}
FIGURES: dict[str, Shown] = {
    "plasticity_boxplot": Shown(
        "plasticity_boxplot/{model}/{scope}", "figure_plasticity_boxplot", "plasticity"
    ),
    "plasticity_depth": Shown("plasticity_depth/{model}", "figure_plasticity_depth", "plasticity"),
    "accuracy": Shown("accuracy/{experiment}", "figure_accuracy", "{experiment}"),
    "robustness": Shown("robustness/{experiment}", "figure_robustness", "{experiment}"),
    "curves": Shown(
        "curves/{experiment}/{model}/{dataset}", "figure_curves", "{experiment} curves"
    ),
    "optimizers": Shown("optimizers", "figure_optimizers", "optimizers"),
    "bounds": Shown("bounds_{model}", "figure_bounds", "bounds"),
    "criteria": Shown("criteria/{experiment}", "criteria_figure", "{experiment}"),
}


def _stems(stem: str, wildcards: dict[str, Any]) -> list[str]:
    return expand(stem, **wildcards) if wildcards else [stem]


class ReportFiles:
    """The files of the declared tables and figures below ``<results>`` (config
    ``paths.results``), in the formats the config asks for.

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.results = config["paths"]["results"]
        self.figure_formats: list[str] = config["report"]["figures"]["formats"]

    def table_outputs(self, name: str) -> dict[str, Any]:
        """The outputs of table ``name``'s rule: ``tex`` and ``csv``, both in the report."""
        table = TABLES[name]
        return {
            fmt: report_flag(
                f"{self.results}/tables/{table.stem}.{fmt}",
                caption=f"{CAPTIONS}/{table.caption}.rst",
                category="Tables",
                subcategory=table.subcategory,
            )
            for fmt in TABLE_FORMATS
        }

    def table_files(self, name: str, **wildcards: list[str]) -> list[str]:
        """The .tex and .csv files of table ``name`` (``wildcards`` expanded)."""
        stems = _stems(TABLES[name].stem, wildcards)
        return [f"{self.results}/tables/{s}.{fmt}" for s in stems for fmt in TABLE_FORMATS]

    def figure_outputs(self, name: str) -> list[Any]:
        """The outputs of figure ``name``'s rule: one file per configured format; the PNG
        (else the first format) goes into the report."""
        figure = FIGURES[name]
        shown = "png" if "png" in self.figure_formats else self.figure_formats[0]
        files = {fmt: f"{self.results}/figures/{figure.stem}.{fmt}" for fmt in self.figure_formats}
        files[shown] = report_flag(
            files[shown],
            caption=f"{CAPTIONS}/{figure.caption}.rst",
            category="Figures",
            subcategory=figure.subcategory,
        )
        return list(files.values())

    def figure_files(self, name: str, **wildcards: list[str]) -> list[str]:
        """The files of figure ``name`` (``wildcards`` expanded) in every configured format."""
        stems = _stems(FIGURES[name].stem, wildcards)
        return [f"{self.results}/figures/{s}.{fmt}" for s in stems for fmt in self.figure_formats]

    def figure_params(self) -> dict[str, Any]:
        """The params of every figure rule: only report.figures, and the demo switch."""
        figures = self.config["report"]["figures"]
        return {
            "width_in": figures["width_in"],
            "dpi": figures["dpi"],
            "context": figures["context"],
            "demo_flag": demo_flag(self.config),
        }
