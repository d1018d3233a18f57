"""LaTeX tables (booktabs) of the paired tests, the plasticity and the criteria analysis (the
accuracy table: :mod:`.accuracy_table`).

Each ``*_table`` function returns the text of a complete ``table`` environment, ready for
``\\input`` (the document needs ``\\usepackage{booktabs}``); its ``*_csv`` twin returns the
same rows as CSV, the numbers as printed (for browsing, e.g. in ``snakemake --report``).
Accuracies print in percent with one decimal, ``mean`` with the seed std as a subscript; a
missing value prints as ``--`` (an empty CSV cell). Demo tables start with a ``% DEMO``
comment (``# DEMO`` in CSV) and say so in their caption.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from vitplasticity.criteria import short_label
from vitplasticity.report.criteria import (
    no_score_reasons,
    single_experiment,
    unscored_configurations,
)
from vitplasticity.report.criteria_statistics import RESULT_SCHEMA, minimum_p
from vitplasticity.report.plasticity_summary import plasticity_ranking
from vitplasticity.report.style import component_order, label
from vitplasticity.report.table_format import (
    MISSING,
    csv_text,
    escape,
    fixed,
    in_math,
    p_value,
    plain_cell,
    present,
    signed,
    table_environment,
)


def _wilcoxon_layout(
    comparison: pl.DataFrame,
) -> tuple[list[str], list[dict[str, str | None]]]:
    """The paired-test table's tabular lines (LaTeX) and the same rows as plain CSV cells."""
    models = comparison["model"].unique(maintain_order=True).to_list()
    multi = len(models) > 1
    head = ["Model"] if multi else []
    lines = [
        rf"\begin{{tabular}}{{{'l' * (len(head) + 1)}rrrrrrc}}",
        r"\toprule",
        " & ".join([*head, "vs.", "$n$", r"$\Delta$ (pp)", "$W$", "$p_W$", "$t$", "$p_t$", "Sig."])
        + r" \\",
        r"\midrule",
    ]
    records: list[dict[str, str | None]] = []
    for row in comparison.iter_rows(named=True):
        model = [escape(row["model"])] if multi else []
        t_present = present(row["ttest_stat"])
        cells = [
            escape(label(row["component"])),
            str(row["n_datasets"]),
            signed(100 * row["mean_diff"], 2),
            f"{row['wilcoxon_stat']:.1f}" if present(row["wilcoxon_stat"]) else MISSING,
            p_value(row["wilcoxon_p"]),
            signed(row["ttest_stat"], 2) if t_present else MISSING,
            p_value(row["ttest_p"]),
            "yes" if row["significant"] else "no",
        ]
        lines.append(" & ".join([*model, *cells]) + r" \\")
        # The same cells without LaTeX: the signed numbers outside math mode.
        plain = [label(row["component"]), *cells[1:]]
        plain[2] = f"{100 * row['mean_diff']:+.2f}"
        plain[5] = f"{row['ttest_stat']:+.2f}" if t_present else MISSING
        names = ("vs.", "n", "Delta (pp)", "W", "p_W", "t", "p_t", "Sig.")
        records.append(
            {"Model": row["model"], **{n: plain_cell(c) for n, c in zip(names, plain, strict=True)}}
        )
    lines += [r"\bottomrule", r"\end{tabular}"]
    return lines, records


def wilcoxon_table(comparison: pl.DataFrame, demo: bool = False, experiment: str = "") -> str:
    """The paired tests of :func:`..stats.compare_selected`, one row per compared component.

    Columns: mean difference (percentage points), Wilcoxon W and p, paired t and p, and
    whether the Wilcoxon p is below alpha.
    """
    if comparison.is_empty():
        raise ValueError("the comparison table is empty")
    first = comparison.row(0, named=True)
    reference, alternative, alpha = first["reference"], first["alternative"], first["alpha"]
    lines, _ = _wilcoxon_layout(comparison)
    side = {"greater": "greater", "less": "less", "two-sided": "different"}[alternative]
    caption = (
        rf"{escape(label(reference))} against each configuration"
        + (rf" in experiment \texttt{{{escape(experiment)}}}" if experiment else "")
        + rf": Wilcoxon signed-rank ($W$) and paired $t$-test over datasets, alternative "
        rf"``{escape(label(reference))} {side}''; $\Delta$: mean accuracy difference in "
        rf"percentage points; Sig.: $p_W < {alpha:g}$."
    )
    key = f"{experiment}-wilcoxon" if experiment else "wilcoxon"
    return table_environment(
        lines, caption, key, demo, f"{experiment or '<experiment>'}_wilcoxon.parquet"
    )


def wilcoxon_csv(comparison: pl.DataFrame, demo: bool = False) -> str:
    """:func:`wilcoxon_table`'s rows as CSV, the numbers as printed there (model always)."""
    if comparison.is_empty():
        raise ValueError("the comparison table is empty")
    return csv_text(_wilcoxon_layout(comparison)[1], demo)


def _plasticity_layout(
    summaries: pl.DataFrame,
) -> tuple[list[str], list[dict[str, str | None]]]:
    """The plasticity table's tabular lines (LaTeX) and the same rows as plain CSV cells."""
    ranking = plasticity_ranking(summaries)
    components = component_order(ranking["component"].to_list())
    protocols = ranking["protocol"].unique(maintain_order=True).to_list()
    multi = len(protocols) > 1
    head = ["Model", *(["Protocol"] if multi else [])]
    lines = [
        rf"\begin{{tabular}}{{{'l' * len(head)}{'c' * len(components)}}}",
        r"\toprule",
        " & ".join([*head, *(escape(label(c)) for c in components)]) + r" \\",
        r"\midrule",
    ]
    records: list[dict[str, str | None]] = []
    for (model, protocol), rows in ranking.group_by("model", "protocol", maintain_order=True):
        by = {r["component"]: r for r in rows.iter_rows(named=True)}
        cells = [
            f"{by[c]['mean']:.3f} ({by[c]['rank']})" if c in by else MISSING for c in components
        ]
        first = [escape(str(model)), *([escape(str(protocol))] if multi else [])]
        lines.append(" & ".join([*first, *cells]) + r" \\")
        record: dict[str, str | None] = {"Model": str(model), "Protocol": str(protocol)}
        for c in components:
            record[label(c)] = f"{by[c]['mean']:.3f}" if c in by else None
            record[f"{label(c)} rank"] = str(by[c]["rank"]) if c in by else None
        records.append(record)
    lines += [r"\bottomrule", r"\end{tabular}"]
    return lines, records


def plasticity_table(summaries: pl.DataFrame, demo: bool = False) -> str:
    """Per model (and protocol): each component's mean plasticity and its rank (1 = highest)."""
    lines, _ = _plasticity_layout(summaries)
    caption = (
        "Plasticity of each component: mean over blocks, datasets and image pairs, with its "
        "rank in parentheses (1: most plastic)."
    )
    return table_environment(
        lines, caption, "plasticity", demo, "results/plasticity/*_summary.parquet"
    )


def plasticity_csv(summaries: pl.DataFrame, demo: bool = False) -> str:
    """:func:`plasticity_table`'s rows as CSV: per model and protocol, each component's mean
    plasticity (as printed there) and its rank."""
    return csv_text(_plasticity_layout(summaries)[1], demo)


def _rho_cell(rho: float | None, hit: float | None = None, bold: bool = False) -> str:
    if not present(rho):
        return MISSING
    mark = r"^{\ast}" if hit == 1.0 else ""
    number = rf"\mathbf{{{rho:+.2f}}}" if bold else f"{rho:+.2f}"
    return f"${number}{mark}$"


def _criterion_header(name: str) -> str:
    """A criterion's column head on two lines at its first space ("Plast." over "(paper)"),
    so that seven criteria fit a page's width."""
    first, _, rest = short_label(name).partition(" ")
    if not rest:
        return escape(first)
    return rf"\begin{{tabular}}[b]{{@{{}}c@{{}}}}{escape(first)}\\{escape(rest)}\end{{tabular}}"


@dataclass
class _CriteriaRows:
    """The criteria table being built: its tabular lines (LaTeX) and the same rows as plain CSV
    records, one column per criterion."""

    criteria: list[str]
    lines: list[str] = field(default_factory=list)
    records: list[dict[str, str | None]] = field(default_factory=list)

    def add(
        self,
        model: str,
        names: tuple[str, str],
        cells: list[str],
        plain: list[str],
        **marked: list[str],
    ) -> None:
        """One table line (``names[0]`` heads it) and its CSV record (``names[1]``, ``plain``
        cells); ``marked``: the criteria with an asterisk (hit) or in bold (best)."""
        self.lines.append(" & ".join([names[0], *cells]) + r" \\")
        self.records.append(
            {
                "Model": model,
                "Row": names[1],
                **{
                    short_label(c): plain_cell(t) for c, t in zip(self.criteria, plain, strict=True)
                },
                **{
                    column: "; ".join(short_label(c) for c in marked.get(key, [])) or None
                    for key, column in (("hit", "Top-1 hit"), ("best", "Best"))
                },
            }
        )


def _criteria_layout(
    result: pl.DataFrame,
) -> tuple[list[str], list[dict[str, str | None]], int]:
    """The criteria table's tabular lines (LaTeX), the same rows as plain CSV cells, and the
    most datasets any criterion's test had (for the caption)."""
    per_dataset = result.filter(pl.col("level") == "dataset")
    summary = result.filter(pl.col("level") == "summary")
    criteria = per_dataset["criterion"].unique(maintain_order=True).to_list()
    models = per_dataset["model"].unique(maintain_order=True).to_list()
    table = _CriteriaRows(criteria)
    table.lines += [
        rf"\begin{{tabular}}{{l{'c' * len(criteria)}}}",
        r"\toprule",
        " & ".join(["Dataset", *(_criterion_header(c) for c in criteria)]) + r" \\",
    ]
    n_max = 0
    for model in models:
        table.lines.append(r"\midrule")
        if len(models) > 1:
            table.lines.append(
                rf"\multicolumn{{{len(criteria) + 1}}}{{l}}{{\emph{{{escape(model)}}}}} \\"
            )
        _criteria_dataset_rows(table, model, per_dataset.filter(pl.col("model") == model))
        by = {
            r["criterion"]: r
            for r in summary.filter(pl.col("model") == model).iter_rows(named=True)
        }
        _criteria_summary_rows(table, model, by, result)
        n_max = max([n_max, *(r["n"] for r in by.values())])
    table.lines += [r"\bottomrule", r"\end{tabular}"]
    return table.lines, table.records, n_max


def _criteria_dataset_rows(table: _CriteriaRows, model: str, rows: pl.DataFrame) -> None:
    """One model's dataset rows: each criterion's rho, an asterisk on a top-1 hit."""
    for dataset in rows["dataset"].unique(maintain_order=True).to_list():
        by_criterion = {
            r["criterion"]: r
            for r in rows.filter(pl.col("dataset") == dataset).iter_rows(named=True)
        }
        cells = [by_criterion.get(c) for c in table.criteria]
        table.add(
            model,
            (escape(dataset), dataset),
            [MISSING if r is None else _rho_cell(r["spearman_rho"], r["top1_hit"]) for r in cells],
            [MISSING if r is None else fixed(r["spearman_rho"], "+.2f") for r in cells],
            hit=[
                c for c, r in zip(table.criteria, cells, strict=True) if r and r["top1_hit"] == 1.0
            ],
        )


def _criteria_summary_rows(
    table: _CriteriaRows, model: str, by: dict[str, dict], result: pl.DataFrame
) -> None:
    """One model's summary rows (``by``: its summary row per criterion): mean rho (the best
    bold), mean tau, hit rate, n, the p of rho > 0, the best against each other, and n/a."""
    criteria = table.criteria
    empty = dict.fromkeys(RESULT_SCHEMA)
    get = [by.get(c, empty) for c in criteria]
    best = [c for c in criteria if c in by and by[c]["best"]]
    table.lines.append(r"\midrule")
    rho = [fixed(r["spearman_rho"], "+.2f") for r in get]
    tau = [fixed(r["kendall_tau"], "+.2f") for r in get]
    hit_rate = [fixed(r["top1_hit"], ".2f") for r in get]
    n = [MISSING if r["n"] is None else str(r["n"]) for r in get]
    p_rho = [p_value(r["wilcoxon_p"]) for r in get]
    bold_rho = [_rho_cell(r["spearman_rho"], bold=r["best"]) for r in get]
    table.add(model, (r"Mean $\rho$", "Mean rho"), bold_rho, rho, best=best)
    table.add(model, (r"Mean $\tau$", "Mean tau"), [in_math(t) for t in tau], tau)
    table.add(model, ("Hit rate", "Hit rate"), [in_math(h) for h in hit_rate], hit_rate)
    table.add(model, ("$n$", "n"), n, n)
    table.add(model, (r"$p$ ($\rho > 0$)", "p (rho > 0)"), p_rho, p_rho)
    if len(best) == 1 and len(criteria) > 1:
        pairwise = result.filter(
            (pl.col("level") == "pairwise")
            & (pl.col("model") == model)
            & (pl.col("criterion") == best[0])
        )
        versus = {r["versus"]: r["wilcoxon_p"] for r in pairwise.iter_rows(named=True)}
        p_best = [p_value(versus[c]) if c in versus else MISSING for c in criteria]
        table.add(model, (r"$p$ (best $>$)", "p (best >)"), p_best, p_best)
    unscored = unscored_configurations(result)
    if any((model, c) in unscored for c in criteria):
        names = [", ".join(label(n) for n in unscored.get((model, c), [])) for c in criteria]
        table.add(model, ("n/a", "n/a"), [escape(n) for n in names], [n or MISSING for n in names])


def _unscored_of(missing: dict[tuple[str, str], list[str]], criterion: str) -> list[str]:
    """The configurations ``criterion`` has no value for, over every model, in order."""
    names = {n for (_, c), found in missing.items() if c == criterion for n in found}
    return component_order(sorted(names))


def criteria_table(result: pl.DataFrame, demo: bool = False) -> str:
    """Datasets x criteria: Spearman rho of each criterion with the accuracy, then the summary
    rows: mean rho, mean tau, hit rate, the number n of datasets with a defined rho, the
    Wilcoxon p of rho > 0, and the p of the best criterion > each other.

    A rho carries an asterisk when the criterion's top configuration is the most accurate one
    (a top-1 hit); the best criterion's mean rho is bold. One block per model. When a criterion
    has no value for some configurations (NFN for the norms), a last ``n/a`` row names them
    under it and the caption says why: its rho is over the others.

    Args:
        result: one experiment's :func:`..criteria.analyse` result.
        demo: mark the table as a demo.
    """
    experiment = single_experiment(result)
    lines, _, n_max = _criteria_layout(result)
    several = result.filter(pl.col("level") == "dataset")["criterion"].n_unique() > 1
    missing = unscored_configurations(result)
    unscored = sorted({c for _, c in missing})
    reasons = [
        f"{escape(short_label(c))}: {escape('; '.join(why))}"
        for c in unscored
        if (why := no_score_reasons(c, _unscored_of(missing, c), label))
    ]
    caption = (
        rf"Rank correlation of each criterion with the selected-LR test accuracy over the "
        rf"configurations of each dataset in experiment \texttt{{{escape(experiment)}}}: "
        r"Spearman's $\rho$ per dataset ($^{\ast}$: the criterion's top configuration is the "
        r"most accurate); below, the means over datasets, the top-1 hit rate, the number $n$ "
        r"of datasets with a defined $\rho$, and the one-sided Wilcoxon signed-rank test of "
        r"the per-dataset $\rho$ against 0"
        + (
            rf" (with {n_max} datasets no $p$ can fall below $2^{{-{n_max}}} = "
            rf"{minimum_p(n_max):.3g}$)"
            if n_max
            else ""
        )
        + r". Best criterion (highest mean $\rho$) in bold"
        + (r", tested against each other one ($p$, best $>$)." if several else ".")
        + (
            " n/a: the configurations a criterion has no value for, left out of its $\\rho$"
            + (f" ({'; '.join(reasons)})" if reasons else "")
            + "."
            if unscored
            else ""
        )
    )
    return table_environment(
        lines, caption, f"{experiment}-criteria", demo, f"{experiment}_criteria.parquet"
    )


def criteria_csv(result: pl.DataFrame, demo: bool = False) -> str:
    """:func:`criteria_table`'s rows as CSV, the numbers as printed there: per model and row
    (each dataset, Mean rho, Mean tau, Hit rate, n, p (rho > 0), p (best >), and n/a: the
    configurations a criterion has no value for, where one has none), each
    criterion's value; ``Top-1 hit`` lists the criteria marked with an asterisk on a dataset
    row, ``Best`` the bold one(s) on the Mean rho row."""
    single_experiment(result)
    return csv_text(_criteria_layout(result)[1], demo)
