"""vitplasticity.workflow.calibration: the runtime a job asks for comes from measured speed,
in order: finished runs of the same model and precision on the same GPU kind, a gpu-check
JSON, the GPU class table, the A100 estimate. The paper's ViT-B/16 CIFAR-10 fp32 run
(10,000 steps of 512 images, +30% evaluation, +15 minutes) under each, worked out by hand:

| calibration | images/s | minutes |
|---|---|---|
| finished H200 runs (median of 395, 400, 410) | 400 | 5.12e6 x 1.3 / 400 / 60 + 15 = 292.3 -> 292 |
| gpu-check JSON (H100, fp32 350 images/s) | 350 | 5.12e6 x 1.3 / 350 / 60 + 15 = 331.9 -> 331 |
| table, H200 (measured 400 images/s) | 400 | 292 |
| A100 estimate (14 TFLOP/s) | 133.1 | 848 (tests/workflow/test_costs.py) |
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from snakemake.iocontainers import Wildcards

from tests.helpers.workflow import paper_dry_run, planned_jobs
from vitplasticity.workflow import calibration, runtime
from vitplasticity.workflow.costs import JobRuntimes

VIT_B_FLOPS = 105_147_150_336
CELL = Wildcards(fromdict={"model": "vit_base", "dataset": "cifar10"})


def _summary(device: str, images_per_second: float, **changes: Any) -> dict[str, Any]:
    """A finished run's summary.json as the project writes it (the fields calibration reads,
    from a recorded one; model_spec as config.yaml's vit_base)."""
    record = {
        "model": "vit_base",
        "status": "completed",
        "device": device,
        "images_per_second": images_per_second,
        "settings": {
            "precision": "fp32",
            "model_spec": {"timm_id": "vit_base_patch16_224.orig_in21k", "kwargs": {}},
        },
    }
    for key, value in changes.items():
        if key in ("precision", "model_spec"):
            record["settings"][key] = value
        else:
            record[key] = value
    return record


# Recorded provenance: three H200 ViT-B fp32 runs; and runs that must not count: on an H100,
# on a CPU, in bf16, a shrunk model (kwargs), a diverged run.
SUMMARIES = [
    _summary("cuda:NVIDIA H200", 395.0),
    _summary("cuda:NVIDIA H200", 400.0),
    _summary("cuda:NVIDIA H200", 410.0),
    _summary("cuda:NVIDIA H100 80GB HBM3", 350.0),
    _summary("cpu:x86_64", 3.0),
    _summary("cuda:NVIDIA H200", 2366.0, precision="bf16"),
    _summary(
        "cuda:NVIDIA H200",
        9000.0,
        model_spec={"timm_id": "vit_base_patch16_224", "kwargs": {"depth": 3}},
    ),
    _summary("cuda:NVIDIA H200", 10.0, status="diverged"),
]

# A recorded `make gpu-check` JSON (the fields calibration reads; docs/benchmarks.md).
GPU_CHECK = {
    "device": "NVIDIA H100 80GB HBM3",
    "train_flops_per_image": VIT_B_FLOPS,
    "finetune": {
        "fp32": {"precision": "fp32", "compile": False, "status": "completed",
                 "images_per_second": 350.0},
        "bf16": {"precision": "bf16", "compile": False, "status": "completed",
                 "images_per_second": 2100.0},
        "bf16_compile": {"precision": "bf16", "compile": True, "status": "completed",
                         "images_per_second": 2700.0},
    },
    "failed": [],
}  # fmt: skip


def _config(
    paper: dict[str, Any], tmp_path: Path, summaries: list, check: bool, gpu_class: str | None
) -> dict[str, Any]:
    config = copy.deepcopy(paper)
    results = tmp_path / "results"
    for index, summary in enumerate(summaries):
        run = results / "finetune" / "sgd" / "vit_base" / "cifar10" / "full" / f"lr{index}_seed0"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps(summary))
    config["paths"]["results"] = str(results)
    if check:
        (tmp_path / "gpu_check.json").write_text(json.dumps(GPU_CHECK))
        config["scheduler"]["gpu_check"] = str(tmp_path / "gpu_check.json")
    config["scheduler"]["gpu_class"] = gpu_class
    return config


@pytest.mark.parametrize(
    ("summaries", "check", "gpu_class", "source", "minutes"),
    [
        (SUMMARIES, True, "H200", "finished", 292),
        ([], True, "H200", "gpu_check", 331),
        ([], False, "H200", "table", 292),
        ([], False, None, "a100_estimate", 848),
        # Finished runs on another GPU kind do not count: the H200 class skips the H100 run.
        (SUMMARIES[3:4], False, "H200", "table", 292),
        # Without a class, any GPU's finished runs do: the H100 run's 350 images/s.
        (SUMMARIES[3:4], False, None, "finished", 331),
    ],
    ids=["finished", "gpu_check", "table", "a100", "other_kind", "any_kind"],
)
def test_calibration_order_for_the_paper_vit_b_cifar10_fp32_run(
    paper: dict[str, Any], tmp_path: Path, summaries: list, check: bool,
    gpu_class: str | None, source: str, minutes: int,
) -> None:  # fmt: skip
    config = _config(paper, tmp_path, summaries, check, gpu_class)
    costs = JobRuntimes(config)
    timm_id = config["models"]["vit_base"]["timm_id"]
    assert (
        runtime.throughput(timm_id, "fp32", costs.calibration, training_run=True).source == source
    )
    assert costs.finetune(CELL, 1) == minutes
    assert costs.finetune(CELL, 2) > minutes  # a retry still asks for more


def test_finished_speed_is_the_median_of_the_matching_runs() -> None:
    records = [(f"run{i}/summary.json", summary) for i, summary in enumerate(SUMMARIES)]
    speeds, notes = calibration.finished_speeds(records, "H200", runtime.train_gflop_per_image)
    assert notes == []
    assert speeds == {
        ("vit_base_patch16_224", "fp32"): 400.0,
        ("vit_base_patch16_224", "bf16"): 2366.0,
    }


def test_gpu_check_gives_tflops_of_its_uncompiled_runs(tmp_path: Path) -> None:
    path = tmp_path / "check.json"
    path.write_text(json.dumps(GPU_CHECK))
    tflops, notes = calibration.gpu_check_tflops(path)
    assert notes == []
    assert set(tflops) == {"fp32", "bf16"}
    assert float(tflops["fp32"]) == pytest.approx(350.0 * VIT_B_FLOPS / 1e12, rel=1e-15)


def test_table_marks_what_was_measured() -> None:
    h200 = calibration.GPU_CLASS_TFLOPS["H200"]
    assert float(h200["fp32"]) == pytest.approx(400 * VIT_B_FLOPS / 1e12)
    assert float(h200["bf16"]) == pytest.approx(2366 * VIT_B_FLOPS / 1e12)
    assert {("H200", "fp32"), ("H200", "bf16")} == calibration.MEASURED


def test_a_missing_gpu_check_file_is_a_config_error(paper: dict[str, Any], tmp_path: Path) -> None:
    config = _config(paper, tmp_path, [], False, None)
    config["scheduler"]["gpu_check"] = str(tmp_path / "check.json")
    with pytest.raises(ValueError, match=r"scheduler\.gpu_check: .*check\.json: no such file"):
        JobRuntimes(config).finetune(CELL, 1)


def _damaged(field: str, value: Any) -> dict[str, Any]:
    check = copy.deepcopy(GPU_CHECK)
    if field == "finetune.fp32.images_per_second":
        check["finetune"]["fp32"]["images_per_second"] = value
    else:
        check[field] = value
    return check


# One row per damaged source (issue 42): (id, summaries as raw bytes, gpu-check JSON as raw
# bytes or None, words the note must hold, the minutes then asked for and their source).
# 848: the A100 estimate; 292: the finished H200 runs left; 331: the gpu-check's H100 fp32.
GOOD = [json.dumps(summary).encode() for summary in SUMMARIES[:3]]
DAMAGED: list[tuple[str, list[bytes], bytes | None, list[str], int]] = [
    ("speed-not-a-number", [json.dumps(_summary("cuda:H200", "fast")).encode()], None,
     ["images_per_second is 'fast', not a number"], 848),
    ("speed-absurdly-slow", [json.dumps(_summary("cuda:H200", 1e-9)).encode()], None,
     ["slower than any GPU"], 848),
    ("speed-negative", [json.dumps(_summary("cuda:H200", -400.0)).encode()], None,
     ["not a positive speed"], 848),
    ("speed-nan", [b'{"status": "completed", "device": "cuda:H200", "images_per_second": NaN,'
                   b' "settings": {"precision": "fp32", "model_spec": {"timm_id": "vit_base_patch16_224"}}}'],
     None, ["not a positive speed"], 848),
    ("speed-above-any-peak", [json.dumps(_summary("cuda:H200", 1e9)).encode()], None,
     ["above any GPU's fp32 peak"], 848),
    ("truncated-summary", [GOOD[0][:40], *GOOD], None, ["not readable JSON"], 292),
    ("summary-a-list", [b"[1, 2]", *GOOD], None, ["not a finetuning run's summary"], 292),
    ("gpu-check-runs-a-list", [], json.dumps(_damaged("finetune", [1])).encode(),
     ["scheduler.gpu_check", "not a gpu-check JSON", "AttributeError"], 848),
    ("gpu-check-flops-divide-by-zero", [],
     json.dumps(_damaged("train_flops_per_image", "1/0")).encode(),
     ["scheduler.gpu_check", "ZeroDivisionError"], 848),
    ("gpu-check-not-json", [], b"{not json", ["scheduler.gpu_check", "not a gpu-check JSON"], 848),
    ("gpu-check-speed-negative", [],
     json.dumps(_damaged("finetune.fp32.images_per_second", -350.0)).encode(),
     ["scheduler.gpu_check", "the fp32 run", "not a positive speed"], 848),
]  # fmt: skip


@pytest.mark.parametrize(
    ("summaries", "check", "words", "minutes"),
    [row[1:] for row in DAMAGED],
    ids=[row[0] for row in DAMAGED],
)
def test_a_damaged_calibration_source_is_named_and_left_out(
    paper: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture,
    summaries: list[bytes], check: bytes | None, words: list[str], minutes: int,
) -> None:  # fmt: skip
    config = _config(paper, tmp_path, [], False, None)
    for index, content in enumerate(summaries):
        run = tmp_path / "results/finetune/sgd/vit_base/cifar10/full" / f"lr{index}_seed0"
        run.mkdir(parents=True)
        (run / "summary.json").write_bytes(content)
    if check is not None:
        (tmp_path / "check.json").write_bytes(check)
        config["scheduler"]["gpu_check"] = str(tmp_path / "check.json")
    costs = JobRuntimes(config)
    assert costs.finetune(CELL, 1) == minutes
    notes = costs.calibration.notes
    damaged = next(note for note in notes if all(word in note for word in words))
    named = "check.json" if check is not None else "summary.json"
    assert str(tmp_path) in damaged and named in damaged, notes
    assert "left out" in damaged
    assert "the wall times asked for use" in notes[-1]
    err = capsys.readouterr().err
    assert err.count(damaged) == 1  # said once, on stderr


def test_tf32_has_an_estimate(paper: dict[str, Any]) -> None:
    config = copy.deepcopy(paper)
    config["finetune"]["precision"] = "tf32"
    minutes = JobRuntimes(config).finetune(CELL, 1)
    # Half the bf16 rate on an A100: 5.12e6 x 1.3 x 105.147 GFLOP / 53.8112 TFLOP/s / 60 + 15.
    expected = 5.12e6 * 1.3 * VIT_B_FLOPS / 53.8112e12 / 60 + 15
    assert minutes == int(expected)


@pytest.mark.slow
def test_the_papers_dry_run_names_a_damaged_summary_and_gpu_check_and_completes(
    tmp_path: Path,
) -> None:
    """One truncated summary.json in the results tree (a node that died while writing) and a
    damaged gpu-check JSON: `snakemake -n all` still plans every job, naming both files."""
    run = tmp_path / "results/finetune/sgd/vit_base/cifar10/full/lr0.1_seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_bytes(json.dumps(SUMMARIES[0]).encode()[:50])
    check = tmp_path / "gpu_check.json"
    check.write_text(json.dumps(_damaged("finetune", [1])))
    result = paper_dry_run(tmp_path, "all", edit=f"scheduler: {{gpu_check: {check}}}\n")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    damaged = (run / "summary.json").relative_to(tmp_path)  # paths.results is relative
    assert f"calibration: {damaged}: not readable JSON" in out
    assert f"calibration: scheduler.gpu_check: {check}: not a gpu-check JSON" in out
    assert "Traceback" not in out
    assert planned_jobs(result)["finetune"] > 1000
