"""The accuracy table (LaTeX, booktabs) and its CSV twin: datasets x configurations, the
selected-LR test accuracy, with each model's average, gain over linear probing and trainable
parameters (formats: :mod:`.table_format`; the other tables: :mod:`.tables`).
"""

from __future__ import annotations

import polars as pl

from vitplasticity.report.style import configuration_order, label
from vitplasticity.report.table_format import (
    MISSING,
    csv_text,
    escape,
    parameter_count,
    percent,
    plain_cell,
    present,
    signed,
    table_environment,
)


def _parameters_cell(counts: list[int]) -> str:
    """The trainable parameters of one configuration: one count, or its range over datasets
    (the new head's size follows each dataset's number of classes)."""
    if not counts:
        return MISSING
    low, high = min(counts), max(counts)
    return (
        parameter_count(low) if low == high else f"{parameter_count(low)}--{parameter_count(high)}"
    )


def _accuracy_cell(mean: float | None, std: float | None, bold: bool) -> str:
    if not present(mean):
        return MISSING
    value = rf"\textbf{{{percent(mean)}}}" if bold else percent(mean)
    spread = f"{100 * std:.1f}" if present(std) else MISSING
    return rf"{value}\textsubscript{{$\pm${spread}}}"


def _best(values: dict[str, float | None], candidates: list[str]) -> set[str]:
    """The candidates whose value, as printed, is the row's highest (ties all win)."""
    shown = {c: round(100 * values[c], 1) for c in candidates if present(values.get(c))}
    if not shown:
        return set()
    top = max(shown.values())
    return {c for c, v in shown.items() if v == top}


def _accuracy_layout(
    selected: pl.DataFrame, columns: list[str]
) -> tuple[list[str], list[dict[str, str | None]]]:
    """The accuracy table's tabular lines (LaTeX) and the same rows as plain CSV cells."""
    models = selected["model"].unique(maintain_order=True).to_list()
    lines = [
        rf"\begin{{tabular}}{{l{'c' * len(columns)}}}",
        r"\toprule",
        " & ".join(["Dataset", *(escape(label(c)) for c in columns)]) + r" \\",
    ]
    records: list[dict[str, str | None]] = []
    for model in models:
        rows = selected.filter(pl.col("model") == model)
        lines.append(r"\midrule")
        if len(models) > 1:
            lines.append(rf"\multicolumn{{{len(columns) + 1}}}{{l}}{{\emph{{{escape(model)}}}}} \\")
        means = _accuracy_dataset_rows(model, rows, columns, lines, records)
        average = {
            c: (sum(v) / len(v) if v and all(present(x) for x in v) else None)  # type: ignore[misc]
            for c, v in means.items()
        }
        _accuracy_summary_rows(model, rows, columns, average, lines, records)
    lines += [r"\bottomrule", r"\end{tabular}"]
    return lines, records


def _accuracy_record(
    model: str, row: str, columns: list[str], values: list[str], stds: list[str], best: set[str]
) -> dict[str, str | None]:
    """One CSV record of the accuracy table: each configuration's value and std, the best."""
    cells: dict[str, str | None] = {"Model": model, "Dataset": row}
    for c, value, std in zip(columns, values, stds, strict=True):
        cells[label(c)], cells[f"{label(c)} std"] = plain_cell(value), plain_cell(std)
    best_labels = "; ".join(label(c) for c in columns if c in best)
    return {**cells, "Best": best_labels or None}


def _finetuned(columns: list[str]) -> list[str]:
    """The configurations that can be bold: all but linear probing (the baseline)."""
    return [c for c in columns if c != "head"]


def _accuracy_dataset_rows(
    model: str,
    rows: pl.DataFrame,
    columns: list[str],
    lines: list[str],
    records: list[dict[str, str | None]],
) -> dict[str, list[float | None]]:
    """Append one model's dataset rows; return each configuration's means, dataset by dataset."""
    means: dict[str, list[float | None]] = {c: [] for c in columns}
    for dataset in rows["dataset"].unique(maintain_order=True).to_list():
        cells = {
            r["configuration"]: r
            for r in rows.filter(pl.col("dataset") == dataset).iter_rows(named=True)
        }
        mean = {c: cells[c]["test_accuracy_mean"] if c in cells else None for c in columns}
        std = {c: cells[c]["test_accuracy_std"] if c in cells else None for c in columns}
        for c in columns:
            means[c].append(mean[c])
        best = _best(mean, _finetuned(columns))
        row = [
            _accuracy_cell(mean[c], std[c], c in best) if c in cells else MISSING for c in columns
        ]
        lines.append(" & ".join([escape(dataset), *row]) + r" \\")
        spreads = [percent(std[c]) if present(mean[c]) else MISSING for c in columns]
        values = [percent(mean[c]) for c in columns]
        records.append(_accuracy_record(model, dataset, columns, values, spreads, best))
    return means


def _accuracy_summary_rows(
    model: str,
    rows: pl.DataFrame,
    columns: list[str],
    average: dict[str, float | None],
    lines: list[str],
    records: list[dict[str, str | None]],
) -> None:
    """Append one model's Average row, its gain over linear probing (when the experiment has
    ``head``) and its trainable parameters (when the table has them)."""
    best = _best(average, _finetuned(columns))
    lines.append(r"\midrule")
    cells = [
        rf"\textbf{{{percent(average[c])}}}" if c in best else percent(average[c]) for c in columns
    ]
    lines.append(" & ".join(["Average", *cells]) + r" \\")
    no_spread = [MISSING] * len(columns)
    values = [percent(average[c]) for c in columns]
    records.append(_accuracy_record(model, "Average", columns, values, no_spread, best))
    head = average.get("head")
    if "head" in columns and present(head) and head > 0:  # type: ignore[operator]
        gains = [
            100 * (average[c] - head) / head  # type: ignore[operator]
            if c != "head" and present(average[c])
            else None
            for c in columns
        ]
        printed = [MISSING if g is None else signed(g, 1) for g in gains]
        lines.append(" & ".join([r"Gain over LP (\%)", *printed]) + r" \\")
        plain = [MISSING if g is None else f"{g:+.1f}" for g in gains]
        records.append(
            _accuracy_record(model, "Gain over LP (%)", columns, plain, no_spread, set())
        )
    if "trainable_parameters" in rows.columns:
        counts = [
            _parameters_cell(
                rows.filter(pl.col("configuration") == c)["trainable_parameters"]
                .drop_nulls()
                .to_list()
            )
            for c in columns
        ]
        lines.append(" & ".join(["Trainable params", *counts]) + r" \\")
        ranges = [count.replace("--", "-") for count in counts]
        records.append(
            _accuracy_record(model, "Trainable params", columns, ranges, no_spread, set())
        )


def accuracy_table(selected: pl.DataFrame, demo: bool = False) -> str:
    """Datasets x configurations: selected-LR test accuracy, mean and std over seeds.

    The best finetuning configuration of each row is bold (linear probing, ``head``, is the
    baseline and never bold). Below the datasets: the mean over datasets of each column
    (``--`` when a dataset lacks it) and, when the experiment has ``head``, the relative gain
    of each configuration's mean over linear probing's, in percent; last, each configuration's
    trainable parameter count (its range over datasets). One block per model.

    Args:
        selected: one experiment's selected-LR table (:func:`..aggregate.select_learning_rates`).
        demo: mark the table as a demo.
    """
    if selected.is_empty():
        raise ValueError("the selected-LR table is empty")
    experiment = selected["experiment"][0]
    lr_selection = selected["lr_selection"][0]
    columns = configuration_order(selected["configuration"].to_list())
    lines, _ = _accuracy_layout(selected, columns)
    selection = "validation" if lr_selection == "val" else "test"
    caption = (
        rf"Test accuracy (\%) of experiment \texttt{{{escape(experiment)}}} per finetuned "
        rf"configuration: mean$\pm$std over seeds at the learning rate with the best seed-mean "
        rf"{selection} accuracy; best configuration per row in bold"
        + ("; LP: linear probing (head only)." if "head" in columns else ".")
    )
    return table_environment(
        lines, caption, f"{experiment}-accuracy", demo, f"{experiment}_selected.parquet"
    )


def accuracy_csv(selected: pl.DataFrame, demo: bool = False) -> str:
    """:func:`accuracy_table`'s rows as CSV, the numbers as printed there: per model and row
    (each dataset, Average, Gain over LP (%), Trainable params), each configuration's value
    and its seed std, and the row's best configurations (bold in the .tex)."""
    if selected.is_empty():
        raise ValueError("the selected-LR table is empty")
    columns = configuration_order(selected["configuration"].to_list())
    return csv_text(_accuracy_layout(selected, columns)[1], demo)
