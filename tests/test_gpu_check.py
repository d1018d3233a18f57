"""benchmarks/gpu_check.py (`make gpu-check`) on a CPU: the one line and no work without a GPU,
and the pieces of its GPU path that run anywhere: a real short finetuning run measured the way
the check measures it, its images/s and MFU arithmetic, and the JSON it writes; plus the
`gpu` marker's skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import gpu_check

from tests.helpers.repo import REPO
from vitplasticity.data.synthetic import prepare_synthetic

TINY = {
    "timm_id": "vit_tiny_patch16_224",
    "weights": "random",
    "normalize": "imagenet",
    "kwargs": {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 3, "num_heads": 3},
}


def without_gpu() -> dict[str, str]:
    """This environment with no GPU visible (whatever the machine has) and the worktree's code."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")])
    return env


def test_without_a_gpu_one_line_and_no_work(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--json", str(out)],
        cwd=REPO, env=without_gpu(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("gpu-check: no CUDA device visible to torch, nothing run")
    for part in ("pytest -m gpu", "benchmarks.run --device cuda --quick", str(out)):
        assert part in line
    assert not out.exists()


def test_gpu_marked_tests_are_skipped_without_a_gpu_saying_why() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
         "tests/plasticity/test_plasticity.py"],
        cwd=REPO, env=without_gpu(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    assert "needs a CUDA device, none is visible to torch" in result.stdout
    assert "1 skipped" in result.stdout


def test_steady_images_per_second_leaves_the_warmup_out() -> None:
    times = {1: 0.0, 5: 30.0, 10: 32.5, 30: 42.5}  # steps 6-30 (25 of 4 images) in 12.5 s
    assert gpu_check.steady_images_per_second(times, 4, 5) == pytest.approx(25 * 4 / 12.5)
    with pytest.raises(ValueError, match="--steps"):
        gpu_check.steady_images_per_second({1: 0.0, 5: 1.0, 6: 2.0}, 4, 5)


def test_mfu_is_against_each_runs_precision_peak() -> None:
    runs = {name: {"images_per_second": 100.0} for name in ("fp32", "bf16", "bf16_compile")}
    peaks = {"fp32": 5e13, "bf16": 5e14}
    with_mfu = gpu_check.add_mfu(runs, 1e11, peaks)
    assert with_mfu["fp32"]["mfu"] == pytest.approx(1e13 / 5e13)
    assert with_mfu["bf16"]["mfu"] == with_mfu["bf16_compile"]["mfu"] == pytest.approx(0.02)


def test_a_short_real_run_measured_and_written_as_the_check_does(tmp_path: Path) -> None:
    """The check's GPU path on the CPU with a tiny ViT: fp32 and bf16 runs through
    finetune.train.train, then the JSON."""
    dataset = tmp_path / "synthetic"
    spec = {"style": "blobs", "num_classes": 4, "n_pool": 48, "n_test": 16, "image_size": 32}
    prepare_synthetic(dataset, "synthetic", {**spec, "seed": 0})
    # bf16 + compile left out: torch.compile on a CPU needs a C++ toolchain and minutes.
    eager = [precision for precision in gpu_check.PRECISIONS if not precision.compile]
    runs = {}
    for precision in eager:
        runs[precision.name] = gpu_check.measure_finetune(
            precision, TINY, dataset, tmp_path / "runs", device="cpu", batch_size=8, steps=6,
            warmup_steps=2, num_workers=0,
        )  # fmt: skip
    for name, run in runs.items():
        assert run["status"] == "completed" and run["peak_memory_bytes"] is None
        assert run["images_per_second"] > 0 and run["warmup_seconds"] > 0
        summary = json.loads((tmp_path / "runs" / name / "summary.json").read_text())
        assert summary["final_step"] == 6 and summary["settings"]["precision"] == run["precision"]
    tests = {"command": "pytest -m gpu", "returncode": 0, "seconds": 1.0, "tail": []}
    bench = {"command": "benchmarks.run", "returncode": 3, "seconds": 1.0, "tail": []}
    report = gpu_check.build_report(
        "stand-in", 2e9, {"fp32": 1e12, "bf16": 2e12, "tf32": 1.5e12}, runs, tests, bench,
        matmul_size=1024, wall_seconds=5.0,
    )  # fmt: skip
    assert report["failed"] == ["benchmarks_run"]
    assert report["finetune"]["bf16"]["mfu"] == pytest.approx(
        runs["bf16"]["images_per_second"] * 2e9 / 2e12
    )
    assert report["finetune"]["tf32"]["mfu"] == pytest.approx(
        runs["tf32"]["images_per_second"] * 2e9 / 1.5e12
    )
    documented = (REPO / "docs/benchmarks.md").read_text()
    for key in (*report, *report["finetune"]["fp32"]):
        assert f"`{key}`" in documented, f"{key} is not described in docs/benchmarks.md"
