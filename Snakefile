# vitplasticity: "Vision Transformer Finetuning Benefits from Non-Smooth Components", as a workflow.
# All logic lives in src/vitplasticity; the rules below only wire files and config values.
from snakemake.utils import min_version, validate

from snakemake.exceptions import WorkflowError

from vitplasticity.workflow.config import check_config, check_keys, config_errors_end_the_run
from vitplasticity.workflow.config_files import check_config_file
from vitplasticity.workflow.scheduling import (
    GpuRequestError,
    PackResourcesError,
    count_gpu_jobs,
    give_packs_the_finetune_resources,
    route_and_prioritize,
)
from vitplasticity.workflow.time_cap import cap_fixed_runtimes

min_version("9.27")

# config.yaml is read by the configfile: line below, whose error would name neither the file
# nor the line (a --configfile is read by Snakemake before this file runs: docs/configuration.md
# says what its messages mean).
with config_errors_end_the_run():
    check_config_file("config.yaml")


configfile: "config.yaml"


# Every unknown key (a typo, another source's option) named with its nearest valid one, all at
# once; then the schema's types, ranges and defaults; then what only the values together and
# the files they name can tell (timm models with kwargs built once on the meta device, by the
# main process only: a cluster job re-parses this file). A config error ends the run with its
# message alone.
with config_errors_end_the_run(WorkflowError):
    check_keys(config, f"{workflow.basedir}/workflow/schemas/config.schema.yaml")
    validate(config, "workflow/schemas/config.schema.yaml")
    check_config(
        config,
        build_models=workflow.is_main_process,
        models_cache=".snakemake/vitplasticity/built_models.json",
    )


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/weights.smk"
include: "workflow/rules/plasticity.smk"
include: "workflow/rules/text.smk"
include: "workflow/rules/finetune.smk"
include: "workflow/rules/text_finetune.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/criteria.smk"
include: "workflow/rules/recommend.smk"
include: "workflow/rules/verify.smk"


rule all:
    input:
        BILL,
        TARGETS.plasticity(),
        TARGETS.bounds(),
        TARGETS.report(),
        TARGETS.text_plasticity(),
        TARGETS.text_bounds(),
        TEXT_FINETUNE.targets(),
        TEXT_FINETUNE.criteria_targets(),
        TARGETS.criteria(),
        TARGETS.recommend(),
        VERIFY.report_files(),
    default_target: True


rule plasticity_all:
    input:
        TARGETS.plasticity(),


rule text_plasticity_all:
    input:
        TARGETS.text_plasticity(),
        TARGETS.text_bounds(),


rule finetune_all:
    input:
        TARGETS.finetune(),


rule text_finetune_all:
    input:
        TEXT_FINETUNE.targets(),
        TEXT_FINETUNE.criteria_targets(),


rule recommend_all:
    input:
        TARGETS.recommend(),


# Every hub checkpoint the runs use, fetched (e.g. on a login node before submitting).
rule weights_all:
    input:
        TARGETS.weights(),


# CPU-only rules on scheduler.cpu_partition (when set), and the paper's first results
# (plasticity, bounds, the reference set, their figures) submitted before the finetuning grid
# (vitplasticity.workflow.scheduling; docs/slurm.md).
route_and_prioritize(workflow.rules, config["scheduler"]["cpu_partition"])
# finetune.pack_runs' rules ask for what the profiles' set-resources give the one-run rule.
with config_errors_end_the_run(PackResourcesError):
    give_packs_the_finetune_resources(workflow.rules, workflow.resource_settings.overwrite_resources)
# Every rule asking for a GPU, as gpu: or gres: (the workflow profile's &gpu_request), counts
# as one GPU job (gpu_jobs: 1), by which the packing block of slurm/profile.yaml runs a group's
# runs one at a time on its GPU.
with config_errors_end_the_run(GpuRequestError):
    count_gpu_jobs(workflow.rules)
# The profiles' fixed wall times (prepare 240 minutes...) within scheduler.max_runtime_minutes too.
cap_fixed_runtimes(workflow.rules, config["scheduler"]["max_runtime_minutes"])
