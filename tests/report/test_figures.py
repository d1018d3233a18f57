"""Figures: every kind renders in every format, carries the DEMO note and the fixed colours;
the pooled plasticity statistics equal a direct computation over the pairs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from PIL import Image

from tests.helpers.report_inputs import plasticity_summary, write_grid
from vitplasticity.cli import main
from vitplasticity.components import COMPONENTS
from vitplasticity.report import figures, finetune_figures
from vitplasticity.report.aggregate import collect_runs, select_learning_rates
from vitplasticity.report.plasticity_summary import pool_plasticity
from vitplasticity.report.style import COMPONENT_COLOURS, DEMO_NOTE

SETTINGS = figures.FigureSettings(width_in=3.4, dpi=60, context="paper")


def test_colours_are_fixed_and_distinct() -> None:
    assert set(COMPONENT_COLOURS) == set(COMPONENTS)
    assert len(set(COMPONENT_COLOURS.values())) == len(COMPONENTS)


def test_pooled_plasticity_equals_the_union_of_pairs() -> None:
    rng = np.random.default_rng(0)
    ratios = {"a": rng.gamma(2.0, 0.5, 40), "b": rng.gamma(3.0, 0.4, 25)}
    rows = [
        {
            "dataset": d,
            "protocol": "embedding",
            "block": 0,
            "component": "mha",
            "n_pairs": r.size,
            "mean": r.mean(),
            "std": r.std(ddof=1),
            "relative_depth": 1.0,
        }
        for d, r in ratios.items()
    ]
    pooled = pool_plasticity(pl.DataFrame(rows)).row(0, named=True)
    union = np.concatenate(list(ratios.values()))
    assert pooled["n_pairs"] == union.size
    assert pooled["mean"] == pytest.approx(union.mean(), rel=1e-12)
    assert pooled["std"] == pytest.approx(union.std(ddof=1), rel=1e-10)
    assert pooled["ci95"] == pytest.approx(
        1.96 * union.std(ddof=1) / np.sqrt(union.size), rel=1e-10
    )


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pl.DataFrame]:
    root = tmp_path_factory.mktemp("runs")
    sgd = collect_runs(write_grid(root, datasets=("a", "b"), configurations=("mha", "fc1", "head")))
    adam = collect_runs(
        write_grid(
            root,
            experiment="adam",
            optimizer="adamw",
            datasets=("a", "b"),
            configurations=("mha", "fc1", "head"),
            lrs=(1e-4,),
            rng_seed=2,
        )
    )
    summaries = pl.concat(
        [
            plasticity_summary(dataset=d, protocols=("embedding", "in_situ"), rng_seed=i)
            for i, d in enumerate(("a", "b"))
        ]
    )
    return {
        "runs": sgd,
        "selected": select_learning_rates(sgd),
        "adam": select_learning_rates(adam),
        "summaries": summaries,
    }


def _draw(kind: str, tables: dict[str, pl.DataFrame], outputs: list[Path], demo: bool) -> None:
    if kind == "boxplot":
        figures.plasticity_boxplot(tables["summaries"], outputs, SETTINGS, demo, "vit")
    elif kind == "depth":
        figures.plasticity_depth(tables["summaries"], outputs, SETTINGS, demo, "vit")
    elif kind == "accuracy":
        finetune_figures.accuracy_bars(tables["selected"], outputs, SETTINGS, demo)
    elif kind == "robustness":
        finetune_figures.robustness_boxplot(tables["runs"], outputs, SETTINGS, demo)
    else:
        finetune_figures.optimizer_scatter(
            tables["selected"], tables["adam"], outputs, SETTINGS, demo
        )


@pytest.mark.parametrize("kind", ["boxplot", "depth", "accuracy", "robustness", "optimizers"])
def test_figures_render_with_demo_note_and_fixed_colours(
    kind: str, tables: dict[str, pl.DataFrame], tmp_path: Path
) -> None:
    outputs = [tmp_path / f"{kind}.{fmt}" for fmt in ("pdf", "png", "svg")]
    _draw(kind, tables, outputs, demo=True)
    assert outputs[0].read_bytes().startswith(b"%PDF")
    with Image.open(outputs[1]) as image:
        # Column width at the requested dpi (tight bounding box: within a few pixels).
        assert abs(image.width - SETTINGS.width_in * SETTINGS.dpi) < 0.15 * image.width
    svg = outputs[2].read_text()
    assert DEMO_NOTE.replace("'", "&#x27;") in svg or DEMO_NOTE in svg
    # The MHA colour and the FC1 colour appear as fills, whatever the figure.
    for component in ("mha", "fc1"):
        assert COMPONENT_COLOURS[component].lower() in svg.lower()
    plain = tmp_path / f"{kind}_plain.svg"
    _draw(kind, tables, [plain], demo=False)
    assert "DEMO" not in plain.read_text()


def test_training_curves_via_cli(tmp_path: Path) -> None:
    paths = write_grid(tmp_path, datasets=("a",), configurations=("mha", "fc1"), demo=True)
    metrics = [str(p.with_name("metrics.parquet")) for p in paths]
    out = [tmp_path / "curves.svg", tmp_path / "curves.png"]
    assert (
        main(
            [
                "figure",
                "--kind",
                "curves",
                "--inputs",
                *metrics,
                "--title",
                "sgd a",
                "--dpi",
                "60",
                "--out",
                *map(str, out),
            ]
        )
        == 0
    )
    svg = out[0].read_text()
    assert "DEMO" in svg  # from the summaries beside the metrics, without --demo
    assert "Gradient norm" in svg and "Val. loss" in svg
    assert "0.01" in svg and "0.03" in svg  # one line per LR, in the legend


def test_unknown_format_is_refused_before_writing(
    tables: dict[str, pl.DataFrame], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=r"unknown figure format .*fig\.bmp"):
        finetune_figures.accuracy_bars(tables["selected"], [tmp_path / "fig.bmp"], SETTINGS)
    assert not (tmp_path / "fig.bmp").exists()


def test_jittered_figure_is_the_same_on_every_run(
    tables: dict[str, pl.DataFrame], tmp_path: Path
) -> None:
    """The boxplot's jittered points do not depend on numpy's global RNG, nor change it."""
    np.random.seed(123)
    first, second = tmp_path / "a.png", tmp_path / "b.png"
    _draw("boxplot", tables, [first], demo=False)
    after = np.random.random()
    np.random.seed(7)  # another global state: the same pixels
    _draw("boxplot", tables, [second], demo=False)
    assert first.read_bytes() == second.read_bytes()
    np.random.seed(123)
    assert np.random.random() == after  # the caller's stream was not consumed
