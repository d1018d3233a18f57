"""The benchmark entry point (keys and sane values, never wall time), its naive reference
model, and the memory property it reports: frozen parameters get no gradient and no
optimizer state."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from benchmarks import job_startup
from benchmarks import run as bench
from benchmarks import streamed as streamed_bench
from benchmarks import tracking as tracking_bench
from benchmarks.memory import state_accounting
from benchmarks.naive import explicit_attention_copy

from tests.helpers.repo import REPO
from tests.helpers.run_settings import finetune_settings
from vitplasticity.finetune.model import build_run_model
from vitplasticity.finetune.optim import build_optimizer
from vitplasticity.finetune.step import training_step
from vitplasticity.models.spec import TimmSpec


def test_quick_benchmark_writes_every_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The DAG timing fails (a config file that does not exist): every other figure is
    # still written, and the JSON names what failed.
    out = tmp_path / "bench.json"
    bench.main(
        ["--quick", "--device", "cpu", "--json", str(out), "--repeats", "2", "--pairs", "8",
         "--threads", "1", "--dag-configfile", str(tmp_path / "missing.yaml")]
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["failed"] == ["dag_seconds"] and result["dag_seconds"] is None
    assert result["raw"]["dag"]["failed"].startswith("exit ")
    for key in bench.KEYS:
        if key == "dag_seconds":
            continue
        assert isinstance(result[key], float) and math.isfinite(result[key]) and result[key] > 0
    raw = result["raw"]
    for part, sides in (("finetune", ("fp32", "bf16", "naive")), ("loader", ("project", "naive"))):
        for side in sides:
            assert raw[part][side]["images_per_second"] > 0
            assert len(raw[part][side]["seconds"]) == 2
    speed = {side: raw["finetune"][side]["images_per_second"] for side in ("fp32", "bf16", "naive")}
    assert result["finetune_fp32_vs_naive"] == pytest.approx(speed["fp32"] / speed["naive"])
    assert result["finetune_bf16_vs_naive"] == pytest.approx(speed["bf16"] / speed["naive"])
    assert result["finetune_bf16_vs_fp32"] == pytest.approx(speed["bf16"] / speed["fp32"])
    fastest = {side: min(raw["finetune"][side]["seconds"]) for side in ("fp32", "bf16")}
    assert raw["finetune"]["bf16_vs_fp32_fastest"] == pytest.approx(
        fastest["fp32"] / fastest["bf16"]
    )
    assert raw["loader"]["ratio"] == pytest.approx(
        raw["loader"]["project"]["images_per_second"] / raw["loader"]["naive"]["images_per_second"]
    )
    assert raw["plasticity"]["ratio"] == pytest.approx(
        raw["plasticity"]["measure"]["median_s"] / raw["plasticity"]["floor"]["median_s"]
    )
    for precision in ("fp32", "bf16", "tf32"):  # the project against the hand loop
        hand = raw["finetune"][f"hand_{precision}"]["images_per_second"]
        assert result[f"finetune_{precision}_vs_hand"] == pytest.approx(
            raw["finetune"][precision]["images_per_second"] / hand
        )
    assert raw["finetune"]["train_flops_per_image"] > 0
    assert raw["mfu"].keys() == raw["matmul_peak_flops"].keys() == {"fp32", "bf16", "tf32"}
    assert all(value > 0 for value in (*raw["mfu"].values(), *raw["matmul_peak_flops"].values()))
    assert {row["configuration"] for row in raw["memory"]} == {"full", "ln1"}
    for row in raw["memory"]:
        assert row["frozen_with_gradient"] == 0 and row["frozen_with_optimizer_state"] == 0
        assert row["peak_bytes"] > 0
    assert result["machine"]["torch_threads"] == 1 and result["machine"]["cpu_count"] >= 1
    assert isinstance(result["machine"]["cpu_bf16_native"], bool)
    printed = capsys.readouterr().out
    for key in (*bench.KEYS, "matmul_bf16_vs_fp32", "mfu_fp32", "mfu_bf16", "CPU bf16 matmuls"):
        assert key in printed


def test_the_dag_is_timed_through_python_m_snakemake() -> None:
    dag = bench.bench_dag(str(REPO / "config/demo.yaml"))
    assert dag["command"].startswith("-m snakemake -n --forceall all")
    assert dag["seconds"] > 0 and dag["jobs"] > 0 and "failed" not in dag


def test_flop_count_of_a_tiny_vit_matches_the_formula() -> None:
    # Forward matmul FLOPs of a ViT, counted by hand: per block qkv 3nd^2, scores and
    # weighted sum 2n^2d, proj nd^2, MLP 8nd^2 (x2 per multiply-add); patch embedding
    # (n-1)*d*3*p^2; head d*classes on the cls token. Training = forward + 2x backward.
    spec = bench.model_spec("unused", quick=True)
    kwargs = spec["kwargs"]
    d, depth, p = kwargs["embed_dim"], kwargs["depth"], kwargs["patch_size"]
    n = (kwargs["img_size"] // p) ** 2 + 1
    forward = 2 * (depth * (12 * n * d * d + 2 * n * n * d) + (n - 1) * d * 3 * p * p + d * 10)
    counted = bench.train_flops_per_image(spec, torch.device("cpu"))
    # The first layer's input gradient is never needed (images do not require grad).
    assert counted == pytest.approx(3 * forward - 2 * (n - 1) * d * 3 * p * p, rel=1e-9)


def test_naive_model_is_the_same_function(tiny_vit: torch.nn.Module) -> None:
    naive = explicit_attention_copy(tiny_vit)
    attention = [m for m in naive.modules() if hasattr(m, "fused_attn")]
    assert attention and not any(m.fused_attn for m in attention)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(naive(images), tiny_vit(images), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("configuration", "optimizer"), [("ln1", "sgd"), ("mha", "adamw")])
def test_frozen_parameters_get_no_gradient_and_no_state(
    tiny_spec: TimmSpec, configuration: str, optimizer: str
) -> None:
    settings = finetune_settings(
        experiment="bench", model="tiny", dataset="synthetic",
        model_spec=dataclasses.asdict(tiny_spec), configuration=configuration, lr=0.01,
        seed=0, steps=2, val_every=2, optimizer=optimizer, batch_size=4, micro_batch_size=4,
        warmup_steps=0, device="cpu",
    )  # fmt: skip
    run_model = build_run_model(settings, num_classes=5, device=torch.device("cpu"))
    opt = build_optimizer(run_model.trainable, settings)
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    for step in range(2):
        training_step(
            run_model, opt, (images, torch.arange(4)), step, settings, torch.device("cpu")
        )
    trained = {id(p) for _, p in run_model.trainable}
    frozen = [p for p in run_model.model.parameters() if id(p) not in trained]
    assert frozen and all(p.grad is None and not p.requires_grad for p in frozen)
    assert all(p.grad is not None for _, p in run_model.trainable)
    assert {id(p) for p in opt.state} == trained
    accounting = state_accounting(run_model.model, opt)
    trained_bytes = sum(4 * p.numel() for _, p in run_model.trainable)
    assert accounting["gradient_bytes"] == trained_bytes
    # SGD keeps one momentum buffer per trained parameter; AdamW two moments (+ step counts).
    states = 1 if optimizer == "sgd" else 2
    assert states * trained_bytes <= accounting["optimizer_state_bytes"]
    assert accounting["optimizer_state_bytes"] <= states * trained_bytes + 8 * len(trained)
    assert accounting["frozen_with_gradient"] == accounting["frozen_with_optimizer_state"] == 0
    assert accounting["trainable_parameters"] < sum(p.numel() for p in run_model.model.parameters())


def test_job_startup_refuses_bad_arguments_naming_them(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        job_startup.parse(["--runs", "9"])
    with pytest.raises(SystemExit):
        job_startup.parse(["--checkout", str(tmp_path)])
    with pytest.raises(SystemExit):
        job_startup.parse(["--packing", "one_job"])
    assert job_startup.parse(["--checkout", str(REPO), "--runs", "2"]).runs == 2


def test_job_startup_packs_the_runs_through_the_config(tmp_path: Path) -> None:
    assert job_startup.grid(4, 48, pack_runs=True)["finetune"]["pack_runs"] is True
    assert job_startup.grid(4, 48)["finetune"]["pack_runs"] is False
    with pytest.raises(SystemExit):  # Snakemake groups, removed, are no way of packing here
        job_startup.parse(["--packing", "groups"])


def test_tracking_benchmark_writes_every_key(tmp_path: Path) -> None:
    out = tmp_path / "tracking.json"
    tracking_bench.main(["--steps", "2", "4", "--repeats", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    for backend in ("wandb_offline", "mlflow_file"):
        assert result[f"{backend}_vs_off"] > 0
        for key in ("fixed_seconds", "per_logged_step_ms", "first_open_seconds"):
            key = f"{backend}_{key}"
            assert math.isfinite(result[key]), key
    assert set(result["raw"]) == {
        f"{name}@{steps}" for name in ("off", "wandb_offline", "mlflow_file") for steps in (2, 4)
    }


def test_streamed_benchmark_compares_both_paths_on_a_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Three fresh processes (build, whole, streamed) on a tiny Llama: the keys, sane figures
    # and the two pair tables agreeing; no wall-time assertion.
    out = tmp_path / "streamed.json"
    streamed_bench.main(
        ["--tiny", "--pairs", "2", "--batch-size", "2", "--threads", "1",
         "--folder", str(tmp_path), "--json", str(out)]
    )  # fmt: skip
    result = json.loads(out.read_text())
    assert result["tables"]["same_rows"] and result["tables"]["rows"] == 2 * 2 * 5
    assert result["tables"]["max_relative_difference"] <= 1e-6
    for side in ("whole", "streamed"):
        figures = result[side]
        assert figures["peak_rss_bytes"] >= figures["rss_after_imports_bytes"] > 0
        assert figures["ru_maxrss_bytes"] > 0 and figures["cuda_max_allocated_bytes"] is None
        for key in ("build_seconds", "measure_seconds", "total_seconds", "total_cpu_seconds"):
            assert math.isfinite(figures[key]) and figures[key] >= 0, (side, key)
        assert [run["threads"] for run in result["runs"][side]] == [1]
    model = result["model"]
    assert model["blocks"] == 2 and model["checkpoint_file_bytes"] > 0
    assert (
        model["parameter_bytes"] == model["outside_blocks_bytes"] + 2 * model["largest_block_bytes"]
    )
    assert model["carried_activation_bytes"] == 2 * 2 * 16 * 64 * 4  # pairs x 2 x L x hidden x 4
    assert result["peak_rss_ratio"] > 0 and "memory_limit" not in result
    printed = capsys.readouterr().out
    for label in ("peak RSS, VmHWM (MiB)", "scaled from 2", "largest block", "pair tables"):
        assert label in printed
