"""finetune.pack_runs: several runs in one process give each run's own, identical results;
through the workflow, each packed rule (vitplasticity.workflow.packs) runs its runs once.

A pack interrupted after some of its runs keeps the finished ones, and the same command again
trains only the others (the interrupted one from its checkpoint), with the results of an
uninterrupted pack; a run folder another process works in is refused, naming that process,
and the other runs are done."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from tests.helpers.repo import REPO
from tests.helpers.tiny_finetune import cli_args
from tests.helpers.tiny_vit import TINY_SPEC
from tests.helpers.workflow import PRESETS, merged, planned_jobs, snakemake
from vitplasticity import cli
from vitplasticity.finetune import finished
from vitplasticity.finetune.outputs import TIMING_FIELDS
from vitplasticity.models.spec import TimmSpec
from vitplasticity.utils.folder_lock import LOCK_NAME, FolderBusy, hold_folder
from vitplasticity.workflow.packs import finetune_packs

RUN_FLAGS = ("configuration", "lr", "seed", "out-dir")


def packed_args(spec: TimmSpec, dataset: Path, runs: list[dict]) -> list[str]:
    argv = cli_args(spec, dataset, Path("unused"))
    for flag in RUN_FLAGS:  # drop the single-run flags and their values
        index = argv.index(f"--{flag}")
        del argv[index : index + 2]
    return [*argv, "--runs", json.dumps(runs)]


def comparable(out: Path) -> tuple[dict, pl.DataFrame]:
    summary = json.loads((out / "summary.json").read_text())
    for key in (*TIMING_FIELDS, "created"):
        summary.pop(key, None)
    return summary, pl.read_parquet(out / "metrics.parquet")


def test_packed_runs_equal_one_process_per_run(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path
) -> None:
    runs = [
        {"configuration": "mha", "lr": 0.05, "seed": 0, "out_dir": str(tmp_path / "packed/mha")},
        {"configuration": "ln1", "lr": 0.1, "seed": 3, "out_dir": str(tmp_path / "packed/ln1")},
    ]
    assert cli.main(packed_args(tiny_spec, demo_dataset, runs)) == 0
    for entry in runs:
        alone = tmp_path / "alone" / entry["configuration"]
        flags = {
            "configuration": entry["configuration"],
            "lr": str(entry["lr"]),
            "seed": str(entry["seed"]),
        }
        assert cli.main(cli_args(tiny_spec, demo_dataset, alone, **flags)) == 0
        packed_summary, packed_metrics = comparable(Path(entry["out_dir"]))
        alone_summary, alone_metrics = comparable(alone)
        assert packed_summary == alone_summary
        assert packed_metrics.equals(alone_metrics)


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        ([], "non-empty JSON list"),
        ([{"configuration": "mha", "lr": 0.1}], "--runs[1]: expected exactly the keys"),
        (
            [{"configuration": "mlp", "lr": 0.1, "seed": 0, "out_dir": "x"}],
            "unknown finetuning configuration 'mlp'",
        ),
    ],
)
def test_bad_runs_stop_before_any_run(
    tiny_spec: TimmSpec,
    demo_dataset: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    runs: list,
    message: str,
) -> None:
    good = {"configuration": "mha", "lr": 0.1, "seed": 0, "out_dir": str(tmp_path / "good")}
    assert cli.main(packed_args(tiny_spec, demo_dataset, [good, *runs] if runs else [])) == 2
    assert message in caplog.text
    assert not (tmp_path / "good").exists()


def test_runs_and_single_run_flags_are_exclusive(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    argv = [*cli_args(tiny_spec, demo_dataset, tmp_path / "x"), "--runs", "[]"]
    assert cli.main(argv) == 2 and "either --runs or" in caplog.text


@pytest.mark.slow
def test_packed_rules_run_every_run_once_under_names_that_stay(tmp_path: Path) -> None:
    """Two packs of one experiment (one dataset with a grid of its own) through `snakemake`:
    every run's files with its exact LR, one job and one log per pack and dataset under the
    pack's name; then datasets reordered and another experiment added: the same rules, and
    nothing to redo."""
    long_lr = 0.0123456789
    sgd = {
        "datasets": ["demo-stripes", "demo-blobs"],
        "configurations": ["head", "mha"],
        "lrs": [0.05],
        "lrs_by_dataset": {"demo-stripes": [0.05, long_lr]},
        "seeds": [0],
    }
    edit = {"finetune": {"pack_runs": True}, "experiments": {"sgd": sgd}}
    edit_file = tmp_path / "edit.yaml"
    edit_file.write_text(yaml.safe_dump(edit))
    packs = [
        pack for pack in finetune_packs(merged(*PRESETS, edit=edit)) if pack.experiment == "sgd"
    ]
    assert [pack.datasets for pack in packs] == [("demo-stripes",), ("demo-blobs",)]
    cells = "results/demo/finetune/sgd/demo_vit"
    targets = [
        f"{cells}/{dataset}/{run_dir}/summary.json"
        for pack in packs
        for dataset in pack.datasets
        for run_dir in pack.run_dirs
    ]
    assert len(targets) == 4 + 2

    result = snakemake(tmp_path, *targets, extra_configfiles=(edit_file,))
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    jobs = planned_jobs(result)
    assert {rule: jobs[rule] for rule in jobs if "finetune" in rule} == {
        pack.name: 1 for pack in packs
    }
    for pack in packs:
        (dataset,) = pack.datasets
        assert (
            tmp_path / f"results/demo/logs/finetune/sgd/demo_vit/{dataset}/{pack.name}.log"
        ).is_file()
        for configuration, lr, seed in pack.runs:
            run_dir = tmp_path / cells / dataset / f"{configuration}/lr{lr:g}_seed{seed}"
            summary = json.loads((run_dir / "summary.json").read_text())
            assert (summary["configuration"], summary["lr"], summary["seed"]) == (
                configuration,
                lr,
                seed,
            )
            assert (run_dir / "metrics.parquet").is_file()

    # The experiment's datasets reordered and another experiment added.
    sgd["datasets"] = ["demo-blobs", "demo-stripes"]
    edit["experiments"]["extra"] = {
        "optimizer": "sgd",
        "models": ["demo_vit"],
        "datasets": ["demo-palette"],
        "configurations": ["ln1"],
        "lrs": [0.1],
        "seeds": [0],
    }
    edit_file.write_text(yaml.safe_dump(edit))
    moved = [
        pack for pack in finetune_packs(merged(*PRESETS, edit=edit)) if pack.experiment == "sgd"
    ]
    assert sorted(pack.name for pack in moved) == sorted(pack.name for pack in packs)
    again = snakemake(tmp_path, "-n", *targets, extra_configfiles=(edit_file,))
    assert planned_jobs(again) == {}


RUN_CONFIGURATIONS = ("mha", "ln1", "fc1", "head")
# Long enough to be caught mid-run (a checkpoint every 2 steps), a second or two each.
STEPS = {"steps": "40", "val-every": "20"}
CLI = "import sys; from vitplasticity import cli; sys.exit(cli.main(sys.argv[1:]))"


def pack(root: Path) -> list[dict]:
    return [
        {"configuration": c, "lr": 0.05, "seed": 0, "out_dir": str(root / c)}
        for c in RUN_CONFIGURATIONS
    ]


def argv(spec: TimmSpec, dataset: Path, runs: list[dict]) -> list[str]:
    args = packed_args(spec, dataset, runs)
    for flag, value in STEPS.items():
        args[args.index(f"--{flag}") + 1] = value
    return args


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The command in a process group of its own (a job's group, to signal it whole), with
    the environment ``env`` (None: this one's)."""
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )


def wait_until(condition, proc: subprocess.Popen[bytes], log: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.02)


def trained(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The folders of the runs that a process set up to train (its "run <folder>:" lines)."""
    return [
        r.getMessage().split()[1].rstrip(":")
        for r in caplog.records
        if r.getMessage().startswith("run ")
    ]


@pytest.fixture(scope="module")
def uninterrupted_pack(demo_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The pack of the interruption tests run once, never interrupted (what each signal's
    rerun must equal); read only."""
    reference = pack(tmp_path_factory.mktemp("uninterrupted"))
    assert cli.main(argv(TINY_SPEC, demo_dataset, reference)) == 0
    return reference


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_a_rerun_trains_only_the_runs_an_interrupted_pack_did_not_finish(
    tiny_spec: TimmSpec,
    demo_dataset: Path,
    uninterrupted_pack: list[dict],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    sig: signal.Signals,
) -> None:
    runs = pack(tmp_path / "packed")
    folders = [Path(r["out_dir"]) for r in runs]
    log = tmp_path / "first.log"
    proc = start(argv(tiny_spec, demo_dataset, runs), log)
    # Caught with two runs finished and the third mid-run, past a checkpoint.
    wait_until(lambda: (folders[2] / "checkpoint.pt").exists(), proc, log)
    os.killpg(proc.pid, sig)
    assert proc.wait(timeout=60) != 0
    done = [f for f in folders if (f / "summary.json").exists()]
    assert done == folders[:2], log.read_text()[-3000:]
    assert all((f / finished.KEPT_DIR / finished.RECORD).is_file() for f in done)
    # What Snakemake does to the outputs of an interrupted job before its rerun.
    for folder in done:
        (folder / "summary.json").unlink()
        (folder / "metrics.parquet").unlink()

    with caplog.at_level("INFO"):
        assert cli.main(argv(tiny_spec, demo_dataset, runs)) == 0
    assert trained(caplog) == [str(f) for f in folders[2:]]
    kept = [r.getMessage() for r in caplog.records if "finished by an earlier job" in r.msg]
    assert len(kept) == 2
    resumed = [json.loads((f / "summary.json").read_text())["resumed"] for f in folders]
    assert resumed == [False, False, True, False]  # the third from its checkpoint

    for folder, entry in zip(folders, uninterrupted_pack, strict=True):
        ours, theirs = comparable(folder), comparable(Path(entry["out_dir"]))
        for key in ("resumed", "git_commit"):  # a kept run's commit is its first attempt's
            ours[0].pop(key), theirs[0].pop(key)
        assert ours[0] == theirs[0] and ours[1].equals(theirs[1])
        # Left as an uninterrupted run leaves its folder: its two files and their copy.
        listing = sorted(p.name for p in folder.iterdir())
        assert listing == ["finished", "metrics.parquet", "summary.json"]


def test_a_kept_run_with_other_settings_code_or_altered_files_is_trained_again(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs = pack(tmp_path)
    folders = [Path(r["out_dir"]) for r in runs]
    # The second run's folder held here: the pack fails after the others, keeping them.
    with hold_folder(folders[1]):
        assert cli.main(packed_args(tiny_spec, demo_dataset, runs)) == 2
    kept = [f / finished.KEPT_DIR for f in folders]
    assert [k.is_dir() for k in kept] == [True, False, True, True]
    (kept[0] / "summary.json").write_text("{}")
    record = json.loads((kept[2] / finished.RECORD).read_text())
    (kept[2] / finished.RECORD).write_text(json.dumps({**record, "fingerprint": "other"}))
    record = json.loads((kept[3] / finished.RECORD).read_text())
    loop = "vitplasticity/finetune/loop.py"
    older = {**record, "code": {**record["code"], "sources": {loop: "0" * 64}}}
    (kept[3] / finished.RECORD).write_text(json.dumps(older))
    for folder in folders:  # what Snakemake does to the outputs of an interrupted job
        for name in finished.OUTPUTS:
            (folder / name).unlink(missing_ok=True)
    caplog.clear()
    with caplog.at_level("INFO"):
        assert cli.main(packed_args(tiny_spec, demo_dataset, runs)) == 0
    assert trained(caplog) == [str(f) for f in folders]
    assert "missing or altered" in caplog.text and "kept by other settings" in caplog.text
    assert f"kept by other code ({loop} changed)" in caplog.text
    # Each copy now records this training, with this code.
    for folder, copy in zip(folders, kept, strict=True):
        record = json.loads((copy / finished.RECORD).read_text())
        assert finished.code_changes(record["code"]) == [] and record["fingerprint"] != "other"
        assert (copy / "summary.json").read_bytes() == (folder / "summary.json").read_bytes()


# The clone's training-loop line a row changes (its logging: the numbers stay, the code not).
LOOP = "vitplasticity/finetune/loop.py"
LOOP_LINE = 'log.info("step %d loss %.4f grad %.4f lr %.3g", step'
TRAINED_IN_LOG = re.compile(r"finetune\.setup: run (\S+):")


def git(repo: Path, *args: str) -> None:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.org"]
    subprocess.run(["git", "-C", str(repo), *identity, *args], check=True, capture_output=True)


def clone_env(repo: Path) -> dict[str, str]:
    """This environment, importing vitplasticity from the clone ``repo`` alone."""
    return {**os.environ, "PYTHONPATH": str(repo / "src")}


@pytest.fixture(scope="module")
def interrupted_clone(demo_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository holding a copy of the package, its README and config.yaml, committed;
    beside it (``packed/``) the pack of four runs trained by that copy and killed with two
    runs finished and the third past a checkpoint, their outputs deleted as Snakemake deletes
    an interrupted job's. Read only: each row copies it."""
    root = tmp_path_factory.mktemp("interrupted_clone")
    repo = root / "repo"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "src/vitplasticity", repo / "src/vitplasticity", ignore=ignore)
    (repo / "config").mkdir()
    for name in ("README.md", "config/config.yaml"):
        shutil.copyfile(REPO / name, repo / name)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "the clone")
    runs = pack(root / "packed")
    folders = [Path(r["out_dir"]) for r in runs]
    log = root / "first.log"
    proc = start(argv(TINY_SPEC, demo_dataset, runs), log, clone_env(repo))
    wait_until(lambda: (folders[2] / "checkpoint.pt").exists(), proc, log)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) != 0
    assert [(f / finished.KEPT_DIR / finished.RECORD).is_file() for f in folders] == [
        True,
        True,
        False,
        False,
    ], log.read_text()[-3000:]
    for folder in folders[:2]:
        for name in finished.OUTPUTS:
            (folder / name).unlink()
    return root


def edit_readme(repo: Path) -> None:
    readme = repo / "README.md"
    readme.write_text(readme.read_text() + "\nA typo fixed.\n")


def edit_config(repo: Path) -> None:
    config = repo / "config/config.yaml"
    config.write_text(config.read_text() + "\n# a comment\n")


def edit_loop(repo: Path) -> None:
    loop = repo / "src" / LOOP
    text = loop.read_text()
    assert text.count(LOOP_LINE) == 1
    loop.write_text(text.replace(LOOP_LINE, LOOP_LINE.replace("step %d loss", "step %d: loss")))


@pytest.mark.parametrize(
    ("edit", "commit", "retrained"),
    [
        (edit_readme, True, False),
        (edit_config, False, False),
        (edit_loop, True, True),
        (edit_loop, False, True),
    ],
    ids=[
        "README_committed",
        "config_edited_uncommitted",
        "loop_line_committed",
        "loop_line_uncommitted",
    ],
)
def test_only_a_change_to_the_training_code_retrains_the_finished_runs(
    demo_dataset: Path,
    interrupted_clone: Path,
    tmp_path: Path,
    edit: Any,
    commit: bool,
    retrained: bool,
) -> None:
    """Issue 42: a pack interrupted after two finished runs, one change to the repository,
    the same command again (from the changed clone): a README commit or a config.yaml edit
    trains only the two unfinished runs; a changed line of the training loop, committed or
    not, trains all four."""
    root = tmp_path / "clone"
    shutil.copytree(interrupted_clone, root, symlinks=True)
    repo = root / "repo"
    edit(repo)
    if commit:
        git(repo, "commit", "-qam", "the change")
    runs = pack(root / "packed")
    folders = [Path(r["out_dir"]) for r in runs]
    rerun = subprocess.run(
        [sys.executable, "-c", CLI, *argv(TINY_SPEC, demo_dataset, runs)],
        env=clone_env(repo),
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output[-3000:]
    expected = folders if retrained else folders[2:]
    assert TRAINED_IN_LOG.findall(output) == [str(f) for f in expected], output[-3000:]
    assert output.count("finished by an earlier job") == (0 if retrained else 2)
    assert output.count(f"kept by other code ({LOOP} changed)") == (2 if retrained else 0)
    assert all((f / "summary.json").is_file() for f in folders)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda code: code, []),
        (
            lambda code: {**code, "sources": {**code["sources"], LOOP: "0" * 64}},
            [f"{LOOP} changed"],
        ),
        (
            lambda code: {**code, "sources": {**code["sources"], "vitplasticity/gone.py": "0"}},
            ["vitplasticity/gone.py is gone"],
        ),
        (
            lambda code: {**code, "dependencies": {**code["dependencies"], "torch": "1.0"}},
            [f"torch 1.0 is now {metadata.version('torch')}"],
        ),
        (
            lambda code: {"version": code.get("version", "0.1.0"), "git_commit": "991194a"},
            ["kept by a vitplasticity that recorded no source hashes"],
        ),
    ],
    ids=["same_code", "loop_changed", "module_gone", "torch_upgraded", "commit_record"],
)
def test_a_copy_is_kept_by_other_code_when_a_source_or_dependency_differs(
    change: Any, expected: list[str]
) -> None:
    """The record's code against the code installed now (the rerun's check): a loaded
    module's file changed or gone, a numeric dependency of another version, or a record
    keyed by the git commit (before the source hashes) each name what differs."""
    import vitplasticity.finetune.loop  # noqa: F401 (the training loop, loaded as in a run)

    code = finished.code_identity()
    assert LOOP in code["sources"] and "torch" in code["dependencies"]
    assert finished.code_changes(change(code)) == expected


def test_a_finished_single_run_whose_outputs_were_deleted_is_put_back_not_trained(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run of its own (one job of a cluster's group job, say): Snakemake deletes a finished
    run's outputs when its group job is cancelled; the next job of the run puts them back from
    the copy, byte for byte, instead of training it."""
    out = tmp_path / "run"
    args = cli_args(tiny_spec, demo_dataset, out)
    assert cli.main(args) == 0
    first = {name: (out / name).read_bytes() for name in finished.OUTPUTS}
    for name in finished.OUTPUTS:
        (out / name).unlink()
    caplog.clear()
    with caplog.at_level("INFO"):
        assert cli.main(args) == 0
    assert trained(caplog) == []
    assert f"{out}: finished by an earlier job" in caplog.text
    assert {name: (out / name).read_bytes() for name in finished.OUTPUTS} == first


def test_a_job_killed_between_the_outputs_and_their_copy_resumes_from_the_checkpoint(
    tiny_spec: TimmSpec,
    demo_dataset: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checkpoint is removed only once the copy is recorded: a job that dies after
    writing the outputs but before the copy leaves its checkpoint, and the rerun resumes from
    it instead of training the run from its start."""
    out = tmp_path / "run"
    args = cli_args(tiny_spec, demo_dataset, out)

    def killed(out_dir: Path, key: str) -> None:
        raise KeyboardInterrupt("killed before the copy")

    monkeypatch.setattr(finished, "keep", killed)
    with pytest.raises(KeyboardInterrupt):
        cli.main(args)
    assert (out / "summary.json").is_file() and (out / "checkpoint.pt").is_file()
    assert not (out / finished.KEPT_DIR).exists()
    monkeypatch.undo()
    for name in finished.OUTPUTS:  # what Snakemake does to the outputs of a failed job
        (out / name).unlink()
    caplog.clear()
    with caplog.at_level("INFO"):
        assert cli.main(args) == 0
    assert f"resuming {out}/checkpoint.pt from step" in caplog.text
    assert not (out / "checkpoint.pt").exists()
    reference = tmp_path / "reference"
    assert cli.main(cli_args(tiny_spec, demo_dataset, reference)) == 0
    ours, theirs = comparable(out), comparable(reference)
    assert ours[0].pop("resumed") is True and theirs[0].pop("resumed") is False
    assert ours[0] == theirs[0] and ours[1].equals(theirs[1])


def test_a_run_folder_another_process_works_in_is_refused_naming_it(
    tiny_spec: TimmSpec, demo_dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An orphaned job (its Snakemake killed) still trains the second run of the pack when the
    pack is started again: the new process leaves that run alone, saying who has it, does the
    others and fails; once the orphan has ended, the same command does the rest."""
    runs = pack(tmp_path / "packed")
    folders = [Path(r["out_dir"]) for r in runs]
    log = tmp_path / "orphan.log"
    long_run = {**runs[1]}
    orphan_args = argv(tiny_spec, demo_dataset, [long_run])
    orphan_args[orphan_args.index("--steps") + 1] = "100000"
    orphan = start(orphan_args, log)
    try:
        wait_until(lambda: (folders[1] / "checkpoint.pt").exists(), orphan, log)
        with caplog.at_level("INFO"):
            assert cli.main(argv(tiny_spec, demo_dataset, runs)) == 2
        holder = f"pid {orphan.pid} on host {socket.gethostname()}"
        assert f"{folders[1]} is being written by {holder}" in caplog.text
        assert "1 of 4 runs not done" in caplog.text
        assert trained(caplog) == [str(folders[i]) for i in (0, 2, 3)]
        assert not (folders[1] / "summary.json").exists()
    finally:
        os.killpg(orphan.pid, signal.SIGKILL)
        orphan.wait(timeout=60)
    caplog.clear()
    with caplog.at_level("INFO"):
        assert cli.main(argv(tiny_spec, demo_dataset, runs)) == 0
    assert trained(caplog) == [str(folders[1])]
    assert all((f / "summary.json").exists() for f in folders)


def test_a_folder_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from vitplasticity.utils.folder_lock import hold_folder\n"
            "with hold_folder(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout.readline() == b"held\n"
    with pytest.raises(FolderBusy, match=f"pid {holder.pid} on host"), hold_folder(tmp_path):
        pass
    holder.kill()
    holder.wait(timeout=60)
    assert (tmp_path / LOCK_NAME).exists()  # a stale file, no longer locked
    with hold_folder(tmp_path):
        assert f"pid {os.getpid()} " in (tmp_path / LOCK_NAME).read_text()
    assert not (tmp_path / LOCK_NAME).exists()
