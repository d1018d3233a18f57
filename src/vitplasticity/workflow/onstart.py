"""What the workflow checks and says once its jobs are about to start (Snakemake's onstart:
not in a dry run, nor when nothing is to be done): only then is the executor known."""

from __future__ import annotations

import os
from typing import Any

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from vitplasticity.utils import gpu_slots

PACKS_ON_A_CLUSTER = (
    "finetune.pack_runs: true packs runs for one machine (snakemake --cores N), not"
    " for a cluster executor. Switch it off: add workflow/presets/demo_slurm.yaml"
    " last to --configfile (the demo: snakemake --configfile workflow/presets/demo.yaml"
    " workflow/presets/demo_slurm.yaml --profile slurm all), or write"
    " pack_runs: false under finetune: in your config file. To run several runs in"
    " one SLURM job, uncomment the packing block (groups) at the end of"
    " slurm/profile.yaml."
)


def advise_gpu_resources(workflow: Any) -> None:
    """On a local run without --resources gpu on a machine with several GPUs: log how to use
    them (vitplasticity.utils.gpu_slots.resources_advice).

    Args:
        workflow: Snakemake's workflow object (its executor and global resources).
    """
    if workflow.local_exec:
        advice = gpu_slots.resources_advice(os.environ, "gpu" in workflow.global_resources)
        if advice:
            logger.info(advice)


def refuse_packs_on_a_cluster(workflow: Any) -> None:
    """finetune.pack_runs' check: a pack's rule is named by its content, so the workflow
    profile's per-rule GPU, CPU and memory requests (set-resources: finetune) cannot reach it,
    and on a cluster it would be submitted without a GPU.

    Args:
        workflow: Snakemake's workflow object (its executor).

    Raises:
        WorkflowError: under a cluster executor, saying what to do instead.
    """
    if not workflow.local_exec:
        raise WorkflowError(PACKS_ON_A_CLUSTER)
