"""A model's local `weights:` folder is an input Snakemake tracks by content
(vitplasticity.models.local_weights): replaced, its jobs rerun; touched but unchanged, nothing
does."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers.workflow import planned_jobs, snakemake

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

TINY_DINOV2 = {
    "hidden_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 3,
    "intermediate_size": 96,
    "image_size": 32,
    "patch_size": 8,
}
TARGET = "results/demo/plasticity/local_dinov2/demo-stripes_summary.parquet"


def save_dinov2(folder: Path, seed: int) -> None:
    """A tiny random-init Dinov2Model of ``seed`` and its image processor, saved into ``folder``."""
    torch.manual_seed(seed)
    transformers.Dinov2Model(transformers.Dinov2Config(**TINY_DINOV2)).save_pretrained(folder)
    transformers.BitImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    ).save_pretrained(folder)


def test_a_replaced_weights_folder_reruns_its_jobs_and_a_touched_one_does_not(
    tmp_path: Path,
) -> None:
    weights = tmp_path / "weights/dinov2"
    save_dinov2(weights, seed=0)
    model = {"family": "transformers", "hf_id": "tiny/dinov2", "weights": str(weights)}
    edit = {"models": {"local_dinov2": model}, "plasticity": {"models": ["local_dinov2"]}}
    (tmp_path / "edit.yaml").write_text(yaml.safe_dump(edit))
    configs = (tmp_path / "edit.yaml",)

    first = snakemake(tmp_path, TARGET, extra_configfiles=configs)
    assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
    assert planned_jobs(snakemake(tmp_path, "-n", TARGET, extra_configfiles=configs)) == {}

    # Touched, even rewritten with the same bytes: the content is the same, nothing reruns.
    for path in weights.iterdir():
        path.write_bytes(path.read_bytes())
        os.utime(path, (2e9, 2e9))
    assert planned_jobs(snakemake(tmp_path, "-n", TARGET, extra_configfiles=configs)) == {}

    # Replaced by another model's folder: the plasticity job reruns.
    shutil.rmtree(weights)
    save_dinov2(weights, seed=1)
    jobs = planned_jobs(snakemake(tmp_path, "-n", TARGET, extra_configfiles=configs))
    assert jobs.get("plasticity") == 1, jobs
