# What the rules share: wildcard constraints, the run grid's targets, and each job's inputs,
# params and wall time, all bound to the config here and computed in vitplasticity.workflow.
# Keep this file free of torch imports: the SLURM plugin re-parses it on every node.
import os
from functools import partial

from snakemake.exceptions import WorkflowError

from vitplasticity.workflow.config import config_errors_end_the_run
from vitplasticity.workflow.experiments import classification_experiments
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.workflow.bill import BillNotice
from vitplasticity.workflow.costs import JobRuntimes
from vitplasticity.workflow.datasets import DatasetJobs
from vitplasticity.workflow.finetune_jobs import FinetuneJobs
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.memory import JobMemory
from vitplasticity.workflow.packs import finetune_packs
from vitplasticity.workflow.onstart import advise_gpu_resources
from vitplasticity.workflow.failed_jobs import report_failed_jobs
from vitplasticity.workflow.params import demo_flag, output_folder, output_prefix, stage_params
from vitplasticity.workflow.report import FIGURE_FLAGS, ReportFiles
from vitplasticity.workflow.resolved import save_resolved_config
from vitplasticity.workflow.results import ResultFiles
from vitplasticity.workflow.targets import Targets
from vitplasticity.workflow.time_cap import UngroupedFinetune, cut_packs
from vitplasticity.settings.declaration import command_flags
from vitplasticity.plasticity.settings import (
    BoundsSettings,
    PlasticitySettings,
    TextBoundsSettings,
    TextPlasticitySettings,
)
from vitplasticity.recommend.settings import RecommendImageSettings, RecommendTextSettings
from vitplasticity.report.settings import CriteriaSettings
from vitplasticity.settings.tracking import TRACKING_VARIABLE, tracking_environment
from vitplasticity.models.weights import LOCAL_FILENAME, RECORD_FILENAME

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


# The config bound once: each object's methods are the rules' input, params and resources
# functions (vitplasticity.workflow.<module>).
MODELS = ModelJobs(config)
DATA = DatasetJobs(config)
FILES = ResultFiles(config)
REPORT_FILES = ReportFiles(config)
RUNTIMES = JobRuntimes(config)
# The host memory a plasticity job asks for, from its model's checkpoint (whole or streamed:
# vitplasticity.workflow.memory), computed (torch imported) in the main process only: on a
# SLURM node the job's Snakemake takes what SLURM granted.
MEMORY = JobMemory(config, workflow.is_main_process)
# Snakemake groups of finetune runs are refused: finetune.pack_runs packs them
# (vitplasticity.workflow.time_cap, which cuts the packs to scheduler.max_runtime_minutes).
UNGROUPED = UngroupedFinetune(workflow)
# finetune.pack_runs' packs as cut to the cap (finetune_packs.smk sets them); None: unpacked.
PACKS = None
# The bill of rule all: the GPU-hours its jobs ask for, by rule, model and precision, and the
# SLURM jobs they make, printed by every dry run or start of `all` and written to
# .snakemake/vitplasticity/bill.md (vitplasticity.workflow.bill; docs/slurm.md).
BILL = BillNotice(workflow, config, RUNTIMES, lambda: PACKS, ".snakemake/vitplasticity/bill.md")
FINETUNE = FinetuneJobs(config)
TARGETS = Targets(config)
DEMO_FLAG = demo_flag(config)

# The tracking: block reaches every job through the environment (a cluster node re-parses
# this file and sets it again), never as a rule's params: tracking changes no result, so
# editing it reruns no job (vitplasticity.settings.tracking).
os.environ[TRACKING_VARIABLE] = tracking_environment(config["tracking"])

# Compute jobs load local files only: a stray hub call fails at once instead of hanging on a
# compute node without internet.
OFFLINE = "HF_HUB_OFFLINE=1"

# A local GPU job runs on a GPU of its own: its command takes a free device's lock and sets
# CUDA_VISIBLE_DEVICES to it before it imports torch (vitplasticity.utils.gpu_slots, called by the
# CLI), so the rules' commands stay as they are. Under SLURM or without GPUs nothing changes.
# Snakemake assigns no GPU ids to local jobs (its issue #281); advise_gpu_resources says how
# to run one job per GPU.

# Run once when the jobs are about to start (not in a dry run, nor when nothing is to be done).
# Snakemake keeps one onstart handler, so the rule files add their checks to this list instead
# of declaring their own. Once all pass, the resolved config is saved beside the results
# (<paths.results>/config.resolved.yaml; docs/configuration.md).
ONSTART_CHECKS = [partial(advise_gpu_resources, workflow)]


onstart:
    # A check's refusal (a bad CUDA_VISIBLE_DEVICES, packs on a cluster) ends the run with its
    # message alone, as a config error does, not with the File ... lines of a crash.
    with config_errors_end_the_run(ValueError, WorkflowError):
        for check in ONSTART_CHECKS:
            check()
    save_resolved_config(config)


# Snakemake's report of a failed job names its log, not what it says: add the log's last
# error line (vitplasticity.workflow.failed_jobs; docs/configuration.md).
onerror:
    report_failed_jobs(log)


# Each stage's settings, one params entry per key (vitplasticity.workflow.params.stage_params).
PLASTICITY_PARAMS = stage_params(config, PlasticitySettings, "plasticity")
# The bounds' images are the plasticity pairs' reference images (plasticity.n_pairs).
BOUNDS_PARAMS = stage_params(config, BoundsSettings, "plasticity")
# Text is cut into sequences as the reference dataset's entry says (its tokenizer and length).
TEXT_PLASTICITY_PARAMS = DATA.reference_sequences() | stage_params(config, TextPlasticitySettings, "text_plasticity")
# The text bounds' sequences are the text pairs' reference sequences (text_plasticity.n_pairs).
TEXT_BOUNDS_PARAMS = DATA.reference_sequences() | stage_params(config, TextBoundsSettings, "text_plasticity")

# The finetune settings every run of the grid gets, each its own params entry (shared by the
# one-run rule of finetune_runs.smk and the packed rules of finetune_packs.smk). The finetune.<key> entries
# and the command's training flags come from the fields of TrainingSettings.
FINETUNE_PARAMS = FINETUNE.params()
# A run reads an image dataset's prepared folder (--dataset-dir), a text dataset's file (--text)
# or labelled text (--labelled-text), these two with their text flags: params data_flag and
# text_flags, per job.
FINETUNE_COMMAND = (
    f"{OFFLINE} vitplasticity finetune"
    " --experiment {wildcards.experiment} --model {wildcards.model}"
    " --dataset {wildcards.dataset} --model-spec {params.model_spec:q}"
    " {params.data_flag} {input.dataset:q} {params.text_flags}"
    + command_flags(TrainingSettings, [name for name in FINETUNE.setting_params() if name != "model_spec"])
)
