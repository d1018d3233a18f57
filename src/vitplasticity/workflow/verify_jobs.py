"""The workflow's budgeted verification (config ``recommend.verify``): the files, inputs and
parse-time checks of workflow/rules/verify.smk. Torch-free (the Snakefile imports it).

For each verified (model, dataset), Snakemake sees every step of
:mod:`vitplasticity.recommend.halving`'s successive halving:

1. ``verify_candidates`` (a Snakemake checkpoint) reads recommend's ranking and writes the
   configurations to verify, with why (``<results>/verify/<model>/<dataset>/candidates.json``);
2. ``verify_rung`` trains one run of a candidate to the end of a rung (``vitplasticity
   finetune --stop-at-step``, the run's ``rung_step<s>.json`` and checkpoint); a later rung of
   the same run continues it;
3. ``verify_decision`` (a checkpoint) reads a rung's records of the learning rates still in
   and writes which continue and why (``.../<configuration>/decision_step<s>.json``, as
   recommend-verify names its own); the next rung's jobs are those it keeps;
4. the last survivor, and the other seeds of its learning rate, are ordinary finetuning runs
   of ``recommend.verify.experiment`` (the ``finetune`` rule): the survivor's job continues
   its run from the last rung's checkpoint to the full budget, so its numbers are those of
   the same run of that experiment's full grid;
5. ``verify_report`` writes
   ``<results>/recommend/<model>/<dataset>_verified.{md,parquet,png,json}`` from the
   candidates, the decisions and the survivors' runs (``recommend-verify --no-train``: it
   reads the decisions, it takes none).

The runs are the experiment's own run folders (``<results>/finetune/<experiment>/...``): its
optimizer, learning rates (``lrs``, ``lrs_by_dataset``) and seeds are the verification's. An
experiment whose grid trains the same (model, dataset) is refused: both would write the
same folders.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from vitplasticity.criteria import RECOMMEND_CRITERIA
from vitplasticity.finetune.run import lr_label
from vitplasticity.recommend.halving import (
    HalvingKeys,
    decision_name,
    halving_problems,
    rung_steps,
    survivors_at,
)
from vitplasticity.recommend.verify_plan import CANDIDATES_NAME, VERIFIED_FORMATS
from vitplasticity.workflow.config import ConfigError, learning_rates
from vitplasticity.workflow.dataset_kinds import (
    is_text_dataset,
    position_problems,
    text_run_problems,
)
from vitplasticity.workflow.params import Wildcards
from vitplasticity.workflow.recommend_jobs import recommend_cells

KEY = "recommend.verify"


class VerifyJobs:
    """The verification's files and input functions, bound to the config.

    Args:
        config: the validated config.
        checkpoints: Snakemake's ``checkpoints`` object (set by verify.smk before the DAG is
            built; the input functions read the candidates and decisions through it).
    """

    def __init__(self, config: dict[str, Any], checkpoints: Any = None) -> None:
        self.config = config
        self.block = config["recommend"]["verify"]
        self.results = config["paths"]["results"]
        self.checkpoints = checkpoints

    @property
    def enabled(self) -> bool:
        """Whether ``all`` asks for verified reports (recommend and its verify block on)."""
        return bool(self.config["recommend"]["enabled"] and self.block["enabled"])

    @property
    def experiment(self) -> str:
        """The experiment whose optimizer, learning rates and seeds the runs take."""
        return self.block["experiment"]

    def cells(self) -> list[tuple[str, str]]:
        """The verified (model, dataset) pairs: recommend's, or of ``recommend.verify``'s own
        models and datasets, each model with the datasets of a kind it takes, as recommend
        pairs them (:func:`~vitplasticity.workflow.recommend_jobs.recommend_cells`)."""
        return recommend_cells(self.config, self.block["models"], self.block["datasets"])

    def lrs(self, dataset: str) -> list[float]:
        """The experiment's learning rates on ``dataset``, ascending."""
        return sorted(learning_rates(self.config["experiments"][self.experiment], dataset))

    def seeds(self) -> list[int]:
        """The experiment's seeds; the first runs the rungs."""
        return list(self.config["experiments"][self.experiment]["seeds"])

    def ends(self, dataset: str) -> list[int]:
        """Each rung's last step, the full budget last (:func:`recommend.halving.rung_steps`)."""
        spec = self.config["datasets"][dataset]
        return rung_steps(spec["steps"], spec["val_every"], len(self.lrs(dataset)), self.eta)

    @property
    def eta(self) -> int:
        """The halving factor."""
        return int(self.block["eta"])

    # Files ------------------------------------------------------------------------------

    def report_files(self) -> list[str]:
        """Every verified report (``rule all``'s and ``verify_all``'s targets)."""
        if not self.enabled:
            return []
        return [
            f"{self.results}/recommend/{m}/{d}_verified.{ext}"
            for m, d in self.cells()
            for ext in VERIFIED_FORMATS
        ]

    def run_dir(self, model: str, dataset: str, configuration: str, lr: float, seed: int) -> str:
        """A run's folder: the experiment's own (as finetune.run.Run names it)."""
        return (
            f"{self.results}/finetune/{self.experiment}/{model}/{dataset}/{configuration}/"
            f"lr{lr_label(lr)}_seed{seed}"
        )

    def cell_dir(self, model: str, dataset: str) -> str:
        """The folder of the experiment's runs of ``model`` on ``dataset``."""
        return f"{self.results}/finetune/{self.experiment}/{model}/{dataset}"

    def verify_dir(self, model: str, dataset: str) -> str:
        """The folder of the candidates and the rung decisions of ``model`` on ``dataset``."""
        return f"{self.results}/verify/{model}/{dataset}"

    def candidates_file(self, model: str, dataset: str) -> str:
        """The candidates checkpoint's output."""
        return f"{self.verify_dir(model, dataset)}/{CANDIDATES_NAME}"

    def decision_file(self, model: str, dataset: str, configuration: str, step: int | str) -> str:
        """A rung decision checkpoint's output (wildcards as ``"{step}"`` give its pattern)."""
        return f"{self.verify_dir(model, dataset)}/{configuration}/{decision_name(step)}"

    # Input functions ----------------------------------------------------------------------

    def candidates(self, model: str, dataset: str) -> list[str]:
        """The configurations to verify (after the candidates checkpoint has run)."""
        path = self.checkpoints.verify_candidates.get(model=model, dataset=dataset).output[0]
        return [row["configuration"] for row in json.loads(Path(path).read_text())]

    def alive(self, model: str, dataset: str, configuration: str, rung: int) -> list[float]:
        """The learning rates that run rung ``rung`` (0-based): every one at the first, then
        those the previous rung's decision keeps."""
        lrs = self.lrs(dataset)
        if rung == 0:
            return lrs
        previous = self.ends(dataset)[rung - 1]
        path = self.checkpoints.verify_decision.get(
            model=model, dataset=dataset, configuration=configuration, step=str(previous)
        ).output[0]
        kept = json.loads(Path(path).read_text())["continue"]
        return [lr for lr in lrs if lr in kept]

    def rung_inputs(self, wildcards: Wildcards) -> list[str]:
        """A rung job's own run paused at the previous rung (none for the first rung)."""
        ends = self.ends(wildcards.dataset)
        rung = self._rung_index(ends, int(wildcards.step))
        if rung == 0:
            return []
        run = f"{self.cell_dir(wildcards.model, wildcards.dataset)}/{wildcards.configuration}"
        return [f"{run}/lr{wildcards.lr}_seed{wildcards.seed}/rung_step{ends[rung - 1]}.json"]

    def decision_inputs(self, wildcards: Wildcards) -> dict[str, str]:
        """A rung decision's records: each learning rate still in, by its label."""
        ends = self.ends(wildcards.dataset)
        rung = self._rung_index(ends, int(wildcards.step))
        seed = self.seeds()[0]
        alive = self.alive(wildcards.model, wildcards.dataset, wildcards.configuration, rung)
        run = f"{self.cell_dir(wildcards.model, wildcards.dataset)}/{wildcards.configuration}"
        return {
            f"lr{lr_label(lr)}": f"{run}/lr{lr_label(lr)}_seed{seed}/rung_step{wildcards.step}.json"
            for lr in alive
        }

    def keep(self, wildcards: Wildcards) -> int:
        """How many learning rates a rung decision keeps."""
        ends = self.ends(wildcards.dataset)
        counts = survivors_at(len(self.lrs(wildcards.dataset)), len(ends), self.eta)
        return counts[self._rung_index(ends, int(wildcards.step)) + 1]

    def report_inputs(self, wildcards: Wildcards) -> dict[str, Any]:
        """The report's inputs besides recommend's ranking: the candidates, each one's
        decisions and every seed's full-budget run of its surviving learning rate."""
        model, dataset = wildcards.model, wildcards.dataset
        ends = self.ends(dataset)
        inputs: dict[str, Any] = {
            "candidates": self.candidates_file(model, dataset),
            "decisions": [],
            "runs": [],
        }
        for configuration in self.candidates(model, dataset):
            inputs["decisions"] += [
                self.decision_file(model, dataset, configuration, end) for end in ends[:-1]
            ]
            (best,) = self.alive(model, dataset, configuration, len(ends) - 1)
            inputs["runs"] += [
                f"{self.run_dir(model, dataset, configuration, best, seed)}/summary.json"
                for seed in self.seeds()
            ]
        return inputs

    def records_argument(self, wildcards: Wildcards) -> str:
        """A rung decision's --record list: each learning rate still in (exact) = its record."""
        records = self.decision_inputs(wildcards)
        alive = self.alive(
            wildcards.model,
            wildcards.dataset,
            wildcards.configuration,
            self._rung_index(self.ends(wildcards.dataset), int(wildcards.step)),
        )
        return " ".join(shlex.quote(f"{lr!r}={records[f'lr{lr_label(lr)}']}") for lr in alive)

    def optimizer(self, wildcards: Wildcards) -> str:
        """The experiment's optimizer (the report job has no {experiment} wildcard)."""
        return self.config["experiments"][self.experiment]["optimizer"]

    def lrs_argument(self, wildcards: Wildcards) -> str:
        """The report command's --lrs: every learning rate of the dataset, exact (repr)."""
        return " ".join(repr(lr) for lr in self.lrs(wildcards.dataset))

    def runs_argument(self, wildcards: Wildcards) -> str:
        """The report command's --runs-dir: the folder of the cell's runs."""
        return self.cell_dir(wildcards.model, wildcards.dataset)

    def decisions_argument(self, wildcards: Wildcards) -> str:
        """The report command's --decisions-dir: the folder of the candidates and decisions."""
        return self.verify_dir(wildcards.model, wildcards.dataset)

    def seeds_argument(self, wildcards: Wildcards) -> str:
        """The report command's --seeds."""
        return " ".join(str(seed) for seed in self.seeds())

    def rung_lr(self, wildcards: Wildcards) -> float:
        """A rung job's exact learning rate (its {lr} wildcard is the path label)."""
        matches = [lr for lr in self.lrs(wildcards.dataset) if lr_label(lr) == wildcards.lr]
        if len(matches) != 1:
            raise ConfigError(
                f"{KEY}: no single learning rate of experiment {self.experiment!r} on "
                f"{wildcards.dataset!r} has the label lr{wildcards.lr}"
            )
        return matches[0]

    @staticmethod
    def _rung_index(ends: list[int], step: int) -> int:
        if step not in ends[:-1]:
            raise ConfigError(f"{KEY}: step {step} ends no rung (rungs end at {ends[:-1]})")
        return ends.index(step)


def verify_problems(config: dict[str, Any]) -> list[str]:
    """What is wrong with ``recommend.verify`` (empty when it is off or sound): its
    experiment, models, datasets and criterion, on each verified dataset what
    recommend-verify would refuse of the halving (:func:`recommend.halving.halving_problems`,
    the one check of both), and on labelled text what its runs would refuse as a text
    experiment's (:func:`~vitplasticity.workflow.dataset_kinds.text_run_problems`), each naming
    its key."""
    block = config["recommend"]["verify"]
    if not block["enabled"]:
        return []
    problems = []
    if not config["recommend"]["enabled"]:
        problems.append(f"{KEY}.enabled: verification needs recommend.enabled: true")
    if block["criterion"] not in RECOMMEND_CRITERIA:
        problems.append(
            f"{KEY}.criterion: {block['criterion']!r} is not a criterion recommend ranks by "
            f"({', '.join(RECOMMEND_CRITERIA)})"
        )
    problems += [
        f"{KEY}.models: unknown model {model!r} (defined: {', '.join(sorted(config['models']))})"
        for model in block["models"] or []
        if model not in config["models"]
    ]
    name = block["experiment"]
    experiments = config["experiments"]
    if name is None:
        return [
            *problems,
            f"{KEY}.experiment: required when {KEY}.enabled is true (the "
            "experiment whose optimizer, learning rates and seeds the runs take)",
        ]
    if name not in experiments:
        known = ", ".join(sorted(experiments)) or "none"
        return [*problems, f"{KEY}.experiment: {name!r} is not an experiment (known: {known})"]
    experiment = experiments[name]
    missing = [
        f"experiments.{name}.{key}"
        for key in ("optimizer", "lrs", "seeds")
        if not experiment.get(key)
    ]
    if missing:
        return [
            *problems,
            f"{KEY}.experiment: {name!r} gives no {', '.join(missing)} (the verification's "
            "runs take them)",
        ]
    jobs = VerifyJobs(config)
    covered = set()
    if experiment.get("enabled"):
        covered = {(m, d) for m in experiment["models"] for d in experiment["datasets"]}
    for model, dataset in jobs.cells():
        if (model, dataset) in covered:
            problems.append(
                f"{KEY}.experiment: {name!r} is enabled and its grid trains {model} on "
                f"{dataset}: both would write the same run folders. Name a disabled "
                "experiment (the verification takes its optimizer, learning rates and seeds)"
            )
    problems += [
        f"{KEY}.datasets: unknown dataset {dataset!r} (defined: "
        f"{', '.join(sorted(config['datasets']))})"
        for dataset in block["datasets"] or []
        if dataset not in config["datasets"]
    ]
    problems += _unpaired(jobs)
    for dataset in dict.fromkeys(dataset for _, dataset in jobs.cells()):
        problems += [f"{KEY} on {dataset}: {problem}" for problem in _halving(jobs, dataset)]
    # Its runs of labelled text are a text experiment's runs (the experiment is disabled, so
    # experiment_problems does not check them).
    text = [(m, d) for m, d in jobs.cells() if is_text_dataset(config["datasets"][d])]
    problems += position_problems(config, text, f"{KEY} finetunes it on")
    datasets = list(dict.fromkeys(d for _, d in text))
    return problems + text_run_problems(config, KEY, datasets, "verify no text dataset")


def _unpaired(jobs: VerifyJobs) -> list[str]:
    """One message per model or dataset that ``recommend.verify`` names itself and that pairs
    with none of the other side (a text model with image datasets only, a text file): the
    verification would leave it out without a word."""
    cells = jobs.cells()
    problems = []
    for key, side, other in (("models", 0, "datasets"), ("datasets", 1, "models")):
        known = jobs.config[key]
        named = [name for name in jobs.block[key] or [] if name in known]
        problems += [
            f"{KEY}.{key}: {name!r} pairs with none of the verified {other}: recommend ranks "
            "a model on the datasets of a kind it takes (images; labelled text for a text "
            "model)"
            for name in named
            if not any(cell[side] == name for cell in cells)
        ]
    return problems


def _halving(jobs: VerifyJobs, dataset: str) -> list[str]:
    """:func:`recommend.halving.halving_problems` of the verification on ``dataset``, naming
    the config keys its steps, validation interval, learning rates and eta come from."""
    spec = jobs.config["datasets"][dataset]
    experiment = f"experiments.{jobs.experiment}"
    by_dataset = jobs.config["experiments"][jobs.experiment].get("lrs_by_dataset") or {}
    keys = HalvingKeys(
        steps=f"datasets.{dataset}.steps",
        val_every=f"datasets.{dataset}.val_every",
        lrs=f"{experiment}.lrs_by_dataset.{dataset}"
        if dataset in by_dataset
        else f"{experiment}.lrs",
        eta=f"{KEY}.eta",
    )
    return halving_problems(spec["steps"], spec["val_every"], jobs.lrs(dataset), jobs.eta, keys)
