"""GPU placement of local jobs (vitplasticity.utils.gpu_slots) with stand-in devices: a device list in
CUDA_VISIBLE_DEVICES, a stand-in `nvidia-smi` on PATH; real launcher processes, real locks.

The jobs are small Python programs run through ``python -m vitplasticity.utils.gpu_slots --``: each
writes what it was given (device, slot, pid) and when it ran, and holds its slot until told to
go (a release file) or for a set time.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from tests.helpers.cli_errors import refusal
from tests.helpers.repo import REPO
from tests.helpers.workflow import snakemake
from vitplasticity.finetune import finished
from vitplasticity.provenance import provenance
from vitplasticity.utils import gpu_slots
from vitplasticity.utils.io import read_parquet_metadata

LAUNCHER = [sys.executable, "-m", "vitplasticity.utils.gpu_slots", "--"]

# A job: records its start, holds its slot until RELEASE exists (or for HOLD seconds), then
# records its end; exits with EXIT.
JOB = """
import json, os, sys, time
out, release, hold, code = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
record = {"device": os.environ.get("CUDA_VISIBLE_DEVICES"),
          "slot": os.environ.get("VITPLASTICITY_GPU_SLOT"), "pid": os.getpid(),
          "start": time.time()}
with open(out + ".started", "w") as f:
    json.dump(record, f)
deadline = time.time() + hold
while not os.path.exists(release) and time.time() < deadline:
    time.sleep(0.02)
record["end"] = time.time()
with open(out, "w") as f:
    json.dump(record, f)
sys.exit(code)
"""


def job_env(tmp_path: Path, **variables: str | None) -> dict[str, str]:
    """The environment of a launched job: this one, the worktree's package first, its own
    lock folder, without SLURM's job id; ``variables`` set (None: removed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env[gpu_slots.LOCK_DIR_VARIABLE] = str(tmp_path / "locks")
    for name, value in variables.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def start_job(
    tmp_path: Path, name: str, env: dict[str, str], hold: float = 60.0, code: int = 0
) -> subprocess.Popen:
    out, release = tmp_path / f"{name}.json", tmp_path / f"{name}.release"
    command = [*LAUNCHER, sys.executable, "-c", JOB, str(out), str(release), str(hold), str(code)]
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)


def started(tmp_path: Path, name: str) -> dict | None:
    path = tmp_path / f"{name}.json.started"
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not yet, or still being written
        return None


def wait_started(tmp_path: Path, names: list[str], timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = [started(tmp_path, name) for name in names]
        if all(records):
            return records
        time.sleep(0.05)
    raise AssertionError(f"not started within {timeout} s: {names}")


def release(tmp_path: Path, name: str) -> None:
    (tmp_path / f"{name}.release").touch()


def finish(process: subprocess.Popen) -> tuple[int, str]:
    """The job's exit status and what it wrote to stderr (the launcher's lines)."""
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


@pytest.fixture
def fake_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in `nvidia-smi` first on PATH listing two GPUs the way the driver does."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "-L" ] || exit 9\n'
        "echo 'GPU 0: NVIDIA Stand-in (UUID: GPU-00000000-0000-0000-0000-000000000000)'\n"
        "echo 'GPU 1: NVIDIA Stand-in (UUID: GPU-11111111-1111-1111-1111-111111111111)'\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return bindir


def test_visible_devices_follow_cuda_semantics() -> None:
    assert gpu_slots.visible_devices({}) is None
    assert gpu_slots.visible_devices({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpu_slots.visible_devices({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == ["0", "1", "2"]
    assert gpu_slots.visible_devices({"CUDA_VISIBLE_DEVICES": "GPU-ab12, 3"}) == ["GPU-ab12", "3"]
    # CUDA stops at the first negative index.
    assert gpu_slots.visible_devices({"CUDA_VISIBLE_DEVICES": "2,-1,3"}) == ["2"]
    mig = "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/7/0"
    assert gpu_slots.visible_devices({"CUDA_VISIBLE_DEVICES": mig}) == [mig]


@pytest.mark.parametrize("value", ["abc", "0,gpu1", "1.5", "GPU-", "0,-x"])
def test_cuda_visible_devices_other_than_indices_or_ids_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="is neither a device index") as error:
        gpu_slots.visible_devices({"CUDA_VISIBLE_DEVICES": value})
    assert str(error.value).startswith(f"CUDA_VISIBLE_DEVICES={value!r}: ")


def test_the_driver_lists_the_devices_when_cuda_visible_devices_is_unset(
    fake_driver: Path,
) -> None:
    assert gpu_slots.driver_devices() == ["0", "1"]
    assert gpu_slots.find_devices({}) == ["0", "1"]
    assert gpu_slots.find_devices({"CUDA_VISIBLE_DEVICES": "1"}) == ["1"]


def test_without_a_driver_no_device_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert gpu_slots.driver_devices(driver_nodes=(str(tmp_path / "nvidiactl"),)) == []


def test_a_job_takes_a_device_from_the_driver(tmp_path: Path, fake_driver: Path) -> None:
    env = job_env(tmp_path, PATH=os.environ["PATH"])
    assert finish(start_job(tmp_path, "a", env, hold=0))[0] == 0
    record = json.loads((tmp_path / "a.json").read_text())
    assert record["device"] == record["slot"] == "0"


def test_concurrent_jobs_get_distinct_slots_every_slot_and_the_rest_wait(tmp_path: Path) -> None:
    """3 slots, 5 jobs: the first 3 hold every slot, one each; the 2 others wait until a
    slot is released, then take the released ones."""
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0,1,2")
    holders = {name: start_job(tmp_path, name, env) for name in ("h0", "h1", "h2")}
    records = wait_started(tmp_path, list(holders))
    assert sorted(r["device"] for r in records) == ["0", "1", "2"]
    assert all(r["slot"] == r["device"] for r in records)
    waiters = {name: start_job(tmp_path, name, env) for name in ("w0", "w1")}
    time.sleep(2.0)
    assert started(tmp_path, "w0") is None and started(tmp_path, "w1") is None, "oversubscribed"
    freed = {r["device"] for r in records[:2]}
    release(tmp_path, "h0")
    release(tmp_path, "h1")
    waited = wait_started(tmp_path, list(waiters))
    assert {r["device"] for r in waited} == freed
    for name in (*holders, *waiters):
        release(tmp_path, name)
    assert [finish(p)[0] for p in holders.values()] == [0] * 3
    for process in waiters.values():
        status, stderr = finish(process)
        assert status == 0 and "are taken by other jobs" in stderr


def test_many_short_jobs_never_share_a_slot(tmp_path: Path) -> None:
    """8 jobs at once on 3 slots, each holding its slot 0.5 s: on each device, the jobs' times
    never overlap, and at most 3 run at any moment."""
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0,1,2")
    names = [f"j{i}" for i in range(8)]
    processes = [start_job(tmp_path, name, env, hold=0.5) for name in names]
    assert [finish(p)[0] for p in processes] == [0] * 8
    records = [json.loads((tmp_path / f"{name}.json").read_text()) for name in names]
    assert {r["device"] for r in records} <= {"0", "1", "2"}
    for device in ("0", "1", "2"):
        spans = sorted((r["start"], r["end"]) for r in records if r["device"] == device)
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"two jobs on device {device} at once: {spans}"
    moments = sorted({r["start"] for r in records})
    running = [sum(r["start"] <= t < r["end"] for r in records) for t in moments]
    assert max(running) <= 3


def test_a_killed_holders_slot_is_taken_over(tmp_path: Path) -> None:
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0")
    holder = start_job(tmp_path, "holder", env)
    (record,) = wait_started(tmp_path, ["holder"])
    assert record["pid"] == holder.pid  # the launcher became the job (exec): signals reach it
    waiter = start_job(tmp_path, "waiter", env)
    time.sleep(1.5)
    assert started(tmp_path, "waiter") is None
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    # The dead holder's lock file is still there, with its pid in it: free all the same.
    recorded = gpu_slots.lock_path(tmp_path / "locks", "0").read_text().split()
    assert recorded == [str(holder.pid), socket.gethostname()]
    (taken,) = wait_started(tmp_path, ["waiter"], timeout=30)
    assert taken["device"] == "0"
    release(tmp_path, "waiter")
    assert finish(waiter)[0] == 0


def test_exit_status_passes_through(tmp_path: Path) -> None:
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0")
    assert finish(start_job(tmp_path, "a", env, hold=0, code=7))[0] == 7


@pytest.mark.parametrize(
    "variables",
    [
        {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "5"},  # SLURM placed it already
        {"CUDA_VISIBLE_DEVICES": ""},  # no GPU
    ],
)
def test_under_slurm_or_without_gpus_the_command_runs_unchanged(
    tmp_path: Path, variables: dict[str, str]
) -> None:
    env = job_env(tmp_path, **variables)
    assert finish(start_job(tmp_path, "a", env, hold=0))[0] == 0
    record = json.loads((tmp_path / "a.json").read_text())
    assert record["device"] == variables["CUDA_VISIBLE_DEVICES"]
    assert record["slot"] is None
    assert not (tmp_path / "locks").exists()


def test_a_command_that_cannot_run_is_named(tmp_path: Path) -> None:
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [*LAUNCHER, "no-such-command-here"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 127
    assert "no-such-command-here" in result.stderr


HOLDER = """
import os, sys, time
from vitplasticity.utils import gpu_slots
print(gpu_slots.hold_slot(), os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
time.sleep(float(sys.argv[1]))
"""


def test_a_process_holds_its_slot_until_it_ends(tmp_path: Path) -> None:
    """hold_slot (what the GPU stages' CLI calls first): two processes at once get the two
    devices, a third after the first ends gets the freed one; under the launcher (the slot
    already named) it takes nothing more."""
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0,1")
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "1"], env=env, stdout=subprocess.PIPE, text=True
    )
    second = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "3"], env=env, stdout=subprocess.PIPE, text=True
    )
    outputs = {first.communicate(timeout=60)[0].split()[0]}
    third = subprocess.run(
        [sys.executable, "-c", HOLDER, "0"], env=env, capture_output=True, text=True, timeout=60
    )
    outputs.add(second.communicate(timeout=60)[0].split()[0])
    assert outputs == {"0", "1"}
    # the second still holds its device: the third waited for, or took, the first's
    assert third.stdout.split()[0] in {"0", "1"}
    launched = subprocess.run(
        [sys.executable, "-c", HOLDER, "0"], env={**env, gpu_slots.SLOT_VARIABLE: "1"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert launched.stdout.split() == ["None", "0,1"]


def test_the_gpu_stages_take_a_slot_and_the_others_do_not() -> None:
    from vitplasticity.cli import GPU_COMMANDS, build_parser

    subcommands = build_parser()._subparsers._group_actions[0].choices
    assert set(subcommands) >= GPU_COMMANDS
    assert {"prepare", "reference", "bounds", "table", "download"}.isdisjoint(GPU_COMMANDS)


def test_advice_only_for_several_gpus_without_the_resource() -> None:
    two = {"CUDA_VISIBLE_DEVICES": "0,1"}
    advice = gpu_slots.resources_advice(two, gpu_resource_given=False)
    assert advice is not None and "--resources gpu=2" in advice
    assert gpu_slots.resources_advice(two, gpu_resource_given=True) is None
    assert gpu_slots.resources_advice({**two, "SLURM_JOB_ID": "1"}, False) is None
    assert gpu_slots.resources_advice({"CUDA_VISIBLE_DEVICES": "0"}, False) is None


def test_provenance_records_the_slot_only_when_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gpu_slots.SLOT_VARIABLE, raising=False)
    assert "gpu_slot" not in provenance({})
    monkeypatch.setenv(gpu_slots.SLOT_VARIABLE, "3")
    assert provenance({})["gpu_slot"] == "3"


@pytest.mark.slow
def test_a_local_run_puts_each_gpu_job_on_a_device_of_its_own(tmp_path: Path) -> None:
    """The finetune and plasticity jobs of the mini preset cut to one dataset (its two runs
    and its plasticity) with two stand-in GPUs and `--resources gpu=2`, on `device: auto` (the
    demo's `cpu` takes no slot): each job's results record the device it was given, both used.
    The datasets and the reference set are made first, so that the three GPU jobs are ready
    at once and two of them start together."""
    bindir = Path(sys.executable).parent
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0,1", **{gpu_slots.LOCK_DIR_VARIABLE: None})
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    configfiles = [REPO / n for n in ("config/config.yaml", "config/demo.yaml",
                                      "tests/presets/mini.yaml")]  # fmt: skip
    auto = tmp_path / "auto.yaml"
    auto.write_text(
        "plasticity: {device: auto, datasets: [demo-stripes]}\nfinetune: {device: auto}\n"
        "experiments:\n  sgd: {datasets: [demo-stripes], configurations: [mha, head]}\n"
        "  adam: {enabled: false}\n"
    )
    snakemake = [
        str(bindir / "snakemake"),
        "--snakefile", str(REPO / "workflow/Snakefile"), "--directory", str(tmp_path),
        "--configfile", *map(str, [*configfiles, auto]),
        "--resources", "gpu=2", "--cores", "2",
    ]  # fmt: skip
    inputs = [
        "resources/demo/datasets/demo-stripes",
        "resources/demo/reference/demo_reference.parquet",
    ]
    result = subprocess.run(
        [*snakemake, *inputs], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    command = [*snakemake, "finetune_all", "plasticity_all"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    results = tmp_path / "results/demo"
    slots = [
        json.loads(path.read_text())["gpu_slot"]
        for path in sorted(results.glob("finetune/**/summary.json"))
        if finished.KEPT_DIR not in path.parts  # not a run's kept copy of its summary
    ]
    pairs = sorted(results.glob("plasticity/*/*.parquet"))
    slots += [read_parquet_metadata(path)["provenance"]["gpu_slot"] for path in pairs]
    assert len(slots) == 2 + 2  # 2 runs; 1 dataset x (pairs, summary)
    assert set(slots) == {"0", "1"}
    assert pl.read_parquet(pairs[0]).height > 0


@pytest.mark.slow
@pytest.mark.parametrize(("options", "said"), [((), True), (("--resources", "gpu=2"), False)])
def test_a_local_run_on_several_gpus_says_once_how_to_use_them(
    tmp_path: Path, options: tuple[str, ...], said: bool
) -> None:
    """Two stand-in GPUs: without `--resources gpu` the run says once how to use them
    (one small CPU job run); with it, nothing. The demo preset packs finetuning runs, whose
    own start check (a cluster executor refused) runs beside this one."""
    bindir = Path(sys.executable).parent
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0,1")
    env["PATH"] = f"{bindir}{os.pathsep}{env['PATH']}"
    configfiles = ["config/config.yaml", "config/demo.yaml"]
    command = [
        str(bindir / "snakemake"),
        "--snakefile", str(REPO / "workflow/Snakefile"), "--directory", str(tmp_path),
        "--configfile", *(str(REPO / name) for name in configfiles),
        *options, "--cores", "1", "resources/demo/datasets/demo-reference",
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert output.count("2 GPUs found (0, 1)") == (1 if said else 0), output[-5000:]
    if said:
        assert "--resources gpu=2" in output


# --- what a GPU stage's command says when it cannot take a slot ----------------------------
#
# One row per case: the environment the command runs with, whether a stand-in orphan holds
# GPU 0's lock, and the words its one ERROR line must hold. Each runs `vitplasticity
# plasticity` in-process, with a wait of at most 1 s: exit 2, one line, nothing written.


@dataclass(frozen=True)
class SlotCase:
    name: str
    variables: dict[str, str]
    says: list[str]
    held: bool = False


SLOT_CASES = [
    SlotCase(
        "cuda_visible_devices_not_a_device",
        {"CUDA_VISIBLE_DEVICES": "abc"},
        ["CUDA_VISIBLE_DEVICES='abc': 'abc' is neither a device index"],
    ),
    SlotCase(
        "wait_not_a_number",
        {"CUDA_VISIBLE_DEVICES": "0", gpu_slots.WAIT_VARIABLE: "six hours"},
        [f"{gpu_slots.WAIT_VARIABLE}='six hours': expected a number of seconds above 0"],
    ),
    SlotCase(
        "gpu_held_by_a_live_orphan",
        {"CUDA_VISIBLE_DEVICES": "0", gpu_slots.WAIT_VARIABLE: "1"},
        [
            "no GPU free after 1 s: all 1 GPUs are taken by other jobs (GPU 0 by pid {pid} on"
            " host {host}; locks in {locks})",
            f"set {gpu_slots.WAIT_VARIABLE} to wait longer",
        ],
        held=True,
    ),
]


@pytest.fixture
def orphan(tmp_path: Path):
    """A process holding GPU 0's lock (a leftover of a killed job, still running); ended at
    the test's end."""
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0")
    process = start_job(tmp_path, "orphan", env)
    wait_started(tmp_path, ["orphan"])
    yield process
    release(tmp_path, "orphan")
    finish(process)


def plasticity_argv(out: Path, device: str = "auto") -> list[str]:
    return ["plasticity", "--model", "tiny", "--model-spec", "{}", "--reference", "none.parquet",
            "--dataset-dir", "none", "--device", device, "--out", str(out / "p.parquet"),
            "--summary", str(out / "s.parquet")]  # fmt: skip


def slot_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variables: dict[str, str]) -> None:
    for name in ("SLURM_JOB_ID", gpu_slots.SLOT_VARIABLE, gpu_slots.WAIT_VARIABLE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(gpu_slots.LOCK_DIR_VARIABLE, str(tmp_path / "locks"))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("case", SLOT_CASES, ids=[case.name for case in SLOT_CASES])
def test_a_gpu_stage_that_cannot_take_a_slot_says_why(
    case: SlotCase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, request
) -> None:

    pid = request.getfixturevalue("orphan").pid if case.held else None
    slot_env(monkeypatch, tmp_path, case.variables)
    out = tmp_path / "out"
    started = time.monotonic()
    message = refusal(plasticity_argv(out), caplog)
    assert time.monotonic() - started < 30
    for words in case.says:
        assert words.format(pid=pid, host=socket.gethostname(), locks=tmp_path / "locks") in (
            message
        ), message
    assert not out.exists()
    assert gpu_slots.SLOT_VARIABLE not in os.environ


def test_a_waiting_job_names_the_holder_on_stderr_and_gives_up(
    tmp_path: Path, orphan: subprocess.Popen
) -> None:
    env = job_env(tmp_path, CUDA_VISIBLE_DEVICES="0", **{gpu_slots.WAIT_VARIABLE: "1.5"})
    status, stderr = finish(start_job(tmp_path, "waiter", env))
    assert status == 127 and started(tmp_path, "waiter") is None
    holder = f"GPU 0 by pid {orphan.pid} on host {socket.gethostname()}"
    waiting, gave_up = stderr.strip().splitlines()
    assert holder in waiting and "waiting for one, at most 1.5 s" in waiting, stderr
    assert holder in gave_up and "no GPU free after 1.5 s" in gave_up, stderr


def test_a_cpu_job_takes_no_gpu_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, orphan: subprocess.Popen, caplog
) -> None:
    """GPU 0 held, `--device cpu`: the job neither waits for it nor records a slot; it goes
    on to its own inputs (here an empty model entry: the error is theirs, not the slot's)."""
    from vitplasticity import cli

    slot_env(monkeypatch, tmp_path, {"CUDA_VISIBLE_DEVICES": "0", gpu_slots.WAIT_VARIABLE: "1"})
    assert gpu_slots.hold_slot("cpu") is None
    assert gpu_slots.SLOT_VARIABLE not in os.environ
    with caplog.at_level(logging.INFO):
        assert cli.main(plasticity_argv(tmp_path / "out", device="cpu")) == 2
    assert "no GPU free" not in caplog.text and "lacks 'timm_id'" in caplog.text, caplog.text
    assert gpu_slots.SLOT_VARIABLE not in os.environ
    assert [gpu_slots.runs_on_a_gpu(d) for d in ("auto", "cuda", "cuda:1", None)] == [True] * 4
    assert [gpu_slots.runs_on_a_gpu(d) for d in ("cpu", "mps")] == [False, False]


@pytest.mark.slow
def test_a_workflow_run_with_a_bad_device_list_ends_with_the_message_alone(
    tmp_path: Path,
) -> None:
    """The workflow's start-up check reads CUDA_VISIBLE_DEVICES before the first job: a value
    that names no device ends the run with that one message (no File ... lines), nothing
    made."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "abc"}
    result = snakemake(tmp_path, "--cores", "1", "all", env=env)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert "CUDA_VISIBLE_DEVICES='abc'" in output and "neither a device index" in output
    assert 'File "' not in output, output[-3000:]
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()
