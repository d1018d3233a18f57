"""Hand-made inputs of the report stage: finetuning run directories and plasticity summaries
in the upstream formats (docs/outputs.md), built by the tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from vitplasticity.components import COMPONENTS
from vitplasticity.utils.io import write_parquet


def write_run(
    root: Path,
    *,
    experiment: str = "sgd",
    model: str = "vit",
    dataset: str = "ds",
    configuration: str = "mha",
    optimizer: str = "sgd",
    lr: float = 0.01,
    seed: int = 0,
    val: float | None = 0.5,
    test: float | None = 0.5,
    diverged: bool = False,
    demo: bool = False,
    steps: int = 20,
) -> Path:
    """One run directory (summary.json + metrics.parquet); returns the summary path."""
    run = root / experiment / model / dataset / configuration / f"lr{lr:g}_seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    summary = {
        "experiment": experiment,
        "model": model,
        "dataset": dataset,
        "configuration": configuration,
        "optimizer": optimizer,
        "lr": lr,
        "seed": seed,
        "status": "diverged" if diverged else "completed",
        "diverged": diverged,
        "best_step": None if diverged else steps,
        "best_val_accuracy": val,
        "best_val_loss": 1.0,
        "test_accuracy": test,
        "final_step": steps,
        "steps": steps,
        "trainable_parameters": 1000 + len(configuration),
        "total_parameters": 5000,
        "steps_per_second": 2.0,
        "images_per_second": 64.0,
        "wall_seconds": 10.0 + seed,
        "device": "cpu:test",
        "resumed": False,
        "demo": demo,
        "settings": {},
        "versions": {},
        "git_commit": None,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    rng = np.random.default_rng(seed + int(lr * 1e4))
    train_steps = np.arange(0, steps + 1, 2)
    val_steps = np.arange(4, steps + 1, 4)
    grad = np.abs(rng.normal(1.0, 0.2, train_steps.size)) * (1 + 10 * lr)
    if diverged:
        grad[-1] = np.nan
    rows = pl.concat(
        [
            pl.DataFrame(
                {
                    "step": train_steps,
                    "kind": "train",
                    "lr": lr,
                    "train_loss": 2 - train_steps / steps,
                    "grad_norm": grad,
                },
            ),
            pl.DataFrame(
                {
                    "step": val_steps,
                    "kind": "val",
                    "lr": lr,
                    "val_loss": 2.0 - val_steps / steps * (1 + lr),
                    "val_accuracy": 0.5,
                    "test_accuracy": 0.5,
                },
            ),
        ],
        how="diagonal_relaxed",
    ).with_columns(pl.col("step").cast(pl.Int64))
    write_parquet(run / "metrics.parquet", rows, {"demo": demo})
    return run / "summary.json"


def write_grid(
    root: Path,
    *,
    experiment: str = "sgd",
    optimizer: str = "sgd",
    models: tuple[str, ...] = ("vit",),
    datasets: tuple[str, ...] = ("ds_a", "ds_b", "ds_c"),
    configurations: tuple[str, ...] = ("full", "ln1", "mha", "ln2", "fc1", "fc2", "head"),
    lrs: tuple[float, ...] = (0.01, 0.03),
    seeds: tuple[int, ...] = (0, 1),
    demo: bool = False,
    rng_seed: int = 0,
) -> list[Path]:
    """A full grid of runs with seeded random accuracies; returns the summary paths."""
    rng = np.random.default_rng(rng_seed)
    paths = []
    for model in models:
        for dataset in datasets:
            for index, configuration in enumerate(configurations):
                for lr in lrs:
                    for seed in seeds:
                        base = 0.6 + 0.03 * index + 0.02 * rng.random()
                        paths.append(
                            write_run(
                                root,
                                experiment=experiment,
                                model=model,
                                dataset=dataset,
                                configuration=configuration,
                                optimizer=optimizer,
                                lr=lr,
                                seed=seed,
                                val=round(base + 0.01 * rng.random(), 6),
                                test=round(base + 0.01 * rng.random(), 6),
                                demo=demo,
                            )
                        )
    return paths


def plasticity_summary(
    model: str = "vit",
    dataset: str = "ds_a",
    n_blocks: int = 4,
    protocols: tuple[str, ...] = ("embedding",),
    n_pairs: int = 64,
    rng_seed: int = 0,
) -> pl.DataFrame:
    """A plasticity summary table (columns of results/plasticity/{model}/{dataset}_summary)."""
    rng = np.random.default_rng(rng_seed)
    level = {"ln1": 0.3, "mha": 1.6, "ln2": 0.5, "fc1": 1.3, "fc2": 1.0}
    rows = []
    for protocol in protocols:
        for block in range(n_blocks):
            for component in COMPONENTS:
                mean = level[component] * (1 + 0.1 * rng.standard_normal())
                std = abs(0.2 * mean * (1 + 0.1 * rng.standard_normal()))
                rows.append(
                    {
                        "model": model,
                        "dataset": dataset,
                        "protocol": protocol,
                        "block": block,
                        "component": component,
                        "n_pairs": n_pairs,
                        "mean": mean,
                        "std": std,
                        "ci95": 1.96 * std / np.sqrt(n_pairs),
                        "relative_depth": (block + 1) / n_blocks,
                    }
                )
    return pl.DataFrame(rows).with_columns(pl.col("block", "n_pairs").cast(pl.Int64))
