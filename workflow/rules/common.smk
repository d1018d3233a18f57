# Helpers shared by the rules: paths, wildcard constraints and the run grid.
# Keep this file free of torch imports: the SLURM plugin re-parses it on every node.
import json
import os

from vitplasticity.config import (
    check_config,
    enabled_experiments,
    experiment_runs,
    imagenet_path,
    lr_label,
)

check_config(config)

RESOURCES = config["paths"]["resources"]
RESULTS = config["paths"]["results"]
# The software of every rule: the package, installed by pip into a conda env.
ENV = "../../environment.yml"


wildcard_constraints:
    model=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    dataset=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    experiment=r"[A-Za-z0-9_]+",
    configuration=r"[a-z0-9]+(\+[a-z0-9]+)*",
    lr=r"[0-9][0-9.e+-]*",
    seed=r"\d+",


def as_json(value):
    """A config value as a canonical JSON string: a plain str param that Snakemake tracks."""
    return json.dumps(value, sort_keys=True)


# Dataset keys that shape training, not the prepared data: editing them must not re-prepare.
TRAINING_KEYS = ("steps", "val_every")


def source_spec(dataset):
    """The dataset's config entry without its training keys, as JSON."""
    entry = config["datasets"][dataset]
    return as_json({k: v for k, v in entry.items() if k not in TRAINING_KEYS})


def dataset_dir(dataset):
    return f"{RESOURCES}/datasets/{dataset}"


def reference_file():
    return f"{RESOURCES}/reference/{config['reference']['name']}.parquet"


def plasticity_targets():
    p = config["plasticity"]
    return [
        f"{RESULTS}/plasticity/{model}/{dataset}{suffix}.parquet"
        for model in p["models"]
        for dataset in p["datasets"]
        for suffix in ("", "_summary")
    ]


def finetune_summary(run):
    return f"{RESULTS}/finetune/{run.directory}/summary.json"


def finetune_targets(experiment=None):
    names = [experiment] if experiment else enabled_experiments(config)
    return [finetune_summary(run) for name in names for run in experiment_runs(config, name)]


def reference_input(wildcards):
    """The prepared dataset a 'dataset'-sourced reference set is taken from."""
    ref = config["reference"]
    return [dataset_dir(ref["dataset"])] if ref["source"] == "dataset" else []


def experiment_value(key):
    """A param function returning one key of the wildcard's experiment."""
    return lambda w: config["experiments"][w.experiment][key]


def finetune_value(key, default):
    return config["finetune"].get(key, default)


def experiment_summaries(wildcards):
    return [finetune_summary(run) for run in experiment_runs(config, wildcards.experiment)]


def report_targets():
    experiments = enabled_experiments(config)
    return [
        f"{RESULTS}/aggregate/runs.parquet",
        *expand(f"{RESULTS}/aggregate/{{experiment}}_selected.parquet", experiment=experiments),
    ]
