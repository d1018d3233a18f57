"""The params of the finetuning jobs: one run (``finetune --lr --seed``) or a pack of runs
(``finetune --runs``, with finetune.pack_runs), each finetune setting its own params entry."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.settings.declaration import config_flags, rule_params
from vitplasticity.workflow.config import grid_lr
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.packs import FinetunePack
from vitplasticity.workflow.params import Wildcards, as_json, demo_flag
from vitplasticity.workflow.verify_jobs import VerifyJobs

# The configuration part that trains LoRA adapters (finetune.lora's flags).
LORA = "lora"


class FinetuneJobs:
    """The finetune rules' params from the config.

    The finetune settings are :class:`~vitplasticity.finetune.settings.TrainingSettings`'s
    fields, which mirror the keys of ``finetune`` and ``finetune.lora``.

    Args:
        config: the validated config (every default filled in by the schema).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.results = config["paths"]["results"]
        self.models = ModelJobs(config)
        self.verify = VerifyJobs(config)  # whether the verification runs, and its experiment

    @property
    def packed(self) -> bool:
        """Whether the experiments' runs are packed (``finetune.pack_runs``)."""
        return bool(self.config["finetune"]["pack_runs"])

    @property
    def one_run_rule(self) -> bool:
        """Whether the one-run rule is needed: for every experiment unpacked; packed, for the
        experiment of ``recommend.verify``, whose runs are chosen as the verification goes,
        not a fixed grid to pack."""
        return not self.packed or self.verify.enabled

    @property
    def one_run_experiments(self) -> str:
        """The one-run rule's ``experiment`` wildcard pattern: any experiment, or packed, the
        verification's only."""
        if self.packed and self.verify.enabled:
            return re.escape(self.verify.experiment)
        return r"[A-Za-z0-9_]+"

    def params(self) -> dict[str, Any]:
        """The params every run gets (the one-run rule's and every pack rule's), in the order
        of the command's flags: the model spec, the experiment's optimizer, the dataset's
        steps and validation interval, each finetune.<key>, the demo switch."""
        return {
            "model_spec": self.models.spec,
            "optimizer": self.optimizer,
            "steps": self.steps,
            "val_every": self.val_every,
            **rule_params(TrainingSettings, self.config["finetune"], "finetune"),
            "demo_flag": demo_flag(self.config),
        }

    def optimizer(self, wildcards: Wildcards) -> str:
        """The job's experiment's optimizer (``experiments.<name>.optimizer``)."""
        return self.config["experiments"][wildcards.experiment]["optimizer"]

    def steps(self, wildcards: Wildcards) -> int:
        """The job's dataset's finetuning steps (``datasets.<name>.steps``)."""
        return self.config["datasets"][wildcards.dataset]["steps"]

    def val_every(self, wildcards: Wildcards) -> int:
        """The job's dataset's validation interval (``datasets.<name>.val_every``)."""
        return self.config["datasets"][wildcards.dataset]["val_every"]

    def lr(self, wildcards: Wildcards) -> float:
        """The grid's exact LR of the job (the {lr} wildcard is its 6-digit path label)."""
        return grid_lr(self.config, wildcards.experiment, wildcards.dataset, wildcards.lr)

    def lora_flags_for(self, configurations: list[str]) -> str:
        """--lora-rank/--lora-alpha when one of ``configurations`` has "lora", else ""."""
        if not any(LORA in configuration.split("+") for configuration in configurations):
            return ""
        return config_flags(TrainingSettings, self.config["finetune"]["lora"], "finetune.lora")

    def lora_flags(self, wildcards: Wildcards) -> str:
        """The one run's LoRA flags: empty for a configuration without "lora", so that
        editing finetune.lora reruns LoRA runs only."""
        return self.lora_flags_for([wildcards.configuration])

    def pack_runs(self, pack: FinetunePack) -> Callable[[Wildcards], str]:
        """The params function of ``pack``'s --runs: each run's configuration, lr, seed and
        output folder (JSON)."""

        def runs(wildcards: Wildcards) -> str:
            cell = f"{self.results}/finetune/{wildcards.experiment}/{wildcards.model}/{wildcards.dataset}"
            return as_json(pack.runs_argument(cell))

        return runs

    def pack_lora_flags(self, pack: FinetunePack) -> Callable[[Wildcards], str]:
        """The params function of ``pack``'s LoRA flags (one of its runs has "lora")."""

        def flags(wildcards: Wildcards) -> str:
            return self.lora_flags_for(pack.configurations)

        return flags
