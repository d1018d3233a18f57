"""The LoRA baseline: adapters on the attention linears only, the update they add, what the
"lora" configuration trains, and whole runs reporting their trainable parameter count."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.tiny_finetune import settings_for
from vitplasticity import cli
from vitplasticity.finetune.identity import check_runs
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.train import train
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.lora import apply_lora
from vitplasticity.models.spec import TimmSpec

pytest.importorskip("peft")

# The tiny ViT of conftest: 3 blocks, width 48, 4 classes below.
DEPTH, WIDTH, CLASSES = 3, 48, 4


def adapter_names(model: torch.nn.Module) -> set[str]:
    """The LoRA adapters' parameters, by peft's naming (``...lora_A.default.weight``)."""
    return {name for name, _ in model.named_parameters() if ".lora_" in name}


def lora_count(rank: int) -> int:
    """Adapter parameters: per block, qkv (A: r x d, B: 3d x r) and proj (A: r x d, B: d x r)."""
    return DEPTH * (rank * WIDTH + 3 * WIDTH * rank + rank * WIDTH + WIDTH * rank)


HEAD_AND_NORM = WIDTH * CLASSES + CLASSES + 2 * WIDTH


# One intra-op thread per module (conftest.py: tiny models run fastest so).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# A 4-step AdamW run of the "lora" configuration.
lora_settings = functools.partial(
    settings_for, experiment="lora", configuration="lora", optimizer="adamw", lr=0.01,
    steps=4, val_every=2, micro_batch_size=8, warmup_steps=1,
)  # fmt: skip


def test_adapters_sit_on_the_attention_linears_only(tiny_vit: torch.nn.Module) -> None:
    model = apply_lora(tiny_vit, rank=8, alpha=16)
    names = adapter_names(model)
    pattern = r"blocks\.\d\.attn\.(qkv|proj)\.lora_[AB]\.default\.weight"
    assert names and all(re.fullmatch(pattern, name) for name in names), sorted(names)
    assert len(names) == DEPTH * 2 * 2  # (qkv, proj) x (A, B) per block
    assert not any("patch_embed" in name for name in names)
    params = dict(model.named_parameters())
    assert sum(params[name].numel() for name in names) == lora_count(8)


def test_lora_update_is_scaled_low_rank(tiny_vit: torch.nn.Module) -> None:
    """At init (B = 0) the model is unchanged; then qkv(x) = W x + b + (alpha / r) B A x."""
    base = copy.deepcopy(tiny_vit).double()
    model = apply_lora(copy.deepcopy(tiny_vit), rank=4, alpha=10).double().eval()
    images = torch.randn(
        2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        torch.testing.assert_close(model(images), base(images), rtol=0, atol=0)
        qkv = model.blocks[1].attn.qkv
        qkv.lora_B["default"].weight.normal_(generator=torch.Generator().manual_seed(1))
        x = torch.randn(5, WIDTH, dtype=torch.float64)
        w = base.blocks[1].attn.qkv.weight
        b = base.blocks[1].attn.qkv.bias
        a_matrix = qkv.lora_A["default"].weight  # (r, d)
        b_matrix = qkv.lora_B["default"].weight  # (3d, r)
        expected = x @ w.T + b + (10 / 4) * (x @ a_matrix.T @ b_matrix.T)
        torch.testing.assert_close(qkv(x), expected, rtol=1e-12, atol=1e-12)


def test_lora_configuration_trains_adapters_head_and_norm(tiny_spec: TimmSpec) -> None:
    run_model = build_run_model(lora_settings(tiny_spec), CLASSES, torch.device("cpu"))
    trained = {name for name, _ in run_model.trainable}
    expected = adapter_names(run_model.model) | {
        "head.weight",
        "head.bias",
        "norm.weight",
        "norm.bias",
    }
    assert trained == expected
    frozen = [n for n, p in run_model.model.named_parameters() if not p.requires_grad]
    assert "blocks.0.attn.qkv.base_layer.weight" in frozen
    assert sum(p.numel() for _, p in run_model.trainable) == lora_count(8) + HEAD_AND_NORM


def test_rebuilt_lora_model_is_identical(tiny_spec: TimmSpec) -> None:
    """Resuming rebuilds the model: the adapters' random A must come back the same."""
    settings = lora_settings(tiny_spec)
    first = build_run_model(settings, CLASSES, torch.device("cpu")).model.state_dict()
    second = build_run_model(settings, CLASSES, torch.device("cpu")).model.state_dict()
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key


def test_lora_without_adapters_is_an_error(tiny_vit: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="inject them first"):
        parameter_map(tiny_vit).trained_names("lora")


def test_bad_lora_settings_name_the_key(tiny_spec: TimmSpec, tiny_vit: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match=r"--lora-rank \(finetune.lora.rank\)"):
        bad = lora_settings(tiny_spec, lora_rank=0)
        check_runs([bad.run], bad.training)
    with pytest.raises(ValueError, match=r"--lora-alpha \(finetune.lora.alpha\)"):
        bad = lora_settings(tiny_spec, lora_alpha=0.0)
        check_runs([bad.run], bad.training)
    with pytest.raises(ValueError, match="match no module"):
        apply_lora(tiny_vit, rank=2, alpha=4, target_modules=["blocks.0.nothing"])
    with pytest.raises(ValueError, match="not one string"):  # a regex was the old interface
        apply_lora(tiny_vit, rank=2, alpha=4, target_modules=r"blocks\.\d+\.attn\.qkv")


def test_missing_peft_names_the_extra(
    tiny_vit: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # as if not installed
    with pytest.raises(ImportError, match=r"vitplasticity\[extras\]"):
        apply_lora(tiny_vit, rank=8, alpha=16)


def test_lora_settings_fingerprint_only_lora_runs(tiny_spec: TimmSpec) -> None:
    lora = lora_settings(tiny_spec).fingerprint_fields()
    assert lora["lora_rank"] == 8 and lora["lora_alpha"] == 16.0
    mha = lora_settings(tiny_spec, configuration="mha").fingerprint_fields()
    assert "lora_rank" not in mha and "lora_alpha" not in mha


def test_lora_run_through_the_cli(tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = cli.main(
        [
            "finetune",
            "--experiment", "lora", "--model", "tiny", "--dataset", "demo-stripes",
            "--model-spec", json.dumps(dataclasses.asdict(tiny_spec)),
            "--dataset-dir", str(demo_dataset), "--configuration", "lora",
            "--optimizer", "adamw", "--lr", "0.01", "--seed", "0", "--out-dir", str(out),
            "--steps", "4", "--val-every", "2", "--batch-size", "8", "--micro-batch-size", "8",
            "--warmup-steps", "1", "--device", "cpu", "--num-workers", "0",
            "--lora-rank", "4", "--lora-alpha", "8",
        ]
    )  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["configuration"] == "lora" and summary["status"] == "completed"
    assert summary["trainable_parameters"] == lora_count(4) + HEAD_AND_NORM
    assert summary["settings"]["lora_rank"] == 4 and summary["settings"]["lora_alpha"] == 8.0


def test_lora_run_moves_only_adapters_and_head(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    settings = lora_settings(tiny_spec)
    summary = train(settings.run, settings.training, demo_dataset, tmp_path / "run")
    assert summary["trainable_parameters"] == lora_count(8) + HEAD_AND_NORM
    # The run's grad norms of the adapters land in the "mha" group (they sit in attn.*).
    import polars as pl

    metrics = pl.read_parquet(tmp_path / "run" / "metrics.parquet")
    train_rows = metrics.filter(pl.col("kind") == "train")
    assert train_rows["grad_norm_mha"].drop_nulls().len() > 0
    assert train_rows["grad_norm_fc1"].drop_nulls().len() == 0
