"""The wall time (minutes) each SLURM job asks for, from the config: vitplasticity.workflow.
runtime's estimates in the precision the job computes in, calibrated by measured speeds
(vitplasticity.workflow.calibration: finished runs, a gpu-check JSON, the GPU class table),
capped at ``scheduler.max_runtime_minutes``, scaled by the retry attempt. Snakemake calls these
as the ``runtime`` resource of every job when it builds the DAG."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from fractions import Fraction
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

    def run_seconds(self, model: str, dataset: str) -> Fraction | None:
        """The compute seconds of one finetuning run of ``model`` on ``dataset``, its start-up
        left out (runtime.finetune_compute_seconds); None for a model whose family has no
        estimate."""
        if not self.models.spec_class(model).runtime_estimated:
            return None
        finetune = self.config["finetune"]
        return runtime.finetune_compute_seconds(
            self.config["datasets"][dataset]["steps"],
            finetune["batch_size"],
            self.config["models"][model]["timm_id"],
            finetune["precision"],
            self.calibration,
        )

    def runs_minutes(
        self,
        wildcards: Wildcards,
        attempt: int,
        runs: int = 1,
    ) -> int | None:
        """Minutes a job of ``runs`` runs of the wildcards' model and dataset asks for, one
        after another (runtime.pack_minutes: one start-up allowance and their compute),
        capped; a model without an estimate asks as :meth:`model_minutes` says."""
        seconds = self.run_seconds(wildcards.model, wildcards.dataset)
        if seconds is None:
            return self.max_minutes
        minutes = runtime.pack_minutes([seconds] * runs, attempt)
        return runtime.capped(minutes, self.max_minutes)

    def finetune(self, wildcards: Wildcards, attempt: int) -> int | None:
        """Minutes for one finetuning run."""
        return self.runs_minutes(wildcards, attempt)

    def pack(self, pack: FinetunePack) -> Callable[[Wildcards, int], int | None]:
        """The runtime function of ``pack``'s rule: one start-up, then its runs one after
        another."""

        def minutes(wildcards: Wildcards, attempt: int) -> int | None:
            return self.runs_minutes(wildcards, attempt, len(pack.runs))

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
