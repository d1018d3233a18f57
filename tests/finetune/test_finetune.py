"""Single-component finetuning: trainable sets, the training step, and whole runs.

Everything runs a 3-block, 48-wide random-init ViT at 32 px on a small synthetic dataset.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as functional

from tests.helpers.tiny_finetune import cli_args, first_batch, settings_for
from vitplasticity import cli
from vitplasticity.finetune.gradients import GROUPS
from vitplasticity.finetune.identity import check_runs
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.outputs import METRICS_SCHEMA, TIMING_FIELDS
from vitplasticity.finetune.step import training_step
from vitplasticity.finetune.train import train
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import TimmSpec

CONFIGURATIONS = ("full", "emb", "ln1", "mha", "ln2", "fc1", "fc2", "head")

# What each configuration trains besides the head and final norm, written from the paper's
# definitions (docs/protocol.md) as patterns over timm's parameter names.
PATTERNS = {
    "full": r".*",
    "emb": r"patch_embed\..*|cls_token|pos_embed",
    "ln1": r"blocks\.\d+\.norm1\.(weight|bias)",
    "mha": r"blocks\.\d+\.attn\.(qkv|proj)\.(weight|bias)",
    "ln2": r"blocks\.\d+\.norm2\.(weight|bias)",
    "fc1": r"blocks\.\d+\.mlp\.fc1\.(weight|bias)",
    "fc2": r"blocks\.\d+\.mlp\.fc2\.(weight|bias)",
    "head": r"(?!)",
}
ALWAYS = {"head.weight", "head.bias", "norm.weight", "norm.bias"}
# Per-block parameter count of each block component: weight + bias.
PER_BLOCK = {"ln1": 2, "mha": 4, "ln2": 2, "fc1": 2, "fc2": 2}

CONTRACT_KEYS = {
    "experiment", "model", "dataset", "configuration", "optimizer", "lr", "seed", "status",
    "diverged", "best_step", "best_val_accuracy", "best_val_loss", "test_accuracy",
    "final_step", "steps", "trainable_parameters", "total_parameters", "steps_per_second",
    "images_per_second", "wall_seconds", "device", "resumed", "demo", "settings", "versions",
    "git_commit",
}  # fmt: skip


# One intra-op thread per module (conftest.py: tiny models run fastest so).
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- which parameters each configuration trains ------------------------------------------


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_trainable_names_match_the_paper(tiny_spec: TimmSpec, configuration: str) -> None:
    model = build_model(tiny_spec, num_classes=4)
    names = [name for name, _ in model.named_parameters()]
    assert "blocks.2.attn.qkv.weight" in names and "blocks.0.mlp.fc2.bias" in names
    expected = {n for n in names if re.fullmatch(PATTERNS[configuration], n)} | ALWAYS
    assert parameter_map(model).trained_names(configuration) == expected
    if configuration in PER_BLOCK:  # 3 blocks
        assert len(expected) == 3 * PER_BLOCK[configuration] + len(ALWAYS)
    if configuration == "emb":
        assert expected - ALWAYS == {"patch_embed.proj.weight", "patch_embed.proj.bias",
                                     "cls_token", "pos_embed"}  # fmt: skip


def test_unknown_configuration_lists_the_valid_ones(tiny_vit: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match="full, emb, ln1, mha, ln2, fc1, fc2, head"):
        parameter_map(tiny_vit).trained_names("attention")


# -- the training step --------------------------------------------------------------------


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_frozen_parameters_stay_bit_identical(
    tiny_spec: TimmSpec, demo_dataset: Path, configuration: str
) -> None:
    settings = settings_for(tiny_spec, configuration=configuration, warmup_steps=0, lr=0.1)
    run_model = build_run_model(settings, 4, torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in run_model.model.named_parameters()}
    optimizer = build_optimizer(run_model.trainable, settings)
    for step in range(3):
        images, labels = first_batch(demo_dataset, settings, run_model.preprocessing, step)
        training_step(run_model, optimizer, (images, labels), step, settings, torch.device("cpu"))
    trained = {name for name, _ in run_model.trainable}
    assert trained == parameter_map(run_model.model).trained_names(configuration)
    for name, parameter in run_model.model.named_parameters():
        if name in trained:
            assert parameter.requires_grad and not torch.equal(parameter, before[name]), name
        else:
            assert not parameter.requires_grad and parameter.grad is None, name
            assert torch.equal(parameter, before[name]), name
    # Optimizer state exists only for the trained parameters.
    assert {id(p) for p in optimizer.state} == {id(p) for _, p in run_model.trainable}


def test_step_loss_gradient_and_sgd_update(tiny_spec: TimmSpec, demo_dataset: Path) -> None:
    settings = settings_for(tiny_spec, configuration="full", warmup_steps=0, lr=0.1, steps=10)
    device = torch.device("cpu")
    run_model = build_run_model(settings, 4, device)
    images, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
    # The batch's mean cross-entropy in float64, from the images' own normalisation (0.5/0.5).
    reference = copy.deepcopy(run_model.model).double()
    inputs = (images.double() / 255.0 - 0.5) / 0.5
    with torch.no_grad():
        expected_loss = float(functional.cross_entropy(reference(inputs), labels))
    before = {n: p.detach().double().clone() for n, p in run_model.trainable}
    optimizer = build_optimizer(run_model.trainable, settings)
    result = training_step(run_model, optimizer, (images, labels), 0, settings, device, True)
    assert result.loss == pytest.approx(expected_loss, rel=1e-5)
    assert result.lr == pytest.approx(0.1)  # no warmup: the peak at step 0
    # Per-group norms (before clipping) add up to the total norm; every group is present.
    assert set(result.group_norms) == set(GROUPS)
    assert math.sqrt(sum(v**2 for v in result.group_norms.values())) == pytest.approx(
        result.grad_norm, rel=1e-5
    )
    # The gradients left in .grad are clipped to norm min(total, 1.0).
    grads = {n: p.grad.double() for n, p in run_model.trainable}
    clipped = math.sqrt(sum(float(g.square().sum()) for g in grads.values()))
    assert clipped == pytest.approx(min(result.grad_norm, 1.0), rel=1e-4)
    # First SGD step (momentum buffer = gradient, no weight decay): p - lr * g.
    for name, parameter in run_model.trainable:
        torch.testing.assert_close(
            parameter.detach().double(), before[name] - 0.1 * grads[name], rtol=0, atol=1e-6
        )


def test_micro_batches_accumulate_the_batch_gradient(
    tiny_spec: TimmSpec, demo_dataset: Path
) -> None:
    device = torch.device("cpu")
    results, grads = [], []
    for micro in (8, 4, 2):
        settings = settings_for(tiny_spec, configuration="full", micro_batch_size=micro)
        run_model = build_run_model(settings, 4, device)
        images, labels = first_batch(demo_dataset, settings, run_model.preprocessing)
        optimizer = build_optimizer(run_model.trainable, settings)
        results.append(training_step(run_model, optimizer, (images, labels), 0, settings, device))
        grads.append(torch.cat([p.grad.flatten() for _, p in run_model.trainable]))
    for result, grad in zip(results[1:], grads[1:], strict=True):
        assert result.loss == pytest.approx(results[0].loss, rel=1e-5)
        assert result.grad_norm == pytest.approx(results[0].grad_norm, rel=1e-4)
        torch.testing.assert_close(grad, grads[0], rtol=1e-4, atol=1e-6)


def test_adamw_has_no_weight_decay(tiny_spec: TimmSpec) -> None:
    settings = settings_for(tiny_spec, optimizer="adamw", adam_betas=(0.8, 0.99))
    run_model = build_run_model(settings, 4, torch.device("cpu"))
    optimizer = build_optimizer(run_model.trainable, settings)
    assert isinstance(optimizer, torch.optim.AdamW)
    (group,) = optimizer.param_groups
    assert group["weight_decay"] == 0 and group["betas"] == (0.8, 0.99)
    sgd = build_optimizer(run_model.trainable, settings_for(tiny_spec))
    (group,) = sgd.param_groups
    assert (group["momentum"], group["weight_decay"], group["nesterov"]) == (0.9, 0, False)


# -- settings validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "culprit"),
    [
        ({"micro_batch_size": 3}, "--micro-batch-size (finetune.micro_batch_size)"),
        ({"steps": 0}, "--steps (datasets.<name>.steps)"),
        ({"lr": 0.0}, "--lr"),
        ({"configuration": "attn"}, "--configuration"),
        ({"optimizer": "adam"}, "--optimizer"),
        ({"model_spec": {"timm_id": "x", "wieghts": "random"}}, "--model-spec (models.tiny)"),
    ],
)
def test_bad_settings_name_their_flag(
    tiny_spec: TimmSpec, overrides: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(culprit)):
        settings = settings_for(tiny_spec, **overrides)
        check_runs([settings.run], settings.training)


def test_missing_dataset_is_named_before_compute(tiny_spec: TimmSpec, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--dataset-dir"):
        settings = settings_for(tiny_spec)
        train(settings.run, settings.training, tmp_path / "nope", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- whole runs -----------------------------------------------------------------------------


def test_cli_run_writes_the_contract(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert cli.main([*cli_args(tiny_spec, demo_dataset, out), "--demo"]) == 0
    # Its two outputs and their verified copy (vitplasticity.finetune.finished), no checkpoint.
    assert sorted(p.name for p in out.iterdir()) == ["finished", "metrics.parquet", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= CONTRACT_KEYS
    assert summary["status"] == "completed" and summary["diverged"] is False
    assert summary["demo"] is True and summary["resumed"] is False
    assert (summary["final_step"], summary["steps"]) == (6, 6)
    assert summary["settings"]["configuration"] == "mha"

    metrics = pl.read_parquet(out / "metrics.parquet")
    assert metrics.schema == pl.Schema(METRICS_SCHEMA)
    train = metrics.filter(pl.col("kind") == "train")
    val = metrics.filter(pl.col("kind") == "val")
    assert train["step"].to_list() == [1, 2, 4, 6] and val["step"].to_list() == [3, 6]
    # The learning rate of each logged update: warmup 2 then cosine over 6 steps.
    expected_lr = [
        0.05 * (s - 1) / 2 if s - 1 < 2 else 0.05 * 0.5 * (1 + math.cos(math.pi * (s - 3) / 4))
        for s in train["step"]
    ]
    np.testing.assert_allclose(train["lr"].to_numpy(), expected_lr, rtol=1e-12, atol=1e-15)
    # Gradient norms only for the trained groups; never on validation rows.
    for group in GROUPS:
        column = train[f"grad_norm_{group}"]
        assert column.null_count() == (0 if group in ("mha", "head") else len(train)), group
        assert val[f"grad_norm_{group}"].null_count() == len(val)
    assert train["val_accuracy"].null_count() == len(train)
    assert val["train_loss"].null_count() == len(val)
    for column in ("val_accuracy", "test_accuracy"):
        assert val[column].is_between(0, 1).all()
    # The selected step: best validation accuracy, earliest on ties; its test accuracy.
    best = val.sort(["val_accuracy", "step"], descending=[True, False]).row(0, named=True)
    assert summary["best_step"] == best["step"]
    assert summary["best_val_accuracy"] == best["val_accuracy"]
    assert summary["test_accuracy"] == best["test_accuracy"]
    # 3 blocks x (qkv + proj) x (weight + bias), head (48 x 4 + 4) and final norm (2 x 48).
    qkv, proj = 48 * 144 + 144, 48 * 48 + 48
    assert summary["trainable_parameters"] == 3 * (qkv + proj) + 48 * 4 + 4 + 2 * 48
    model = build_model(tiny_spec, num_classes=4)
    assert summary["total_parameters"] == sum(p.numel() for p in model.parameters())


def test_runs_are_deterministic(tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_spec, configuration="ln2", optimizer="adamw", lr=1e-3)
    first = train(settings.run, settings.training, demo_dataset, tmp_path / "a")
    second = train(settings.run, settings.training, demo_dataset, tmp_path / "b")
    for key in (*TIMING_FIELDS, "created"):
        first.pop(key), second.pop(key)
    assert first == second
    assert pl.read_parquet(tmp_path / "a" / "metrics.parquet").equals(
        pl.read_parquet(tmp_path / "b" / "metrics.parquet")
    )


def test_divergence_is_recorded_not_raised(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "diverged"
    flags = {"lr": "1e30", "warmup-steps": "0", "steps": "20", "val-every": "1"}
    assert cli.main(cli_args(tiny_spec, demo_dataset, out, **flags)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["diverged"] is True
    assert summary["final_step"] < 20
    metrics = pl.read_parquet(out / "metrics.parquet")
    last = metrics.filter(pl.col("kind") == "train").row(-1, named=True)
    assert last["step"] == summary["final_step"]
    assert not (math.isfinite(last["train_loss"]) and math.isfinite(last["grad_norm"]))
    assert not (out / "checkpoint.pt").exists()


def test_cli_rejects_bad_input_with_exit_2(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bad"
    assert cli.main(cli_args(tiny_spec, demo_dataset, out, **{"micro-batch-size": "3"})) == 2
    assert cli.main(cli_args(tiny_spec, tmp_path / "missing", out)) == 2
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_gpu_is_named(tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("--device (finetune.device)")):
        settings = settings_for(tiny_spec, device="cuda")
        train(settings.run, settings.training, demo_dataset, tmp_path / "out")
