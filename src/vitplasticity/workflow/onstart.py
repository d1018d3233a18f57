"""What the workflow checks and says once its jobs are about to start (Snakemake's onstart:
not in a dry run, nor when nothing is to be done): only then is the executor known."""

from __future__ import annotations

import os
from typing import Any

from snakemake.logging import logger

from vitplasticity.utils import gpu_slots


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
