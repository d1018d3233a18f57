"""Which criterion predicts text finetuning? recommend --text's ranking checked against a text
experiment (an ``experiments:`` entry of text datasets), as :mod:`vitplasticity.report.criteria`
checks an image one.

The measured side is the image experiments' selection rule with loss for accuracy:
per (model, dataset, configuration) the learning rate whose runs reach the lowest mean (over
seeds) of their lowest validation loss. A learning rate with a diverged seed is not selected
(its mean is undefined); a configuration whose every learning rate diverged has no
measurement and is left out of the correlations (the report says which). Text runs have no
test split: the selected validation loss is the measurement, and its perplexity is reported
beside it.

The criteria are those of the image check: recommend --text's tables, the measured text
plasticity summaries (the paper's reading: more plasticity, better finetuning) and the
trainable-parameter baseline. Each is scored by :func:`.criteria.score_selectors` against
``-val_loss_mean`` (lower loss = better; only ranks matter): Spearman and Kendall per
(model, dataset), the top-1 hit, and the one-sided Wilcoxon of rho > 0 across datasets.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

from vitplasticity.criteria import PAPER_PLASTICITY, REGISTRY
from vitplasticity.report.criteria import best_criterion_lines, score_selectors

SELECTED_SCHEMA: dict[str, pl.DataType] = {
    "experiment": pl.String(),
    "model": pl.String(),
    "dataset": pl.String(),
    "configuration": pl.String(),
    "lr": pl.Float64(),
    "seeds": pl.Int64(),
    "val_loss_mean": pl.Float64(),
    "val_loss_std": pl.Float64(),
    "val_perplexity": pl.Float64(),
    "trainable_parameters": pl.Int64(),
    "note": pl.String(),
}
"""One row per (model, dataset, configuration): its selected learning rate and measurement
(``val_perplexity`` = exp(``val_loss_mean``); null with a ``note`` when nothing was measured)."""

SUMMARY_KEYS = (
    "model",
    "dataset",
    "configuration",
    "lr",
    "seed",
    "best_val_loss",
    "trainable_parameters",
)
"""The keys of a text run's summary.json the selection reads."""


def select_text_runs(summaries: Sequence[Mapping[str, Any]], experiment: str) -> pl.DataFrame:
    """The selected learning rate of every (model, dataset, configuration) of text runs.

    Args:
        summaries: the runs' summary.json contents (``vitplasticity finetune --text``).
        experiment: the text experiment they are the runs of.

    Returns:
        :data:`SELECTED_SCHEMA` rows, sorted by model, dataset and loss.

    Raises:
        ValueError: on a summary without a key of :data:`SUMMARY_KEYS` or of another
            experiment (naming it), or one run (model, dataset, configuration, lr, seed) twice.
    """
    cells: dict[tuple[str, str, str], dict[float, dict[int, Mapping[str, Any]]]] = {}
    for summary in summaries:
        missing = [key for key in SUMMARY_KEYS if key not in summary]
        if missing:
            raise ValueError(f"a text run summary lacks {', '.join(missing)}: {dict(summary)}")
        if summary.get("experiment", experiment) != experiment:
            raise ValueError(
                f"summary of experiment {summary['experiment']!r} given as a run of "
                f"{experiment!r}: {_run_name(summary)}"
            )
        cell = (summary["model"], summary["dataset"], summary["configuration"])
        seeds = cells.setdefault(cell, {}).setdefault(float(summary["lr"]), {})
        if int(summary["seed"]) in seeds:
            raise ValueError(f"text run given twice: {_run_name(summary)}")
        seeds[int(summary["seed"])] = summary
    rows = [_selected_row(experiment, cell, by_lr) for cell, by_lr in cells.items()]
    return pl.DataFrame(rows, schema=SELECTED_SCHEMA, orient="row").sort(
        "model", "dataset", "val_loss_mean", nulls_last=True
    )


def _run_name(summary: Mapping[str, Any]) -> str:
    return "/".join(
        str(summary.get(k)) for k in ("model", "dataset", "configuration", "lr", "seed")
    )


def _selected_row(
    experiment: str,
    cell: tuple[str, str, str],
    by_lr: Mapping[float, Mapping[int, Mapping[str, Any]]],
) -> dict[str, Any]:
    """The row of one cell: its learning rate of lowest mean loss over complete seeds."""
    model, dataset, configuration = cell
    means = {
        lr: statistics.fmean(run["best_val_loss"] for run in runs.values())
        for lr, runs in by_lr.items()
        if all(_finite(run["best_val_loss"]) for run in runs.values())
    }
    parameters = next(iter(next(iter(by_lr.values())).values()))["trainable_parameters"]
    row: dict[str, Any] = {
        "experiment": experiment,
        "model": model,
        "dataset": dataset,
        "configuration": configuration,
        "trainable_parameters": int(parameters),
    }
    if not means:
        return {
            **row,
            "lr": None,
            "seeds": 0,
            "val_loss_mean": None,
            "val_loss_std": None,
            "val_perplexity": None,
            "note": f"every learning rate diverged ({', '.join(map(str, sorted(by_lr)))})",
        }
    lr = min(means, key=lambda value: (means[value], value))  # a tie: the smaller rate
    losses = [run["best_val_loss"] for run in by_lr[lr].values()]
    return {
        **row,
        "lr": lr,
        "seeds": len(losses),
        "val_loss_mean": means[lr],
        "val_loss_std": statistics.stdev(losses) if len(losses) > 1 else None,
        "val_perplexity": math.exp(means[lr]),
        "note": "",
    }


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


def score_text_criteria(
    criteria: pl.DataFrame,
    selected: pl.DataFrame,
    *,
    experiment: str,
    configurations: Sequence[str] | None,
    min_configurations: int,
) -> pl.DataFrame:
    """Every criterion against the selected validation loss (:func:`select_text_runs`) of
    ``experiment``: :func:`.criteria.score_selectors` with accuracy = -loss."""
    measured = selected.filter(pl.col("val_loss_mean").is_not_null()).select(
        "model", "dataset", "configuration", accuracy=-pl.col("val_loss_mean")
    )
    if measured.is_empty():
        raise ValueError("no text run reached a validation loss: nothing to score against")
    return score_selectors(
        criteria,
        measured,
        experiment=experiment,
        configurations=configurations,
        min_configurations=min_configurations,
    )


def absent_criteria(
    criteria: pl.DataFrame, selected: pl.DataFrame, *, parameters: bool
) -> dict[tuple[str, str], dict[str, str]]:
    """Per (model, dataset) of ``selected``: each criterion of the registry that ``criteria``
    has no score of there, with why (where its scores come from and what left them out), so
    that the report never shows one criterion as if it were the only one.

    Args:
        criteria: the criteria frame scored (:data:`.criteria.CRITERION_SCHEMA`).
        selected: :func:`select_text_runs`' rows.
        parameters: whether the trainable-parameter baseline was asked for.
    """
    absent: dict[tuple[str, str], dict[str, str]] = {}
    for model, dataset in selected.select("model", "dataset").unique(maintain_order=True).rows():
        cell = criteria.filter((pl.col("model") == model) & (pl.col("dataset") == dataset))
        present = set(cell["criterion"].to_list())
        sources = set(cell["source"].to_list())
        reasons = {
            name: _absence(entry.source, name, sources, parameters, f"{model} on {dataset}")
            for name, entry in REGISTRY.items()
            if name not in present
        }
        if reasons:
            absent[(model, dataset)] = reasons
    return absent


def _absence(source: str, name: str, sources: set[str], parameters: bool, cell: str) -> str:
    """Why criterion ``name`` (from ``source``) has no score for ``cell``, whose criteria come
    from ``sources``."""
    if source == "parameters":
        return "left out by report.criteria.parameters: false (--no-parameters)"
    if source == "plasticity" and source not in sources:
        return (
            f"no text plasticity summary of {cell}: plasticity is scored where text_plasticity "
            "measures the experiment's model and dataset (text_plasticity.enabled, run_models, "
            "datasets)"
        )
    if source == "plasticity":
        protocol = "embedding" if name == PAPER_PLASTICITY else name.removeprefix("plasticity_")
        return f"not measured: text_plasticity.protocols lacks {protocol}"
    if source not in sources:
        return (
            f"no recommend --text table of {cell}: recommend --text ranks a causal LM (an encoder has "
            "no next-token loss) where recommend.enabled and text plasticity measures the cell"
        )
    return "recommend --text's table has no finite value of it for any configuration"


def _number(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def text_criteria_markdown(
    selected: pl.DataFrame,
    result: pl.DataFrame,
    absent: Mapping[tuple[str, str], Mapping[str, str]],
    *,
    demo: bool,
) -> str:
    """The report: the selected runs per (model, dataset), then each criterion's rho, tau and
    top-1 hit per dataset, each absent criterion as n/a with why (``absent``:
    :func:`absent_criteria`), the tests across datasets and the best criterion per model (of
    those scored, the others named)."""
    lines = ["# Which criterion predicts text finetuning?", ""]
    if demo:
        lines += ["**DEMO**: tiny random-init models on synthetic text, not a finding.", ""]
    lines += [
        "Measured: per configuration, the learning rate of lowest mean validation loss over "
        "seeds (lower is better); the criteria are scored against it by Spearman's rho and "
        "Kendall's tau (scipy), the top-1 hit, and the one-sided Wilcoxon test of rho > 0 "
        "across datasets (docs/protocol.md, the criteria check).",
        "",
    ]
    for (model, dataset), part in selected.partition_by(
        "model", "dataset", as_dict=True, maintain_order=True
    ).items():
        lines += [
            f"## {model} on {dataset}",
            "",
            "| configuration | lr | seeds | val loss | perplexity | trainable parameters | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in part.iter_rows(named=True):
            lines.append(
                f"| {row['configuration']} | {_number(row['lr'])} | {row['seeds']} | "
                f"{_number(row['val_loss_mean'])} | {_number(row['val_perplexity'])} | "
                f"{row['trainable_parameters']} | {row['note']} |"
            )
        scored = result.filter(
            (pl.col("level") == "dataset")
            & (pl.col("model") == model)
            & (pl.col("dataset") == dataset)
        )
        lines += [
            "",
            "| criterion | configurations | Spearman rho | Kendall tau | top-1 hit | note |",
            "|---|---|---|---|---|---|",
        ]
        for row in scored.iter_rows(named=True):
            lines.append(
                f"| {row['criterion']} | {row['configurations']} | "
                f"{_number(row['spearman_rho'], 3)} | {_number(row['kendall_tau'], 3)} | "
                f"{_number(row['top1_hit'], 3)} | {row['note'] or ''} |"
            )
        for name, why in absent.get((model, dataset), {}).items():
            lines.append(f"| {name} | 0 | n/a | n/a | n/a | {why} |")
        lines.append("")
    lines += ["## Across datasets", ""]
    lines += [f"- {line}" for line in best_criterion_lines(result)] or ["- no criterion scored"]
    unscored = sorted({name for reasons in absent.values() for name in reasons})
    if unscored:
        lines.append(
            f"- Best among the criteria scored only: {', '.join(unscored)} had no score for "
            "some (model, dataset) (n/a rows above, with why)."
        )
    return "\n".join(lines) + "\n"
