"""``bounds``: the theoretical plasticity bounds of one model, against its measured plasticity."""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplasticity.commands import json_argument

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger(__name__)

# The bounds are stated for the embedding protocol's inputs (every component fed the
# embedding output), so that is the measurement they are compared with.
COMPARED_PROTOCOL = "embedding"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bounds`` subcommand."""
    parser = subparsers.add_parser(
        "bounds",
        help="theoretical plasticity bounds per block and component, with a figure",
        description="Compute the paper's upper bounds (LayerNorm, linear, MHA and the "
        "energy-based MHA bound) from the model's weights and the embedding outputs of the "
        "reference images, and plot them against the measured plasticity (embedding protocol).",
    )
    parser.add_argument("--model", required=True, help="model name (config key)")
    parser.add_argument(
        "--model-spec", required=True, type=json_argument, help="its config entry, as JSON"
    )
    parser.add_argument("--reference", required=True, help="reference set Parquet file")
    parser.add_argument(
        "--n-images", type=int, default=12800, help="reference images whose tokens set sigma, r, E"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="images per forward pass")
    parser.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda")
    parser.add_argument("--demo", action="store_true", help="label the outputs as a demo")
    parser.add_argument("--out", required=True, help="bounds Parquet file")
    parser.add_argument(
        "--plasticity", nargs="*", default=[], metavar="FILE", help="per-pair plasticity Parquets"
    )
    parser.add_argument(
        "--figure-prefix", required=True, help="figure path without suffix (.pdf and .png)"
    )
    parser.set_defaults(handler=run_bounds)


def measured_plasticity(files: list[str]) -> pl.DataFrame:
    """Mean and largest measured ratio per (block, component), pooled over ``files``.

    Only the embedding protocol's rows count; empty when no file has them.

    Raises:
        FileNotFoundError: naming a missing file.
        ValueError: naming a file without the plasticity columns.
    """
    import polars as pl

    needed = ["protocol", "block", "component", "ratio"]
    frames = []
    for name in files:
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"plasticity file not found: {path}")
        columns = pl.read_parquet_schema(path)
        missing = [c for c in needed if c not in columns]
        if missing:
            raise ValueError(f"{path}: not a plasticity pairs file (lacks {missing})")
        frames.append(
            pl.scan_parquet(path)
            .select(needed)
            .filter(pl.col("protocol") == COMPARED_PROTOCOL)
            .with_columns(pl.lit(path.stem).alias("dataset"))
        )
    schema = {"block": pl.Int64, "component": pl.String, "measured_mean": pl.Float64}
    if not frames:
        return pl.DataFrame(schema={**schema, "measured_max": pl.Float64, "n_datasets": pl.UInt32})
    return (
        pl.concat(frames)
        .group_by("block", "component")
        .agg(
            pl.col("ratio").mean().alias("measured_mean"),
            pl.col("ratio").max().alias("measured_max"),
            pl.col("dataset").n_unique().alias("n_datasets"),
        )
        .collect()
    )


def plot_bounds(table: pl.DataFrame, prefix: str | Path, *, model: str, demo: bool) -> None:
    """Bound (solid) and measured mean plasticity (dashed) per block, one panel per component.

    One panel each, because bounds of different components coincide (ln1 and ln2 of a
    random-init model); log y axes; colour-blind-safe colours; PDF + PNG at ``prefix``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    from vitplasticity import COMPONENTS
    from vitplasticity.io import atomic_path

    palette = dict(zip(COMPONENTS, sns.color_palette("colorblind", len(COMPONENTS)), strict=True))
    fig, axes = plt.subplots(1, len(COMPONENTS), figsize=(13, 3.4), sharex=True)
    data = table.sort("block")
    blocks = sorted(set(data["block"].to_list()))
    for ax, component in zip(axes, COMPONENTS, strict=True):
        rows = data.filter(data["component"] == component)
        colour = palette[component]
        ax.plot(rows["block"], rows["bound"], "-o", color=colour, label="bound")
        if "measured_mean" in rows.columns and rows["measured_mean"].is_not_null().any():
            ax.plot(
                rows["block"],
                rows["measured_mean"],
                "--s",
                color=colour,
                markerfacecolor="white",
                label="measured (mean)",
            )
        ax.set_yscale("log")
        ax.set_title(component.upper(), color=colour, fontweight="bold")
        ax.set_xlabel("block")
        ax.set_xticks(blocks if len(blocks) <= 12 else blocks[:: max(1, len(blocks) // 8)])
        ax.legend(fontsize=7, loc="best")
    axes[0].set_ylabel("plasticity (log scale)")
    title = f"{model}: plasticity upper bound vs measured (embedding protocol)"
    if demo:
        title = f"DEMO - not the paper's result\n{title}"
    fig.suptitle(title, fontsize=11)
    sns.despine(fig)
    fig.tight_layout()
    for suffix in ("pdf", "png"):
        target = Path(f"{prefix}.{suffix}")
        with atomic_path(target) as tmp:
            fig.savefig(tmp, format=suffix, dpi=150, bbox_inches="tight")
    plt.close(fig)


def run_bounds(args: argparse.Namespace) -> int:
    import polars as pl
    import torch

    from vitplasticity.bounds import TokenStatistics, bounds_from_statistics
    from vitplasticity.commands.plasticity import (
        ProgressReporter,
        decoded_batches,
        read_reference_images,
    )
    from vitplasticity.io import write_parquet
    from vitplasticity.models import ModelSpec, build_model, pick_device, preprocessing
    from vitplasticity.plasticity import embedding_tokens, vit_blocks
    from vitplasticity.provenance import provenance

    if args.n_images < 1:
        raise ValueError(f"--n-images must be >= 1, got {args.n_images}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    spec = ModelSpec.from_config(args.model_spec)
    reference = read_reference_images(args.reference)
    if len(reference) < args.n_images:
        raise ValueError(
            f"{args.reference}: {len(reference)} reference images, fewer than --n-images "
            f"{args.n_images}"
        )
    measured = measured_plasticity(args.plasticity)  # checks the files before compute
    device = pick_device(args.device)

    # float64 throughout: the bounds' extreme values come from these tokens.
    model = build_model(spec, num_classes=0).eval().to(device=device, dtype=torch.float64)
    vit_blocks(model)
    pre = preprocessing(model, spec)
    progress = ProgressReporter(args.n_images, f"bounds {args.model}: embedding")

    def tokens():
        done = 0
        with torch.inference_mode():
            for batch in decoded_batches(reference[: args.n_images], pre, args.batch_size):
                yield embedding_tokens(model, batch.to(device=device, dtype=torch.float64))
                done += len(batch)
                progress(done)

    try:
        stats = TokenStatistics.from_tokens(tokens())
    finally:
        progress.close()
    bounds = bounds_from_statistics(model.cpu(), stats)
    table = bounds.join(measured, on=["block", "component"], how="left")
    if measured.height:
        over = table.filter(pl.col("measured_max") > pl.col("bound"))
        if over.height:
            # The reference tokens set sigma, r and E; a downstream image outside them can
            # exceed the bound legitimately. Said loudly, not hidden.
            log.warning(
                "measured plasticity above the bound (downstream tokens outside the reference "
                "set's sigma/r?) at %s",
                over.select("block", "component").rows(),
            )
    else:
        log.warning("no %s-protocol plasticity given: bounds only", COMPARED_PROTOCOL)

    settings: dict[str, Any] = {
        "model_spec": args.model_spec,
        "reference": str(args.reference),
        "n_images": args.n_images,
        "batch_size": args.batch_size,
        "device": args.device,
        "plasticity": [str(p) for p in args.plasticity],
        "token_statistics": asdict(stats),
        "preprocessing": asdict(pre),
    }
    metadata = {
        "provenance": provenance(settings, device),
        "model": args.model,
        "demo": bool(args.demo),
    }
    table = table.select(pl.lit(args.model).alias("model"), pl.all())
    write_parquet(args.out, table, metadata)
    plot_bounds(table, args.figure_prefix, model=args.model, demo=args.demo)
    log.info(
        "wrote %s and %s.{pdf,png} (min token std %.3g, r=%.3g, E=%.3g over %d sequences)",
        args.out,
        args.figure_prefix,
        math.sqrt(stats.min_variance),
        stats.radius,
        stats.energy,
        stats.n_sequences,
    )
    return 0
