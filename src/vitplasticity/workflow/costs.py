"""The wall time (minutes) each SLURM job asks for, from the config: vitplasticity.workflow.
runtime's estimates in the precision the job computes in, calibrated by measured speeds
(vitplasticity.workflow.calibration: finished runs, a gpu-check JSON, the GPU class table),
capped at ``scheduler.max_runtime_minutes``, scaled by the retry attempt. Snakemake calls these
as the ``runtime`` resource of every job when it builds the DAG."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from vitplasticity.workflow import calibration, runtime
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.packs import FinetunePack
from vitplasticity.workflow.params import Wildcards
from vitplasticity.workflow.recommend_jobs import recommend_value

Estimate = Callable[[str], int]
"""Minutes of a job of one model, from its timm id."""


class JobRuntimes:
    """The ``runtime`` resource of the finetune, plasticity and recommend jobs.

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.max_minutes: int | None = config["scheduler"]["max_runtime_minutes"]
        self.models = ModelJobs(config)

    @functools.cached_property
    def calibration(self) -> calibration.Calibration:
        """The measured speeds, read once (the results tree scanned when the first runtime
        is asked for); each damaged source it left out said once on stderr."""
        measured = calibration.from_config(self.config, runtime.train_gflop_per_image)
        for note in measured.notes:
            print(f"calibration: {note}", file=sys.stderr)
        return measured

    def model_minutes(self, model: str, estimate: Estimate) -> int | None:
        """The wall time of a job of ``model``: ``estimate(timm_id)``, capped. A model whose
        family has no estimate (a transformers model) asks for scheduler.max_runtime_minutes,
        or, where that is null, for no runtime (Snakemake leaves the resource out: the
        partition's default time)."""
        if not self.models.spec_class(model).runtime_estimated:
            return self.max_minutes
        return runtime.capped(estimate(self.config["models"][model]["timm_id"]), self.max_minutes)

    def _one_run(self, wildcards: Wildcards, attempt: int, timm_id: str) -> int:
        finetune = self.config["finetune"]
        return runtime.finetune_minutes(
            self.config["datasets"][wildcards.dataset]["steps"],
            finetune["batch_size"],
            timm_id,
            finetune["precision"],
            attempt,
            self.calibration,
        )

    def finetune(self, wildcards: Wildcards, attempt: int) -> int | None:
        """Minutes for one finetuning run."""
        return self.model_minutes(
            wildcards.model, lambda timm_id: self._one_run(wildcards, attempt, timm_id)
        )

    def pack(self, pack: FinetunePack) -> Callable[[Wildcards, int], int | None]:
        """The runtime function of ``pack``'s rule: its runs one after another."""

        def minutes(wildcards: Wildcards, attempt: int) -> int | None:
            return self.model_minutes(
                wildcards.model,
                lambda timm_id: pack.runtime(self._one_run(wildcards, attempt, timm_id)),
            )

        return minutes

    def plasticity(self, wildcards: Wildcards, attempt: int) -> int | None:
        """Minutes for one plasticity job."""
        p = self.config["plasticity"]
        return self.model_minutes(
            wildcards.model,
            lambda timm_id: runtime.plasticity_minutes(
                p["n_pairs"], len(p["protocols"]), timm_id, p["dtype"], attempt, self.calibration
            ),
        )

    def recommend(self, wildcards: Wildcards, attempt: int) -> int | None:
        """Minutes for one recommend job, its pairs recommend.n_pairs or plasticity.n_pairs."""
        block = self.config["recommend"]
        return self.model_minutes(
            wildcards.model,
            lambda timm_id: runtime.recommend_minutes(
                recommend_value(self.config, "n_pairs"),
                block["batch_size"],
                block["warmup_steps"],
                block["batches"],
                timm_id,
                attempt,
                self.calibration,
            ),
        )
