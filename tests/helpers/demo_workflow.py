"""The repository's Snakefile on a small demo in a temporary folder, for the tests that run it
as a user would (through SLURM, or interrupted locally): its command-line options, the config
it sees, and its results without the fields that time a run."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import polars as pl
import yaml
from snakemake.utils import update_config

from tests.helpers.slurm_harness import REPO
from vitplasticity.finetune import finished

PRESETS = [
    REPO / "config/config.yaml",
    REPO / "config/demo.yaml",
    REPO / "tests/presets/mini.yaml",
]
# One dataset, two finetuning runs: every kind of GPU and CPU job, few jobs (each SLURM job
# re-parses the Snakefile, seconds on this machine).
SMALL = {
    "plasticity": {"datasets": ["demo-stripes"]},
    "experiments": {
        "sgd": {"datasets": ["demo-stripes"], "configurations": ["mha", "head"]},
        "adam": {"enabled": False},
    },
}
# Fields of summary.json that say when, where and how fast, not what was computed.
CIRCUMSTANTIAL = {
    "gpu_slot",
    "created",
    "host",
    "git_commit",
    "versions",
    "wall_seconds",
    "images_per_second",
    "steps_per_second",
    "resumed",
}


def workflow_args(
    workdir: Path, *extra_configs: dict, last_configfiles: Sequence[Path] = ()
) -> list[str]:
    """Options running the repository's Snakefile on the small demo inside `workdir`: the
    config files PRESETS, SMALL, `extra_configs`, `last_configfiles` (later ones win)."""
    configfiles = [*map(str, PRESETS)]
    for i, extra in enumerate([SMALL, *extra_configs]):
        path = workdir / f"extra{i}.yaml"
        path.write_text(yaml.safe_dump(extra))
        configfiles.append(str(path))
    configfiles += map(str, last_configfiles)
    paths = {"resources": str(workdir / "resources"), "results": str(workdir / "results")}
    return [
        "--snakefile",
        str(REPO / "workflow/Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        *configfiles,
        "--config",
        f"paths={json.dumps(paths)}",
    ]


def merged_config(*extra_configs: dict) -> dict:
    """The config a run of workflow_args(..., *extra_configs) sees, merged as Snakemake does."""
    config: dict = {}
    for preset in PRESETS:
        update_config(config, yaml.safe_load(preset.read_text()))
    for extra in [SMALL, *extra_configs]:
        update_config(config, extra)
    return config


def outputs(results: Path, pattern: str) -> list[Path]:
    """The files below `results` matching `pattern`, not the runs' kept copies of them
    (vitplasticity.finetune.finished: `<run>/finished/`)."""
    return [p for p in sorted(results.rglob(pattern)) if finished.KEPT_DIR not in p.parts]


def summaries(results: Path) -> dict[str, dict]:
    """Every run's summary.json below `results`, without circumstantial fields, by relative
    path."""
    return {
        str(p.relative_to(results)): {
            k: v for k, v in json.loads(p.read_text()).items() if k not in CIRCUMSTANTIAL
        }
        for p in outputs(results, "summary.json")
    }


def tables(results: Path) -> dict[str, pl.DataFrame]:
    """Every Parquet table below `results` (not the kept copies), without timing columns, by
    relative path."""
    out = {}
    for path in outputs(results, "*.parquet"):
        frame = pl.read_parquet(path)
        timing = [c for c in frame.columns if any(w in c for w in ("second", "time", "created"))]
        out[str(path.relative_to(results))] = frame.drop(timing)
    return out
