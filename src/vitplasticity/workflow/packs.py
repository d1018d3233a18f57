"""``finetune.pack_runs``: which runs one packed finetuning job does (plain Python, no torch
import, so the Snakefile can use it on every node cheaply).

With packing, one job per (experiment, model, dataset) runs all the cell's runs in one
process (``vitplasticity finetune --runs``). A Snakemake rule needs a fixed list of outputs,
so the workflow defines one rule per experiment and distinct list of (configuration, lr,
seed): datasets with their own LR grid (``lrs_by_dataset``) get a rule of their own. A rule's
name is made from its content (the experiment and a digest of its run list), so it stays
the same when other experiments, datasets or run lists are added, removed or reordered.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from vitplasticity.finetune.run import lr_label
from vitplasticity.workflow.config import (
    ConfigError,
    enabled_experiments,
    experiment_runs,
)

# Hex digits of the run list's SHA-256 in a pack's name: 2^32 values, for a handful of
# packs per experiment (a clash is still caught by finetune_packs).
DIGEST_LENGTH = 8

PackedRun = tuple[str, float, int]
"""One run of a pack: its configuration, learning rate and seed."""


@dataclass(frozen=True)
class FinetunePack:
    """The runs one packed job does for each (model, dataset) of ``experiment`` it covers.

    Attributes:
        experiment: the experiment's name.
        models: the experiment's models (every one gets the same runs).
        datasets: the experiment's datasets whose run lists are ``runs``.
        runs: the (configuration, lr, seed) of each run, in the experiment's grid order
            (the order the job runs them in).
    """

    experiment: str
    models: tuple[str, ...]
    datasets: tuple[str, ...]
    runs: tuple[PackedRun, ...]

    @property
    def digest(self) -> str:
        """The first hex digits of the SHA-256 of the run list as canonical JSON (each LR by
        its shortest round-trip repr)."""
        text = json.dumps([[c, float(lr), int(seed)] for c, lr, seed in self.runs])
        return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_LENGTH]

    @property
    def name(self) -> str:
        """The rule's name: ``finetune_pack_<experiment>_<digest>``."""
        return f"finetune_pack_{self.experiment}_{self.digest}"

    @property
    def run_dirs(self) -> list[str]:
        """Each run's folder below its cell (``mha/lr0.01_seed42``), as finetune.run.Run names it."""
        return [f"{c}/lr{lr_label(lr)}_seed{seed}" for c, lr, seed in self.runs]

    @property
    def configurations(self) -> list[str]:
        """The configuration of every run (repeats included), in run order."""
        return [configuration for configuration, _, _ in self.runs]

    @property
    def models_pattern(self) -> str:
        """A regular expression matching exactly the pack's model names."""
        return "|".join(re.escape(model) for model in self.models)

    @property
    def datasets_pattern(self) -> str:
        """A regular expression matching exactly the pack's dataset names."""
        return "|".join(re.escape(dataset) for dataset in self.datasets)

    def runs_argument(self, cell_dir: str) -> list[dict[str, Any]]:
        """The ``finetune --runs`` list: each run's configuration, exact lr, seed and output
        folder below ``cell_dir`` (``<results>/finetune/<experiment>/<model>/<dataset>``)."""
        return [
            {"configuration": c, "lr": lr, "seed": seed, "out_dir": f"{cell_dir}/{run_dir}"}
            for (c, lr, seed), run_dir in zip(self.runs, self.run_dirs, strict=True)
        ]


def finetune_packs(config: dict[str, Any]) -> list[FinetunePack]:
    """One pack per enabled experiment and distinct run list; its datasets share that list.

    Packs come in config order (experiments, then each list's first dataset).

    Raises:
        ConfigError: when two packs of one experiment get the same name (a digest clash).
    """
    packs = []
    for name in enabled_experiments(config):
        by_dataset: dict[str, list[PackedRun]] = {}
        for run in experiment_runs(config, name):
            by_dataset.setdefault(run.dataset, []).append((run.configuration, run.lr, run.seed))
        groups: dict[tuple[PackedRun, ...], list[str]] = {}
        for dataset, runs in by_dataset.items():
            groups.setdefault(tuple(dict.fromkeys(runs)), []).append(dataset)
        models = tuple(config["experiments"][name]["models"])
        packs += [
            FinetunePack(name, models, tuple(datasets), runs) for runs, datasets in groups.items()
        ]
    check_distinct_names(packs, "packs with different run lists")
    return packs


def check_distinct_names(packs: list[FinetunePack], which: str) -> None:
    """Refuse ``packs`` of which two share a rule name (a digest clash): Snakemake would
    take them for one rule.

    Raises:
        ConfigError: naming the shared names, ``which`` packs share them, and the remedy.
    """
    names = [pack.name for pack in packs]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise ConfigError(
            f"finetune.pack_runs: {which} share the rule name(s) {', '.join(clashes)}; "
            "raise vitplasticity.workflow.packs.DIGEST_LENGTH"
        )
