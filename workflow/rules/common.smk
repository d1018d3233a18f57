# Helpers shared by the rules: paths, wildcard constraints and the run grid.
# Keep this file free of torch imports: the SLURM plugin re-parses it on every node.
import json
import os
import re

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger

from vitplasticity.utils import gpu_slots
from vitplasticity.workflow import runtime
from vitplasticity.workflow.config import (
    enabled_experiments,
    experiment_runs,
    imagenet_path,
)
from vitplasticity.data.sources import registry as source_registry
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.workflow.packs import finetune_packs
from vitplasticity.settings.declaration import command_flags, config_flags, rule_params
from vitplasticity.plasticity.settings import (
    BoundsSettings,
    PlasticitySettings,
    TextPlasticitySettings,
)
from vitplasticity.recommend.settings import RecommendImageSettings, RecommendTextSettings
from vitplasticity.report.settings import CriteriaSettings
from vitplasticity.models.weights import LOCAL_FILENAME, RECORD_FILENAME, SOURCE_KWARGS

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


def family_models(family):
    """The names of the models of ``family`` (models.<name>.family)."""
    return [name for name, entry in config["models"].items() if entry["family"] == family]


def names_pattern(names):
    """A wildcard constraint matching exactly ``names`` (none: a pattern that matches nothing)."""
    return "|".join(re.escape(name) for name in names) or "(?!)"


def weights_folder(model):
    """Where the weights stage puts ``model``'s files: <resources>/weights/<model>."""
    return f"{RESOURCES}/weights/{model}"


def weights_files(model):
    """The weights stage's outputs of a `weights: hub` model, which its compute jobs read: a
    timm model's file and record; a transformers model's record (written last, it lists the
    snapshot's files beside it: the folder's sentinel). [] for random or local weights."""
    entry = config["models"][model]
    if entry["weights"] != "hub":
        return []
    names = (LOCAL_FILENAME, RECORD_FILENAME) if entry["family"] == "timm" else (RECORD_FILENAME,)
    return [f"{weights_folder(model)}/{name}" for name in names]


def compute_model_spec(model):
    """The model's config entry as a compute job gets it (JSON): `weights: hub` becomes the
    weights stage's local file (timm) or folder (transformers), and `revision` (which only the
    weights stage reads) is left out, so that models not fetched from the hub keep their spec.
    A timm entry also leaves out `family: timm`, which a spec without a family means: the
    paper's commands, and the specs its results record, are those of the timm-only layout."""
    entry = config["models"][model]
    left_out = ("revision", "family") if entry["family"] == "timm" else ("revision",)
    spec = {k: v for k, v in entry.items() if k not in left_out}
    if entry["weights"] == "hub":
        spec["weights"] = (
            weights_files(model)[0] if entry["family"] == "timm" else weights_folder(model)
        )
    return as_json(spec)


def weights_source_kwargs(model):
    """The model's kwargs that decide where its weights come from (JSON; usually {})."""
    kwargs = config["models"][model]["kwargs"]
    return as_json({k: kwargs[k] for k in SOURCE_KWARGS if k in kwargs})


def weights_targets():
    """The weights stage's outputs of every `weights: hub` model that a plasticity job, an
    enabled experiment, enabled recommend or enabled text plasticity uses."""
    used = list(config["plasticity"]["models"])
    for name in enabled_experiments(config):
        used += config["experiments"][name]["models"]
    if config["recommend"]["enabled"]:
        used += config["recommend"]["models"] or []
    if config["text_plasticity"]["enabled"]:
        used += config["text_plasticity"]["run_models"]
    return [path for model in dict.fromkeys(used) for path in weights_files(model)]


# Compute jobs load local files only: a stray hub call fails at once instead of hanging on a
# compute node without internet.
OFFLINE = "HF_HUB_OFFLINE=1"

# A local GPU job runs on a GPU of its own: its command takes a free device's lock and sets
# CUDA_VISIBLE_DEVICES to it before it imports torch (vitplasticity.utils.gpu_slots, called by the
# CLI), so the rules' commands stay as they are. Under SLURM or without GPUs nothing changes.
# Snakemake assigns no GPU ids to local jobs (its issue #281).


def advise_gpu_resources():
    """On a local run without --resources gpu on a machine with several GPUs: how to use them."""
    if workflow.local_exec:
        advice = gpu_slots.resources_advice(os.environ, "gpu" in workflow.global_resources)
        if advice:
            logger.info(advice)


# Run once when the jobs are about to start (not in a dry run). Snakemake keeps one onstart
# handler, so the rule files add their checks to this list instead of declaring their own.
ONSTART_CHECKS = [advise_gpu_resources]


onstart:
    for check in ONSTART_CHECKS:
        check()


def stage_params(settings, block):
    """One params entry per setting of ``settings`` (a vitplasticity.settings.stages class) that
    the config block ``block`` (e.g. "report.criteria") holds, in field order, and the demo
    switch: each value the config's own, so that editing one key reruns only its jobs."""
    values = config
    for part in block.split("."):
        values = values[part]
    return {**rule_params(settings, values, block), "demo_flag": "--demo" if config["demo"] else ""}


PLASTICITY_PARAMS = stage_params(PlasticitySettings, "plasticity")
# The bounds' images are the plasticity pairs' reference images (plasticity.n_pairs).
BOUNDS_PARAMS = stage_params(BoundsSettings, "plasticity")


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


# The text_plasticity block, every default filled in by the schema and checked by check_config.
TEXT = config["text_plasticity"]
TEXT_PLASTICITY_PARAMS = stage_params(TextPlasticitySettings, "text_plasticity")


def text_plasticity_targets():
    """Per-pair and summary tables of every text_plasticity (model, dataset); none unless enabled."""
    if not TEXT["enabled"]:
        return []
    return [
        f"{RESULTS}/plasticity_text/{model}/{dataset}{suffix}.parquet"
        for model in TEXT["run_models"]
        for dataset in TEXT["datasets"]
        for suffix in ("", "_summary")
    ]


def text_dataset_file(wildcards):
    return TEXT["datasets"][wildcards.dataset]


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


def lora_flags(wildcards):
    """--lora-rank/--lora-alpha for a configuration with "lora" (finetune.lora), else ""."""
    return lora_flags_for([wildcards.configuration])


def lora_flags_for(configurations):
    """--lora-rank/--lora-alpha when one of ``configurations`` has "lora", else ""."""
    if not any("lora" in configuration.split("+") for configuration in configurations):
        return ""
    return config_flags(TrainingSettings, config["finetune"]["lora"], "finetune.lora")


def experiment_summaries(wildcards):
    return [finetune_summary(run) for run in experiment_runs(config, wildcards.experiment)]


def report_targets():
    experiments = enabled_experiments(config)
    return [
        # every enabled experiment's runs in one table: none when every experiment is disabled
        # (the workflow is then the plasticity part alone)
        *([f"{RESULTS}/aggregate/runs.parquet"] if experiments else []),
        *expand(f"{RESULTS}/aggregate/{{experiment}}_selected.parquet", experiment=experiments),
        # stats, tables and figures: defined beside their rules in report.smk
        *report_figure_and_table_targets(),
    ]


# Wall time (minutes) a SLURM job asks for: vitplasticity.workflow.runtime's estimates from the config,
# in the precision the job computes in, capped at scheduler.max_runtime_minutes.
def scheduler_minutes(minutes):
    return runtime.capped(minutes, config["scheduler"]["max_runtime_minutes"])


def model_minutes(model, estimate):
    """The wall time of a job of ``model``: ``estimate(timm_id)``, capped. vitplasticity.workflow.runtime
    counts the FLOPs of timm architectures only: a transformers model's job asks for
    scheduler.max_runtime_minutes, or, where that is null, for no runtime (Snakemake leaves
    the resource out: the partition's default time)."""
    entry = config["models"][model]
    if entry["family"] != "timm":
        return config["scheduler"]["max_runtime_minutes"]
    return scheduler_minutes(estimate(entry["timm_id"]))


def one_run_minutes(wildcards, attempt, timm_id):
    return runtime.finetune_minutes(
        config["datasets"][wildcards.dataset]["steps"],
        config["finetune"]["batch_size"],
        timm_id,
        config["finetune"]["precision"],
        attempt,
    )


def finetune_runtime(wildcards, attempt):
    return model_minutes(wildcards.model, lambda timm_id: one_run_minutes(wildcards, attempt, timm_id))


def plasticity_runtime(wildcards, attempt):
    p = config["plasticity"]
    return model_minutes(
        wildcards.model,
        lambda timm_id: runtime.plasticity_minutes(
            p["n_pairs"], len(p["protocols"]), timm_id, p["dtype"], attempt
        ),
    )


# The finetune settings every run of the grid gets, each its own params entry (shared by the
# one-run rule and the packed rules of workflow/rules/finetune.smk). The finetune.<key> entries
# and the command's training flags come from the fields of TrainingSettings.
FINETUNE_PARAMS = dict(
    model_spec=lambda w: compute_model_spec(w.model),
    optimizer=experiment_value("optimizer"),
    steps=lambda w: config["datasets"][w.dataset]["steps"],
    val_every=lambda w: config["datasets"][w.dataset]["val_every"],
    **rule_params(TrainingSettings, config["finetune"], "finetune"),
    demo_flag="--demo" if config["demo"] else "",
)

FINETUNE_COMMAND = (
    f"{OFFLINE} vitplasticity finetune"
    " --experiment {wildcards.experiment} --model {wildcards.model}"
    " --dataset {wildcards.dataset} --model-spec {params.model_spec:q}"
    " --dataset-dir {input.dataset:q}"
    + command_flags(TrainingSettings, [name for name in FINETUNE_PARAMS if name != "model_spec"])
)


# finetune.pack_runs: one rule per vitplasticity.workflow.packs.FinetunePack (workflow/rules/finetune.smk).
def pack_runs_json(pack):
    """The pack's --runs param: each run's configuration, lr, seed and output folder (JSON)."""

    def runs(w):
        return as_json(pack.runs_argument(f"{RESULTS}/finetune/{w.experiment}/{w.model}/{w.dataset}"))

    return runs


def refuse_packs_on_a_cluster():
    """finetune.pack_runs' onstart check (workflow/rules/finetune.smk says why)."""
    if not workflow.local_exec:
        raise WorkflowError(
            "finetune.pack_runs: true packs runs for one machine (snakemake --cores N), not"
            " for a cluster executor. Switch it off: add workflow/presets/demo_slurm.yaml"
            " last to --configfile (the demo: snakemake --configfile workflow/presets/demo.yaml"
            " workflow/presets/demo_slurm.yaml --profile slurm all), or write"
            " pack_runs: false under finetune: in your config file. To run several runs in"
            " one SLURM job, uncomment the packing block (groups) at the end of"
            " slurm/profile.yaml."
        )


def pack_lora_flags(pack):
    return lambda w: lora_flags_for(pack.configurations)


def pack_runtime(pack):
    return lambda w, attempt: model_minutes(
        w.model, lambda timm_id: pack.runtime(one_run_minutes(w, attempt, timm_id))
    )
