# Helpers shared by the rules: paths, wildcard constraints and the run grid.
# Keep this file free of torch imports: the SLURM plugin re-parses it on every node.
import json
import os
import re

from vitplasticity.config import (
    check_config,
    enabled_experiments,
    experiment_runs,
    imagenet_path,
    lr_label,
)
from vitplasticity.data.sources import registry as source_registry
from vitplasticity.weights import LOCAL_FILENAME, RECORD_FILENAME, SOURCE_KWARGS

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
    """The dataset's config entry without its training keys, as JSON; a file it downloads
    carries the checksum its download job verified (another dataset may override it)."""
    entry = source_registry.with_download_checksums(config["datasets"], dataset)
    return as_json({k: v for k, v in entry.items() if k not in TRAINING_KEYS})


def prepare_inputs(wildcards):
    """The files a dataset's prepare job reads: its local archives, else the downloads."""
    return source_registry.download_inputs(
        config["datasets"], wildcards.dataset, f"{RESOURCES}/downloads"
    )


def download_url(wildcards):
    """The URL of one registry file: the registry's, or the datasets' mirror override."""
    return source_registry.download_url(config["datasets"], wildcards.file)


def dataset_dir(dataset):
    return f"{RESOURCES}/datasets/{dataset}"


def reference_file():
    return f"{RESOURCES}/reference/{config['reference']['name']}.parquet"


def weights_files(model):
    """The weights stage's file and record of a `weights: hub` model; [] for random or a path."""
    if config["models"][model].get("weights", "hub") != "hub":
        return []
    return [f"{RESOURCES}/weights/{model}/{name}" for name in (LOCAL_FILENAME, RECORD_FILENAME)]


def compute_model_spec(model):
    """The model's config entry as a compute job gets it (JSON): `weights: hub` becomes the
    weights stage's local file, and `revision` (which only the weights stage reads) is left out,
    so that models not fetched from the hub keep their spec."""
    entry = {k: v for k, v in config["models"][model].items() if k != "revision"}
    files = weights_files(model)
    if files:
        entry["weights"] = files[0]
    return as_json(entry)


def weights_source_kwargs(model):
    """The model's kwargs that decide where its weights come from (JSON; usually {})."""
    kwargs = config["models"][model].get("kwargs") or {}
    return as_json({k: kwargs[k] for k in SOURCE_KWARGS if k in kwargs})


def weights_targets():
    """The weights stage's outputs of every `weights: hub` model that a plasticity job or an
    enabled experiment uses."""
    used = list(config["plasticity"]["models"])
    for name in enabled_experiments(config):
        used += config["experiments"][name]["models"]
    return [path for model in dict.fromkeys(used) for path in weights_files(model)]


# Compute jobs load local files only: a stray hub call fails at once instead of hanging on a
# compute node without internet.
OFFLINE = "HF_HUB_OFFLINE=1"


def plasticity_targets():
    p = config["plasticity"]
    return [
        f"{RESULTS}/plasticity/{model}/{dataset}{suffix}.parquet"
        for model in p["models"]
        for dataset in p["datasets"]
        for suffix in ("", "_summary")
    ]


def plasticity_pairs(model):
    """The per-pair plasticity files of ``model``, one per config plasticity.datasets."""
    return [f"{RESULTS}/plasticity/{model}/{dataset}.parquet" for dataset in config["plasticity"]["datasets"]]


def text_plasticity_settings():
    """The text_plasticity block (empty when absent); with enabled true, checks that the
    reference file and at least one model and dataset are named."""
    text = config.get("text_plasticity") or {}
    if text.get("enabled", False):
        problems = [
            f"text_plasticity.{key}: {what} (text_plasticity.enabled is true)"
            for key, what in (
                ("reference", "no reference text file"),
                ("models", "no model"),
                ("datasets", "no dataset"),
            )
            if not text.get(key)
        ]
        models = text.get("models") or {}
        problems += [
            f"text_plasticity.run_models: unknown model {name!r} (defined: {', '.join(sorted(models))})"
            for name in text.get("run_models", list(models))
            if name not in models
        ]
        if problems:
            raise ValueError("; ".join(problems))
    return text


def text_plasticity_setting(key, default):
    return text_plasticity_settings().get(key, default)


def text_plasticity_targets():
    """Per-pair and summary tables of every text_plasticity (model, dataset); none unless enabled."""
    text = text_plasticity_settings()
    if not text.get("enabled", False):
        return []
    return [
        f"{RESULTS}/plasticity_text/{model}/{dataset}{suffix}.parquet"
        for model in text.get("run_models", list(text["models"]))
        for dataset in text["datasets"]
        for suffix in ("", "_summary")
    ]


def text_dataset_file(wildcards):
    return text_plasticity_settings()["datasets"][wildcards.dataset]


def text_model_spec(wildcards):
    return as_json(text_plasticity_settings()["models"][wildcards.model])


def bounds_targets():
    """The bounds table of every config plasticity.models (its figure: report_targets())."""
    return [f"{RESULTS}/bounds/{model}.parquet" for model in config["plasticity"]["models"]]


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


def lora_flags(wildcards):
    """--lora-rank/--lora-alpha for a configuration with "lora" (finetune.lora), else ""."""
    return lora_flags_for([wildcards.configuration])


def lora_flags_for(configurations):
    """--lora-rank/--lora-alpha when one of ``configurations`` has "lora", else ""."""
    if not any("lora" in configuration.split("+") for configuration in configurations):
        return ""
    lora = config["finetune"].get("lora") or {}
    return f"--lora-rank {lora.get('rank', 8)} --lora-alpha {lora.get('alpha', 16)}"


def experiment_summaries(wildcards):
    return [finetune_summary(run) for run in experiment_runs(config, wildcards.experiment)]


def report_targets():
    experiments = enabled_experiments(config)
    return [
        f"{RESULTS}/aggregate/runs.parquet",
        *expand(f"{RESULTS}/aggregate/{{experiment}}_selected.parquet", experiment=experiments),
        # stats, tables and figures: defined beside their rules in report.smk
        *report_figure_and_table_targets(),
    ]


# Wall time (minutes) that a SLURM job asks for, scaled by its work and by the retry attempt
# (a TIMEOUT retry asks for more; a finetuning retry resumes from its checkpoint). Here, not
# in the workflow profile, because a profile's resource expressions cannot read the config.
# Seconds per finetuning step at batch 512 (fp32, one A100-class GPU), by ViT size: ViT-B/16
# costs ~52.7 GFLOP per image forward + backward (PROTOCOL.md), i.e. ~27 TFLOP per step;
# ViT-L/16 ~3.5x and ViT-H/14 ~9.5x that. Unknown sizes get the largest.
STEP_SECONDS_BY_SIZE = {"tiny": 0.05, "small": 0.15, "base": 0.5, "large": 1.75, "huge": 4.75}


def step_seconds(model):
    """Estimated seconds of one batch-512 training step of `model` (from its timm id)."""
    timm_id = config["models"][model]["timm_id"]
    size = timm_id.split("_")[1] if timm_id.count("_") else ""
    return STEP_SECONDS_BY_SIZE.get(size, max(STEP_SECONDS_BY_SIZE.values()))


def finetune_runtime(wildcards, attempt):
    """Minutes for one finetuning run: steps x step time, +30% for validation, +15 min."""
    steps = config["datasets"][wildcards.dataset]["steps"]
    batch_scale = finetune_value("batch_size", 512) / 512
    seconds = 1.3 * steps * step_seconds(wildcards.model) * batch_scale
    return int(attempt * (15 + seconds / 60))


def plasticity_runtime(wildcards, attempt):
    """Minutes for one plasticity job: one forward per image and protocol (1/3 of a training
    step per image), with a 10x margin for decoding, +20 min."""
    p = config["plasticity"]
    images = 2 * p["n_pairs"] * len(p["protocols"])
    seconds = 10 * images * step_seconds(wildcards.model) / (3 * 512)
    return int(attempt * (20 + seconds / 60))


# The finetune settings every run of the grid gets, each its own params entry (shared by the
# one-run rule and the packed rules of workflow/rules/finetune.smk).
FINETUNE_PARAMS = dict(
    model_spec=lambda w: compute_model_spec(w.model),
    optimizer=experiment_value("optimizer"),
    steps=lambda w: config["datasets"][w.dataset]["steps"],
    val_every=lambda w: config["datasets"][w.dataset]["val_every"],
    batch_size=finetune_value("batch_size", 512),
    micro_batch_size=finetune_value("micro_batch_size", 512),
    warmup_steps=finetune_value("warmup_steps", 2000),
    clip_grad_norm=finetune_value("clip_grad_norm", 1.0),
    momentum=finetune_value("momentum", 0.9),
    adam_betas=finetune_value("adam_betas", [0.9, 0.999]),
    val_fraction=finetune_value("val_fraction", 0.2),
    precision=finetune_value("precision", "fp32"),
    device=finetune_value("device", "auto"),
    num_workers=finetune_value("num_workers", 4),
    augment=finetune_value("augment", "auto"),
    compile=str(finetune_value("compile", False)).lower(),
    log_every=finetune_value("log_every", 50),
    checkpoint_every=finetune_value("checkpoint_every", 500),
    demo_flag="--demo" if config.get("demo", False) else "",
)

FINETUNE_COMMAND = (
    f"{OFFLINE} vitplasticity finetune"
    " --experiment {wildcards.experiment} --model {wildcards.model}"
    " --dataset {wildcards.dataset} --model-spec {params.model_spec:q}"
    " --dataset-dir {input.dataset:q} --optimizer {params.optimizer} --steps {params.steps}"
    " --val-every {params.val_every} --batch-size {params.batch_size}"
    " --micro-batch-size {params.micro_batch_size} --warmup-steps {params.warmup_steps}"
    " --clip-grad-norm {params.clip_grad_norm} --momentum {params.momentum}"
    " --adam-betas {params.adam_betas} --val-fraction {params.val_fraction}"
    " --precision {params.precision} --device {params.device}"
    " --num-workers {params.num_workers} --augment {params.augment} --compile {params.compile}"
    " --log-every {params.log_every} --checkpoint-every {params.checkpoint_every}"
    " {params.demo_flag}"
)


class FinetunePack:
    """finetune.pack_runs: the runs one packed job does for each of its (model, dataset)."""

    def __init__(self, index, experiment, models, datasets, runs):
        self.rule_name = f"finetune_pack_{experiment}_{index}"
        self.experiment = experiment
        self.models_pattern = "|".join(re.escape(m) for m in models)
        self.datasets_pattern = "|".join(re.escape(d) for d in datasets)
        self.runs = [f"{c}/lr{lr_label(lr)}_seed{seed}" for c, lr, seed in runs]
        self._cells = runs

    def runs_argument(self, wildcards):
        """The --runs JSON: each run's configuration, lr, seed and output folder."""
        cell = f"{RESULTS}/finetune/{wildcards.experiment}/{wildcards.model}/{wildcards.dataset}"
        return as_json(
            [
                {"configuration": c, "lr": lr, "seed": seed, "out_dir": f"{cell}/{run}"}
                for (c, lr, seed), run in zip(self._cells, self.runs)
            ]
        )

    def lora_flags(self, wildcards):
        return lora_flags_for([configuration for configuration, _, _ in self._cells])

    def runtime(self, wildcards, attempt):
        return len(self.runs) * finetune_runtime(wildcards, attempt)


def finetune_packs():
    """One pack per experiment and distinct run list; its datasets share that list."""
    packs = []
    for name in enabled_experiments(config):
        by_runs = {}
        for run in experiment_runs(config, name):
            by_runs.setdefault(run.dataset, []).append((run.configuration, run.lr, run.seed))
        groups = {}
        for dataset, runs in by_runs.items():
            groups.setdefault(tuple(dict.fromkeys(runs)), []).append(dataset)
        models = config["experiments"][name]["models"]
        for index, (runs, datasets) in enumerate(groups.items()):
            packs.append(FinetunePack(index, name, models, datasets, list(runs)))
    return packs
