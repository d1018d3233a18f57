"""Each GPU request form the workflow profile offers, through the local SLURM.

workflow/profiles/default/profile.yaml writes its GPU request once (``&gpu_request``) and lists
the forms a site may need instead: ``gpu`` (``sbatch --gpus=1``), ``gres: gpu:1`` and a typed
``gres: gpu:<type>:1`` (``--gres``, for sites that reject ``--gpus``). Here each form other
than the shipped one is put in with the one edit a user makes (tests/helpers/gpu_requests.py)
and a finetuning run submitted through snakemake-executor-plugin-slurm: sacct shows that its
job asked for and got one GPU (``ReqTRES``/``AllocTRES`` ``gres/gpu=1``, ``gres/gpu:<type>=1``
for the typed form) and the form's 8 CPUs, and that the CPU-only job got none. The shipped
form (``{gpu: 1, cpus_per_gpu: 8}``, the first listed) is not submitted again here:
tests/pipeline/test_slurm.py runs the shipped profile unmodified and its check_requests
checks the same in sacct (ReqTRES and AllocTRES ``gres/gpu=1``, the profile's memory, 8 CPUs;
none for the CPU-only jobs) on every finetuning job, single (its cancelled-twice test) or
packed, and every plasticity job (its demo test). The test cluster's node declares typed GPUs
(``gpu:tesla:2``: .ci/start_local_slurm.sh), which every form may take. A pack of runs
(``finetune.pack_runs``) with a ``gres`` form runs its runs one after another on one GPU: the
pack's job asks for one run's GPU, CPUs and memory, not their sum.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.demo_workflow import summaries, workflow_args
from tests.helpers.gpu_requests import gpu_request_forms, shipped_gpu_request, with_gpu_request
from tests.helpers.slurm_harness import (
    REPO,
    WORKFLOW_PROFILE,
    LocalSlurm,
    alloc_tres,
    run_snakemake,
    run_uuids,
    shipped_profile_args,
    wait_for_accounting,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SHIPPED, *FORMS = gpu_request_forms(WORKFLOW_PROFILE.read_text())
# The shipped form, listed first, is tests/pipeline/test_slurm.py's (see above).
assert SHIPPED == shipped_gpu_request(WORKFLOW_PROFILE.read_text()) == {"gpu": 1, "cpus_per_gpu": 8}
FINETUNE_MEM_MB = yaml.safe_load(WORKFLOW_PROFILE.read_text())["set-resources"]["finetune"][
    "mem_mb"
]


def runs(*configurations: str) -> dict:
    """The demo's sgd experiment reduced to ``configurations`` at one learning rate."""
    return {
        "experiments": {
            "sgd": {
                "configurations": list(configurations),
                "lrs_by_dataset": {"demo-stripes": [0.05]},
            }
        }
    }


def form_id(form: dict) -> str:
    return "-".join(f"{key}={value}" for key, value in form.items())


def workflow_profile(folder: Path, form: dict) -> Path:
    """A copy of the shipped workflow profile with its GPU request replaced by ``form``."""
    folder.mkdir()
    (folder / "profile.yaml").write_text(with_gpu_request(WORKFLOW_PROFILE.read_text(), form))
    return folder


def tres_numbers(tres: str) -> dict[str, float]:
    return alloc_tres({"AllocTRES": tres})


def gpu_type(form: dict) -> str | None:
    """The GPU type a form names (gres gpu:<type>:N), or None."""
    parts = str(form.get("gres", "")).split(":")
    return parts[1] if len(parts) == 3 else None


def submitted_jobs(proc: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    """The sacct rows of a Snakemake run's SLURM jobs, once all are accounted."""
    (uuid,) = run_uuids(proc.stdout)
    return wait_for_accounting(uuid, proc.stdout.count("has been submitted with SLURM jobid"))


def check_gpu_job(row: dict[str, str], form: dict) -> None:
    """The job asked for and got one GPU (of the form's type), the form's CPUs and one run's
    memory."""
    for column in ("ReqTRES", "AllocTRES"):
        tres = tres_numbers(row[column])
        assert tres.get("gres/gpu") == 1, (column, row)
        if gpu_type(form):
            assert tres.get(f"gres/gpu:{gpu_type(form)}") == 1, (column, row)
        assert tres["mem"] == FINETUNE_MEM_MB, (column, row)
    cpus = form.get("cpus_per_gpu", form.get("cpus_per_task"))
    assert alloc_tres(row)["cpu"] == cpus, row


@pytest.mark.parametrize("form", FORMS, ids=form_id)
def test_each_gpu_request_form_gets_the_finetune_job_its_gpu(
    local_slurm: LocalSlurm, tmp_path: Path, form: dict
) -> None:
    profile = workflow_profile(tmp_path / "workflow_profile", form)
    args = [
        *workflow_args(tmp_path, runs("head")),
        *shipped_profile_args(jobs=2),
        "--workflow-profile",
        str(profile),
        "finetune_all",
    ]
    proc = run_snakemake(args, REPO, timeout=900)
    rows = submitted_jobs(proc)
    assert {r["State"] for r in rows} == {"COMPLETED"}, rows
    by_rule = {r["Comment"].removeprefix("rule_").split("_wildcards_")[0]: r for r in rows}
    assert sorted(by_rule) == ["finetune", "prepare"], rows
    check_gpu_job(by_rule["finetune"], form)
    assert "gres/gpu" not in alloc_tres(by_rule["prepare"]), by_rule["prepare"]
    assert len(summaries(tmp_path / "results")) == 1


def test_a_pack_with_a_gres_request_runs_its_runs_on_one_gpu(
    local_slurm: LocalSlurm, tmp_path: Path
) -> None:
    """Three runs in one pack (finetune.pack_runs) under the typed gres form: its job asks for
    one GPU, 8 CPUs and one run's memory (the pack's rule gets the one-run rule's resources),
    and all three runs finish."""
    (form,) = [f for f in FORMS if gpu_type(f)]
    packed = {**runs("head", "mha", "fc1"), "finetune": {"pack_runs": True}}
    args = [
        *workflow_args(tmp_path, packed),
        *shipped_profile_args(jobs=2),
        "--workflow-profile",
        str(workflow_profile(tmp_path / "workflow_profile", form)),
        "finetune_all",
    ]
    proc = run_snakemake(args, REPO, timeout=1200)
    rows = submitted_jobs(proc)
    assert {r["State"] for r in rows} == {"COMPLETED"}, rows
    packs = [r for r in rows if "finetune_pack" in r["Comment"]]
    assert len(packs) == 1, rows
    check_gpu_job(packs[0], form)
    assert len(summaries(tmp_path / "results")) == 3
