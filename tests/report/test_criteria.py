"""Criteria against measured accuracy (report/criteria.py): per-dataset rank correlations
checked against scipy and a direct float64 computation, the cross-dataset Wilcoxon tests
against scipy, ties and constant columns, the table, the figure and the CLI."""

from __future__ import annotations

import itertools
import math
import re
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from tests.helpers.latex import compile_tables, needs_latex
from tests.helpers.report_inputs import plasticity_summary, write_grid
from vitplasticity.cli import main
from vitplasticity.components import COMPONENTS
from vitplasticity.criteria import PARAMETERS, short_label
from vitplasticity.report import criteria as C
from vitplasticity.report.aggregate import collect_runs, select_learning_rates
from vitplasticity.report.criteria_statistics import minimum_p, wilcoxon_greater
from vitplasticity.report.style import DEMO_NOTE
from vitplasticity.report.table_format import p_value
from vitplasticity.report.tables import criteria_table
from vitplasticity.utils.io import read_parquet_metadata, write_parquet


def _selected(accuracy: dict[str, dict[str, float | None]], experiment: str = "sgd"):
    """A selected-LR table from {dataset: {configuration: accuracy}} (model "vit")."""
    rows = [
        {
            "experiment": experiment,
            "model": "vit",
            "dataset": dataset,
            "configuration": configuration,
            "test_accuracy_mean": value,
            "trainable_parameters": 100 + 10 * index,
        }
        for dataset, cells in accuracy.items()
        for index, (configuration, value) in enumerate(cells.items())
    ]
    return pl.DataFrame(
        rows,
        schema={
            "experiment": pl.String,
            "model": pl.String,
            "dataset": pl.String,
            "configuration": pl.String,
            "test_accuracy_mean": pl.Float64,
            "trainable_parameters": pl.Int64,
        },
    )


def _criteria(scores: dict[str, dict[str, dict[str, float]]]) -> pl.DataFrame:
    """A criteria frame from {criterion: {dataset: {configuration: score}}}."""
    rows = [
        {
            "model": "vit",
            "dataset": dataset,
            "configuration": configuration,
            "criterion": criterion,
            "source": "test",
            "score": value,
        }
        for criterion, per_dataset in scores.items()
        for dataset, cells in per_dataset.items()
        for configuration, value in cells.items()
    ]
    return pl.DataFrame(rows, schema=C.CRITERION_SCHEMA)


def _random_grid(rng: np.random.Generator, n_datasets: int = 6):
    """Random accuracies (on a 1/128 grid, so some tie) and two random criteria, one of them
    with tied scores."""
    accuracy = {
        f"ds{d}": {c: float(rng.integers(60, 120)) / 128 for c in COMPONENTS}
        for d in range(n_datasets)
    }
    scores = {
        "gauss": {d: {c: float(rng.normal()) for c in COMPONENTS} for d in accuracy},
        "coarse": {d: {c: float(rng.integers(0, 3)) for c in COMPONENTS} for d in accuracy},
    }
    return accuracy, scores


def _rank_average(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their average rank (written out, not scipy's)."""
    ranks = np.empty(values.size)
    for index, value in enumerate(values):
        below = np.sum(values < value)
        equal = np.sum(values == value)
        ranks[index] = below + (equal + 1) / 2
    return ranks


def _tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b by counting pairs."""
    concordant = discordant = ties_x = ties_y = 0
    for i, j in itertools.combinations(range(x.size), 2):
        sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
        if sx == 0 and sy == 0:
            continue
        if sx == 0:
            ties_x += 1
        elif sy == 0:
            ties_y += 1
        elif sx == sy:
            concordant += 1
        else:
            discordant += 1
    return (concordant - discordant) / math.sqrt(
        (concordant + discordant + ties_x) * (concordant + discordant + ties_y)
    )


def test_rho_and_tau_equal_scipy_and_a_direct_computation() -> None:
    accuracy, scores = _random_grid(np.random.default_rng(0))
    result = C.analyse(_criteria(scores), _selected(accuracy))
    rows = result.filter(pl.col("level") == "dataset")
    assert rows.height == 2 * len(accuracy)
    for row in rows.iter_rows(named=True):
        x = np.array([scores[row["criterion"]][row["dataset"]][c] for c in COMPONENTS])
        y = np.array([accuracy[row["dataset"]][c] for c in COMPONENTS])
        spearman, kendall = stats.spearmanr(x, y), stats.kendalltau(x, y)
        assert row["n"] == 5 and row["configurations"] == ",".join(COMPONENTS)
        if np.all(x == x[0]) or np.all(y == y[0]):
            assert math.isnan(row["spearman_rho"]) and "constant" in row["note"]
            continue
        assert row["spearman_rho"] == pytest.approx(float(spearman.statistic), abs=1e-12)
        assert row["spearman_p"] == pytest.approx(float(spearman.pvalue), abs=1e-12)
        assert row["kendall_tau"] == pytest.approx(float(kendall.statistic), abs=1e-12)
        assert row["kendall_p"] == pytest.approx(float(kendall.pvalue), abs=1e-12)
        # Independently: Pearson of average ranks, and tau-b by counting pairs.
        direct = np.corrcoef(_rank_average(x), _rank_average(y))[0, 1]
        assert row["spearman_rho"] == pytest.approx(direct, abs=1e-12)
        assert row["kendall_tau"] == pytest.approx(_tau_b(x, y), abs=1e-12)
    # The tie-prone criterion did produce ties, and they are reported.
    assert rows.filter(pl.col("note").str.contains("criterion ties")).height > 0


def test_perfect_and_reversed_predictors() -> None:
    rng = np.random.default_rng(1)
    accuracy = {
        f"ds{d}": dict(zip(COMPONENTS, rng.permutation(5) / 10 + 0.5, strict=True))
        for d in range(5)
    }
    scores = {
        "oracle": {d: {c: 3 * a + 1 for c, a in cells.items()} for d, cells in accuracy.items()},
        "reversed": {d: {c: -a for c, a in cells.items()} for d, cells in accuracy.items()},
    }
    result = C.analyse(_criteria(scores), _selected(accuracy))
    per = result.filter(pl.col("level") == "dataset")
    oracle = per.filter(pl.col("criterion") == "oracle")
    assert oracle["spearman_rho"].to_list() == pytest.approx([1.0] * 5)
    assert oracle["kendall_tau"].to_list() == pytest.approx([1.0] * 5)
    assert oracle["top1_hit"].to_list() == [1.0] * 5
    assert (oracle["criterion_best"] == oracle["accuracy_best"]).all()
    backwards = per.filter(pl.col("criterion") == "reversed")
    assert backwards["spearman_rho"].to_list() == pytest.approx([-1.0] * 5)
    assert backwards["top1_hit"].to_list() == [0.0] * 5

    summary = {
        r["criterion"]: r for r in result.filter(pl.col("level") == "summary").iter_rows(named=True)
    }
    assert summary["oracle"]["spearman_rho"] == pytest.approx(1.0)
    assert summary["oracle"]["top1_hit"] == 1.0 and summary["reversed"]["top1_hit"] == 0.0
    assert summary["oracle"]["best"] and not summary["reversed"]["best"]
    # Every rho positive over 5 datasets: the smallest p the test can give, 2^-5.
    assert summary["oracle"]["wilcoxon_p"] == pytest.approx(1 / 32)
    assert summary["oracle"]["min_p"] == 1 / 32 and summary["oracle"]["n"] == 5
    assert summary["reversed"]["wilcoxon_p"] == pytest.approx(1.0)
    pair = result.filter(
        (pl.col("level") == "pairwise")
        & (pl.col("criterion") == "oracle")
        & (pl.col("versus") == "reversed")
    ).row(0, named=True)
    assert pair["rho_difference"] == pytest.approx(2.0)
    assert pair["wilcoxon_p"] == pytest.approx(1 / 32)
    (line,) = C.best_criterion_lines(result)
    assert line.startswith("sgd/vit: best criterion oracle (mean rho +1.000")


def test_the_baseline_scored_alone_is_no_best_criterion() -> None:
    """With the trainable-parameter baseline the only criterion scored (recommend --text does
    not rank an encoder), the report names no best criterion and says why."""
    accuracy = {f"d{d}": {c: 0.5 + 0.01 * i for i, c in enumerate(COMPONENTS)} for d in range(3)}
    scores = {PARAMETERS: {d: {c: i for i, c in enumerate(COMPONENTS)} for d in accuracy}}
    result = C.analyse(_criteria(scores), _selected(accuracy))
    (line,) = C.best_criterion_lines(result)
    assert line == "sgd/vit: no best criterion (only the trainable-parameter baseline was scored)"
    assert not result.filter(pl.col("level") == "summary")["best"].any()


def test_ties_constant_columns_and_too_few_configurations_give_nan_with_a_reason() -> None:
    accuracy = {
        "tied": {"ln1": 0.5, "mha": 0.9, "ln2": 0.6, "fc1": 0.7, "fc2": 0.8},
        "flat": dict.fromkeys(COMPONENTS, 0.25),
        "few": {"ln1": 0.5, "mha": 0.9, "ln2": None, "fc1": None, "fc2": None},
    }
    scores = {
        # mha and fc2 tie at the top: half a hit on "tied"
        "top_tie": {d: {"ln1": 0, "mha": 5, "ln2": 1, "fc1": 2, "fc2": 5} for d in accuracy},
        "constant": {d: dict.fromkeys(COMPONENTS, 1.0) for d in accuracy},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no scipy warning escapes: undefined is handled first
        result = C.analyse(_criteria(scores), _selected(accuracy))
    rows = {
        (r["dataset"], r["criterion"]): r
        for r in result.filter(pl.col("level") == "dataset").iter_rows(named=True)
    }
    tie = rows[("tied", "top_tie")]
    x, y = [0, 5, 1, 2, 5], [0.5, 0.9, 0.6, 0.7, 0.8]
    assert tie["spearman_rho"] == pytest.approx(float(stats.spearmanr(x, y).statistic))
    assert tie["kendall_tau"] == pytest.approx(float(stats.kendalltau(x, y).statistic))
    assert tie["top1_hit"] == 0.5
    assert tie["criterion_best"] == "mha,fc2" and tie["accuracy_best"] == "mha"
    assert "criterion ties mha=fc2" in tie["note"]

    constant = rows[("tied", "constant")]
    assert math.isnan(constant["spearman_rho"]) and math.isnan(constant["kendall_tau"])
    assert "constant criterion" in constant["note"]
    assert constant["top1_hit"] == pytest.approx(1 / 5)  # chance level: every pick is "best"

    flat = rows[("flat", "top_tie")]
    assert math.isnan(flat["spearman_rho"]) and "constant accuracy" in flat["note"]
    assert math.isnan(flat["top1_hit"])  # any pick would hit: no information

    few = rows[("few", "top_tie")]
    assert few["n"] == 2 and math.isnan(few["spearman_rho"])
    assert "fewer than 3" in few["note"] and "no accuracy for ln2" in few["note"]

    summary = {
        r["criterion"]: r for r in result.filter(pl.col("level") == "summary").iter_rows(named=True)
    }
    assert summary["top_tie"]["n"] == 1  # only "tied" has a defined rho
    assert summary["top_tie"]["spearman_rho"] == pytest.approx(tie["spearman_rho"])
    assert summary["top_tie"]["top1_hit"] == pytest.approx((0.5 + 1.0) / 2)  # tied, few
    assert summary["constant"]["n"] == 0 and math.isnan(summary["constant"]["wilcoxon_p"])
    assert (
        summary["constant"]["note"] == "rho undefined on 3 of 3 datasets; hit rate over 2 datasets"
    )
    assert summary["top_tie"]["best"] and not summary["constant"]["best"]


def test_cross_dataset_wilcoxon_equals_scipy() -> None:
    accuracy, scores = _random_grid(np.random.default_rng(2), n_datasets=9)
    scores["noisy_oracle"] = {
        d: {c: a + 0.05 * np.random.default_rng(i).normal() for c, a in cells.items()}
        for i, (d, cells) in enumerate(accuracy.items())
    }
    result = C.analyse(_criteria(scores), _selected(accuracy))
    per = result.filter(pl.col("level") == "dataset")
    rho = {
        c: dict(g.select("dataset", "spearman_rho").iter_rows())
        for (c,), g in per.partition_by("criterion", as_dict=True).items()
    }
    for row in result.filter(pl.col("level") == "summary").iter_rows(named=True):
        values = np.array([v for v in rho[row["criterion"]].values() if math.isfinite(v)])
        expected = stats.wilcoxon(values, alternative="greater")
        assert row["n"] == values.size
        assert row["spearman_rho"] == pytest.approx(values.mean(), abs=1e-12)
        assert row["wilcoxon_stat"] == pytest.approx(float(expected.statistic))
        assert row["wilcoxon_p"] == pytest.approx(float(expected.pvalue), abs=1e-12)
        assert row["min_p"] == 0.5**values.size
    pairs = result.filter(pl.col("level") == "pairwise")
    assert pairs.height == 3 * 2  # every ordered pair of 3 criteria
    for row in pairs.iter_rows(named=True):
        a, b = rho[row["criterion"]], rho[row["versus"]]
        both = [d for d in a if math.isfinite(a[d]) and math.isfinite(b[d])]
        x, y = np.array([a[d] for d in both]), np.array([b[d] for d in both])
        expected = stats.wilcoxon(x, y, alternative="greater")
        assert row["n"] == len(both)
        assert row["rho_difference"] == pytest.approx(float(np.mean(x - y)), abs=1e-12)
        assert row["wilcoxon_p"] == pytest.approx(float(expected.pvalue), abs=1e-12)


def test_wilcoxon_without_a_nonzero_difference_is_nan_with_a_note() -> None:
    # rho is exactly 0 on every dataset: ranks (1..5) against (2, 5, 3, 1, 4), sum d^2 = 20.
    accuracy = {d: dict(zip(COMPONENTS, (0.1, 0.2, 0.3, 0.4, 0.5), strict=True)) for d in "abc"}
    zero = {d: dict(zip(COMPONENTS, (2, 5, 3, 1, 4), strict=True)) for d in "abc"}
    result = C.analyse(_criteria({"zero": zero, "copy": zero}), _selected(accuracy))
    for row in result.filter(pl.col("level") != "dataset").iter_rows(named=True):
        assert row["n"] == 3 and row["min_p"] == 0.125
        assert math.isnan(row["wilcoxon_stat"]) and math.isnan(row["wilcoxon_p"])
        if row["level"] == "summary":
            assert row["spearman_rho"] == 0.0 and row["note"] == "every rho is zero: no test"
        else:  # scipy would answer p = 1 here, after a 0/0 warning
            assert row["note"] == "every rho equal: no test"
    mixed = wilcoxon_greater([0.0, 0.5, 0.8, 0.0, -0.1])  # zeros dropped, the rest tested
    expected = stats.wilcoxon([0.0, 0.5, 0.8, 0.0, -0.1], alternative="greater")
    assert mixed == pytest.approx((float(expected.statistic), float(expected.pvalue)))


@pytest.mark.parametrize("n", [1, 3, 4, 5, 11])
def test_minimum_p_is_the_one_sign_pattern_in_2_to_the_n(n: int) -> None:
    # Enumerate the null distribution of W+ for ranks 1..n: every sign pattern equally likely.
    ranks = np.arange(1, n + 1)
    top = n * (n + 1) / 2
    count = sum(1 for signs in itertools.product((0, 1), repeat=n) if np.dot(signs, ranks) >= top)
    assert minimum_p(n) == count / 2**n
    assert float(stats.wilcoxon(ranks / 10, alternative="greater").pvalue) == pytest.approx(
        minimum_p(n)
    )


def test_best_criterion_ties_are_broken_by_hit_rate_then_left_tied() -> None:
    accuracy = {"d": {"ln1": 0.1, "mha": 0.9, "ln2": 0.2, "fc1": 0.8, "fc2": 0.5}}
    # Same rho (one adjacent swap each), same tau; only "bottom_swap" keeps mha on top.
    scores = {
        "top_swap": {"d": {"ln1": 1, "mha": 4, "ln2": 2, "fc1": 5, "fc2": 3}},
        "bottom_swap": {"d": {"ln1": 2, "mha": 5, "ln2": 1, "fc1": 4, "fc2": 3}},
    }
    result = C.analyse(_criteria(scores), _selected(accuracy))
    summary = {
        r["criterion"]: r for r in result.filter(pl.col("level") == "summary").iter_rows(named=True)
    }
    assert summary["top_swap"]["spearman_rho"] == pytest.approx(
        summary["bottom_swap"]["spearman_rho"]
    )
    assert summary["bottom_swap"]["best"] and not summary["top_swap"]["best"]
    (line,) = C.best_criterion_lines(result)
    assert "tied between top_swap, bottom_swap; then highest hit rate" in line

    scores["twin"] = scores["bottom_swap"]
    result = C.analyse(_criteria(scores), _selected(accuracy))
    best = result.filter((pl.col("level") == "summary") & pl.col("best"))["criterion"].to_list()
    assert best == ["bottom_swap", "twin"]
    (line,) = C.best_criterion_lines(result)
    assert "still tied" in line and " and twin (" in line


def test_plasticity_criteria_are_block_means_per_protocol() -> None:
    summaries = pl.concat(
        [
            plasticity_summary(dataset=d, protocols=("embedding", "in_situ"), rng_seed=i)
            for i, d in enumerate(("ds_a", "ds_b"))
        ]
    )
    crit = C.plasticity_criteria(summaries)
    assert set(crit["criterion"]) == {C.PAPER_PLASTICITY, "plasticity_in_situ"}
    for row in crit.iter_rows(named=True):
        protocol = "embedding" if row["criterion"] == C.PAPER_PLASTICITY else "in_situ"
        part = summaries.filter(
            (pl.col("dataset") == row["dataset"])
            & (pl.col("protocol") == protocol)
            & (pl.col("component") == row["configuration"])
        )
        expected = np.average(part["mean"].to_numpy(), weights=part["n_pairs"].to_numpy())
        assert row["score"] == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="given twice for vit/ds_a/embedding"):
        C.plasticity_criteria(pl.concat([summaries, summaries.head(1)]))


def test_recommend_scores_follow_value_in_the_direction_of_rank() -> None:
    def table(values: list[float], ranks: list[int | None], criterion: str = "g") -> pl.DataFrame:
        return pl.DataFrame(
            {
                "model": "vit",
                "dataset": "d",
                "configuration": list(COMPONENTS),
                "criterion": criterion,
                "value": values,
                "ci_low": None,
                "ci_high": None,
                "rank": ranks,
                "trainable_parameters": [1, 2, 3, 4, 5],
            },
            schema_overrides={"ci_low": pl.Float64, "ci_high": pl.Float64},
        )

    # rank 1 = highest value; the ln1/ln2 tie was broken by the table (ranks 4, 5).
    high = C.recommend_criteria(table([0.1, 0.9, 0.1, 0.5, float("nan")], [3, 1, 4, 2, 5]))
    assert dict(high.select("configuration", "score").iter_rows()) == {
        "ln1": 0.1,
        "mha": 0.9,
        "ln2": 0.1,
        "fc1": 0.5,
    }  # the NaN value is no score; the tie stays a tie
    low = C.recommend_criteria(table([3.0, 1.0, 2.0, 5.0, 4.0], [3, 1, 2, 5, 4], "loss"))
    assert dict(low.select("configuration", "score").iter_rows())["mha"] == -1.0
    with pytest.raises(ValueError, match="criterion 'bad' follow its values in neither"):
        C.recommend_criteria(table([0.1, 0.9, 0.3, 0.5, 0.2], [1, 2, 3, 4, 5], "bad"))
    with pytest.raises(ValueError, match="given by several sources"):
        C.combine_criteria(
            [high, high.with_columns(source=pl.lit("plasticity"), configuration=pl.lit("x"))]
        )


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A real selected-LR table (aggregated from run summaries), plasticity summaries and a
    recommend table, as files."""
    root = tmp_path_factory.mktemp("criteria")
    datasets = ("ds_a", "ds_b", "ds_c", "ds_d")
    runs = collect_runs(write_grid(root / "finetune", datasets=datasets, demo=True))
    selected = select_learning_rates(runs)
    write_parquet(root / "sgd_selected.parquet", selected, {"demo": True})
    files = {"selected": root / "sgd_selected.parquet", "root": root}
    for i, dataset in enumerate(datasets):
        path = root / "plasticity" / f"{dataset}_summary.parquet"
        path.parent.mkdir(exist_ok=True)
        summary = plasticity_summary(
            dataset=dataset, protocols=("embedding", "in_situ"), rng_seed=i
        )
        write_parquet(path, summary)
        files[f"plasticity_{dataset}"] = path
    rng = np.random.default_rng(3)
    recommend = pl.DataFrame(
        [
            {
                "model": "vit",
                "dataset": d,
                "configuration": c,
                "criterion": "gradient_snr",
                "value": float(v),
                "ci_low": None,
                "ci_high": None,
                "rank": 0,
                "trainable_parameters": 10,
            }
            for d in datasets
            for c, v in zip((*COMPONENTS, "mha+fc1"), rng.normal(size=6), strict=True)
        ],
        schema_overrides={"ci_low": pl.Float64, "ci_high": pl.Float64},
    ).with_columns(
        rank=pl.col("value").rank("ordinal", descending=True).over("dataset").cast(pl.Int64)
    )
    write_parquet(root / "recommend_vit.parquet", recommend)
    files["recommend"] = root / "recommend_vit.parquet"
    return files


def test_cli_writes_the_result_latex_csv_and_figure(demo_like: dict[str, Path]) -> None:
    root = demo_like["root"]
    out = root / "stats" / "sgd_criteria.parquet"
    plasticity = [str(p) for k, p in demo_like.items() if k.startswith("plasticity_")]
    code = main(
        [
            "criteria",
            "--selected", str(demo_like["selected"]),
            "--recommend", str(demo_like["recommend"]),
            "--plasticity", *plasticity,
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    result = pl.read_parquet(out)
    meta = read_parquet_metadata(out)
    assert meta["demo"] is True and meta["best"] == C.best_criterion_lines(result)
    per = result.filter(pl.col("level") == "dataset")
    assert set(per["criterion"]) == {
        "gradient_snr",
        C.PAPER_PLASTICITY,
        "plasticity_in_situ",
        C.PARAMETERS,
    }
    assert per.height == 4 * 4 and set(per["n"]) == {5}  # components only: mha+fc1 left out

    tex, csv = root / "tables" / "sgd_criteria.tex", root / "tables" / "sgd_criteria.csv"
    assert main(["criteria-table", "--input", str(out), "--out", str(tex), "--csv", str(csv)]) == 0
    text = tex.read_text()
    assert text.startswith(f"% {DEMO_NOTE}") and r"\label{tab:sgd-criteria}" in text
    mean_row = next(line for line in text.splitlines() if line.startswith(r"Mean $\rho$"))
    cells = mean_row.removesuffix(r" \\").split(" & ")[1:]
    printed = [
        math.nan if cell == "--" else float(re.search(r"[+-]\d\.\d\d", cell).group())
        for cell in cells
    ]
    summary = result.filter(pl.col("level") == "summary")
    expected = summary["spearman_rho"].to_list()
    assert printed == pytest.approx(expected, abs=0.005, nan_ok=True)  # params: constant here
    assert csv.read_text().startswith(f"# {DEMO_NOTE}\n")
    rows = pl.read_csv(csv, comment_prefix="#", infer_schema_length=0)
    labels = [short_label(c) for c in summary["criterion"]]
    assert rows.columns == ["Model", "Row", *labels, "Top-1 hit", "Best"]
    assert rows["Row"].to_list() == [
        *per["dataset"].unique(maintain_order=True),
        *("Mean rho", "Mean tau", "Hit rate", "n", "p (rho > 0)"),
        *(["p (best >)"] if summary["best"].sum() == 1 else []),  # a row in the .tex too
    ]
    assert (r"$p$ (best $>$)" in text) == (summary["best"].sum() == 1)
    mean = rows.filter(pl.col("Row") == "Mean rho").row(0, named=True)
    assert [mean[label] for label in labels] == [  # the .tex cells, as printed there
        None if cell == "--" else re.search(r"[+-]\d\.\d\d", cell).group() for cell in cells
    ]
    assert mean["Best"] == "; ".join(
        short_label(c) for c in summary.filter(pl.col("best"))["criterion"]
    )
    p_rho = rows.filter(pl.col("Row") == "p (rho > 0)").row(0, named=True)
    assert [p_rho[label] for label in labels] == [
        None if math.isnan(p) else p_value(p) for p in summary["wilcoxon_p"]
    ]

    figures = [root / "figures" / "sgd_criteria.pdf", root / "figures" / "sgd_criteria.png"]
    assert main(["criteria-figure", "--input", str(out), "--out", *map(str, figures)]) == 0
    assert all(f.stat().st_size > 1000 for f in figures)


def test_cli_names_a_missing_file_and_refuses_no_criterion(
    demo_like: dict[str, Path], tmp_path: Path
) -> None:
    missing = tmp_path / "nope.parquet"
    common = ["--out", str(tmp_path / "o.parquet")]
    assert (
        main(
            [
                "criteria",
                "--selected",
                str(demo_like["selected"]),
                "--plasticity",
                str(missing),
                *common,
            ]
        )
        == 2
    )
    assert (
        main(["criteria", "--selected", str(demo_like["selected"]), "--no-parameters", *common])
        == 2
    )
    assert not (tmp_path / "o.parquet").exists()
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        main(
            [
                "-v",
                "criteria",
                "--selected",
                str(demo_like["selected"]),
                "--plasticity",
                str(missing),
                *common,
            ]
        )


@needs_latex
def test_criteria_table_compiles(tmp_path: Path) -> None:
    accuracy, scores = _random_grid(np.random.default_rng(4), n_datasets=4)
    selected = _selected(accuracy)
    two_models = pl.concat([selected, selected.with_columns(model=pl.lit("vit_huge"))])
    crit = _criteria(scores)
    crit = pl.concat([crit, crit.with_columns(model=pl.lit("vit_huge"))])
    tables = {
        "one": criteria_table(C.analyse(_criteria(scores), selected), demo=True),
        "two": criteria_table(C.analyse(crit, two_models)),
    }
    compile_tables(tmp_path, tables)


# --- the selector benchmark on a plain accuracy table ----------------------------------------


def _recommend_rows(values: dict[str, dict[str, dict[str, float]]], lower_first: set[str]):
    """Recommend-table rows from {criterion: {dataset: {configuration: value}}}, ranked as
    recommend ranks (highest first, lowest for ``lower_first``; NaN last)."""
    rows = []
    for criterion, datasets in values.items():
        for dataset, cells in datasets.items():
            sign = -1.0 if criterion in lower_first else 1.0
            order = sorted(
                cells, key=lambda c: (math.isnan(cells[c]), -sign * np.nan_to_num(cells[c]))
            )
            for rank, configuration in enumerate(order, start=1):
                rows.append(
                    {
                        "model": "vit",
                        "dataset": dataset,
                        "configuration": configuration,
                        "criterion": criterion,
                        "value": cells[configuration],
                        "rank": rank,
                    }
                )
    return pl.DataFrame(rows)


def test_score_selectors_scores_spectrum_and_kappa_against_scipy() -> None:
    """Five datasets, seeds as rows of a plain (configuration, dataset, accuracy) table:
    per-dataset rho and tau are scipy's on the seed means, kappa's score is its negated
    value (lowest first), the norms' n/a values are no score, and the Wilcoxon p across
    datasets is scipy's with min_p = 2^-5."""
    rng = np.random.default_rng(7)
    datasets = [f"d{i}" for i in range(5)]
    accuracy_rows, means = [], {}
    for dataset in datasets:
        for configuration in COMPONENTS:
            seeds = rng.uniform(0.5, 0.9, size=3)
            means[dataset, configuration] = seeds.mean()
            accuracy_rows += [
                {"configuration": configuration, "dataset": dataset, "accuracy": float(a)}
                for a in seeds
            ]
    accuracy = pl.DataFrame(accuracy_rows)
    linear = ["mha", "fc1", "fc2"]
    values = {
        "spectrum_snr": {
            d: {
                c: (math.nan if c in ("ln1", "ln2") else float(rng.uniform(0.1, 1)))
                for c in COMPONENTS
            }
            for d in datasets
        },
        "kappa": {
            d: {
                c: (math.nan if c in ("ln1", "ln2") else float(rng.uniform(2, 50)))
                for c in COMPONENTS
            }
            for d in datasets
        },
    }
    criteria = C.recommend_criteria(_recommend_rows(values, {"kappa"}))
    result = C.score_selectors(criteria, accuracy, experiment="verify")
    per_dataset = result.filter(pl.col("level") == "dataset")
    rhos: dict[str, list[float]] = {}
    for criterion, sign in (("spectrum_snr", 1.0), ("kappa", -1.0)):
        for dataset in datasets:
            row = per_dataset.filter(
                (pl.col("criterion") == criterion) & (pl.col("dataset") == dataset)
            ).row(0, named=True)
            score = [sign * values[criterion][dataset][c] for c in linear]
            measured = [means[dataset, c] for c in linear]
            assert row["n"] == 3 and row["experiment"] == "verify"
            rho, rho_p = stats.spearmanr(score, measured)
            tau, tau_p = stats.kendalltau(score, measured)
            assert row["spearman_rho"] == pytest.approx(rho, abs=1e-12)
            assert row["kendall_tau"] == pytest.approx(tau, abs=1e-12)
            assert row["spearman_p"] == pytest.approx(rho_p, abs=1e-12)
            assert row["kendall_p"] == pytest.approx(tau_p, abs=1e-12)
            best = linear[int(np.argmax(score))]
            assert row["top1_hit"] == float(best == linear[int(np.argmax(measured))])
            rhos.setdefault(criterion, []).append(rho)
    summary = result.filter(pl.col("level") == "summary")
    for criterion, values_of in rhos.items():
        row = summary.filter(pl.col("criterion") == criterion).row(0, named=True)
        kept = [r for r in values_of if r != 0]
        assert row["wilcoxon_p"] == pytest.approx(
            stats.wilcoxon(kept, alternative="greater").pvalue, abs=1e-12
        )
        assert row["min_p"] == pytest.approx(2.0 ** -len(kept))
    pairwise = result.filter(pl.col("level") == "pairwise")
    assert set(zip(pairwise["criterion"], pairwise["versus"], strict=True)) == {
        ("spectrum_snr", "kappa"),
        ("kappa", "spectrum_snr"),
    }


def test_score_selectors_refuses_a_table_without_its_columns_or_model() -> None:
    criteria = C.combine_criteria(
        [
            pl.DataFrame(
                {
                    "model": ["a", "b"],
                    "dataset": ["d", "d"],
                    "configuration": ["mha", "mha"],
                    "criterion": ["kappa", "kappa"],
                    "source": ["recommend", "recommend"],
                    "score": [1.0, 2.0],
                }
            )
        ]
    )
    with pytest.raises(ValueError, match="accuracy table misses column"):
        C.score_selectors(criteria, pl.DataFrame({"dataset": ["d"]}), experiment="v")
    plain = pl.DataFrame({"configuration": ["mha"], "dataset": ["d"], "accuracy": [0.5]})
    with pytest.raises(ValueError, match="criteria hold 2 models"):
        C.score_selectors(criteria, plain, experiment="v")
