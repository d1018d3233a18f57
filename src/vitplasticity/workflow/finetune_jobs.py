"""The params of the finetuning jobs: one run (``finetune --lr --seed``) or a pack of runs
(``finetune --runs``, with finetune.pack_runs), each finetune setting its own params entry.

An experiment's runs read images (an image dataset's prepared folder, ``--dataset-dir``),
text (a text dataset's file, ``--text``, cut as its entry says) or labelled text (its table or
folder, ``--labelled-text``, each document cut as its entry says): the dataset decides, per
job, so one rule serves all three and editing a key reruns only the runs that read it (a text
dataset's ``tokenizer`` its own runs, ``finetune.augment`` the image runs,
``finetune.mask_probability`` the text-file runs)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Any

from vitplasticity.finetune.settings import (
    IMAGE_ONLY_TRAINING_FIELDS,
    TrainingSettings,
)
from vitplasticity.settings.declaration import config_flags, rule_params
from vitplasticity.settings.sequences import LABELLED_SOURCE, TEXT_SOURCE, sequence_settings
from vitplasticity.workflow.config import grid_lr
from vitplasticity.workflow.dataset_kinds import IMAGES, dataset_kind, is_text_dataset
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.packs import FinetunePack
from vitplasticity.workflow.params import Wildcards, as_json, demo_flag
from vitplasticity.workflow.verify_jobs import VerifyJobs

# The configuration part that trains LoRA adapters (finetune.lora's flags).
LORA = "lora"

DATA_FLAGS: dict[str, str] = {
    IMAGES: "--dataset-dir",
    TEXT_SOURCE: "--text",
    LABELLED_SOURCE: "--labelled-text",
}
"""The finetune command's flag of the data of each dataset kind."""


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
        steps and validation interval, each finetune.<key>, the demo switch; then the data's
        flag and a text dataset's text flags (:meth:`data_flag`, :meth:`text_flags`)."""
        return {
            **self.setting_params(),
            "data_flag": self.data_flag,
            "text_flags": self.text_flags,
        }

    def setting_params(self) -> dict[str, Any]:
        """The params of :class:`TrainingSettings`' flags; a text run gets the image-only
        settings' defaults (:data:`IMAGE_ONLY_TRAINING_FIELDS`: editing finetune.augment
        reruns no text run)."""
        finetune = rule_params(TrainingSettings, self.config["finetune"], "finetune")
        for name in ("num_workers", "augment"):
            finetune[name] = self._image_only(name, finetune[name])
        return {
            "model_spec": self.models.spec,
            "optimizer": self.optimizer,
            "steps": self.steps,
            "val_every": self.val_every,
            **finetune,
            "demo_flag": demo_flag(self.config),
        }

    def _image_only(self, name: str, value: Any) -> Callable[[Wildcards], Any]:
        """A params function: ``value`` for an image dataset's run, the flag's default for a
        text run, of a text file or labelled text (which does not use it)."""
        assert name in IMAGE_ONLY_TRAINING_FIELDS
        default = TrainingSettings.__dataclass_fields__[name].default

        def chosen(wildcards: Wildcards) -> Any:
            return default if self._is_text(wildcards) else value

        return chosen

    def _is_text(self, wildcards: Wildcards) -> bool:
        return is_text_dataset(self.config["datasets"][wildcards.dataset])

    def data_flag(self, wildcards: Wildcards) -> str:
        """The flag of the job's data (its input ``dataset``, :data:`DATA_FLAGS`): ``--text``
        for a text dataset's file, ``--labelled-text`` for a labelled one's table or folder,
        ``--dataset-dir`` for an image dataset's prepared folder."""
        return DATA_FLAGS[dataset_kind(self.config["datasets"][wildcards.dataset])]

    def text_flags(self, wildcards: Wildcards) -> str:
        """A text dataset's run: how its documents are cut (its entry's tokenizer and sequence
        length) and, for a text file, an encoder's masks (``finetune.mask_probability``: a
        classifier masks nothing, so editing it reruns no labelled-text run, and the command
        refuses it there); "" for an image dataset's."""
        entry = self.config["datasets"][wildcards.dataset]
        if not is_text_dataset(entry):
            return ""
        cut = sequence_settings(entry)
        flags = f"--tokenizer {shlex.quote(str(cut['tokenizer']))}"
        flags += f" --sequence-length {cut['sequence_length']}"
        if dataset_kind(entry) == TEXT_SOURCE:
            flags += f" --mask-probability {self.config['finetune']['mask_probability']}"
        return flags

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
