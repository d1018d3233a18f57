# Budgeted verification of the recommendation (config recommend.verify; off by default):
# successive halving over the learning rates of each candidate configuration, each rung a job
# and each decision a Snakemake checkpoint, then the survivors' full-budget runs (the finetune
# rule's) and the verified report, which reads the decisions (it takes none).
# vitplasticity.workflow.verify_jobs says what each step is.
import re

from vitplasticity.workflow.verify_jobs import VerifyJobs

# Its experiment, cells and rungs are checked by check_config (the Snakefile), before any job.
VERIFY = VerifyJobs(config, checkpoints)
VERIFY_BLOCK = config["recommend"]["verify"]
# The verification's runs are its experiment's own run folders (and only its experiment's).
VERIFY_EXPERIMENT = re.escape(VERIFY_BLOCK["experiment"] or "recommend.verify.experiment")
RUN_FOLDER = f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}"
# The report job reads the runs back with the finetune settings of the experiment's runs.
VERIFY_PARAMS = {**FINETUNE.setting_params(), "optimizer": VERIFY.optimizer}


# A verified report is named like a recommend output (<dataset>_verified.md): this rule's.
ruleorder: verify_report > recommend


# The candidates and the rung decisions read a few small files: they run where Snakemake runs
# (no cluster job's start-up, no queue between two rungs).
checkpoint verify_candidates:
    localrule: True
    input:
        ranking=f"{RESULTS}/recommend/{{model}}/{{dataset}}.parquet",
    output:
        f"{RESULTS}/verify/{{model}}/{{dataset}}/candidates.json",
    log:
        f"{RESULTS}/logs/verify/{{model}}/{{dataset}}/candidates.log",
    params:
        criterion=VERIFY_BLOCK["criterion"],
        top_k=VERIFY_BLOCK["top_k"],
        baselines=" ".join(VERIFY_BLOCK["baselines"]),
    conda:
        ENV
    shell:
        "vitplasticity verify-candidates --ranking {input.ranking:q}"
        " --criterion {params.criterion} --top-k {params.top_k}"
        " --baselines {params.baselines} --out {output:q} > {log:q} 2>&1"


rule verify_rung:
    input:
        dataset=DATA.dataset,
        weights=MODELS.weights,
        previous=VERIFY.rung_inputs,
    output:
        record=f"{RUN_FOLDER}/rung_step{{step}}.json",
    log:
        f"{RESULTS}/logs/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}_rung{{step}}.log",
    wildcard_constraints:
        experiment=VERIFY_EXPERIMENT,
        step=r"\d+",
    params:
        **FINETUNE_PARAMS,
        out_dir=output_folder("record"),
        lr=VERIFY.rung_lr,
        lora_flags=FINETUNE.lora_flags,
    resources:
        runtime=RUNTIMES.finetune,
    conda:
        ENV
    shell:
        f"{FINETUNE_COMMAND} --configuration {{wildcards.configuration:q}}"
        " --lr {params.lr} --seed {wildcards.seed} --out-dir {params.out_dir:q}"
        " --stop-at-step {wildcards.step} {params.lora_flags} > {log:q} 2>&1"


checkpoint verify_decision:
    localrule: True
    input:
        unpack(VERIFY.decision_inputs),
    output:
        VERIFY.decision_file("{model}", "{dataset}", "{configuration}", "{step}"),
    log:
        f"{RESULTS}/logs/verify/{{model}}/{{dataset}}/{{configuration}}/decision_step{{step}}.log",
    wildcard_constraints:
        step=r"\d+",
    params:
        keep=VERIFY.keep,
        records=VERIFY.records_argument,
    conda:
        ENV
    shell:
        "vitplasticity verify-rung --configuration {wildcards.configuration:q}"
        " --rung-step {wildcards.step} --keep {params.keep} --record {params.records}"
        " --out {output:q} > {log:q} 2>&1"


rule verify_report:
    input:
        unpack(VERIFY.report_inputs),
        ranking=f"{RESULTS}/recommend/{{model}}/{{dataset}}.parquet",
        dataset=DATA.dataset,
    output:
        markdown=f"{RESULTS}/recommend/{{model}}/{{dataset}}_verified.md",
        table=f"{RESULTS}/recommend/{{model}}/{{dataset}}_verified.parquet",
        png=f"{RESULTS}/recommend/{{model}}/{{dataset}}_verified.png",
        export=f"{RESULTS}/recommend/{{model}}/{{dataset}}_verified.json",
    log:
        f"{RESULTS}/logs/verify/{{model}}/{{dataset}}/report.log",
    params:
        **VERIFY_PARAMS,
        # --dataset-dir, or --labelled-text with the cut its runs were trained on.
        data_flag=FINETUNE.data_flag,
        text_flags=FINETUNE.text_flags,
        experiment=VERIFY_BLOCK["experiment"],
        criterion=VERIFY_BLOCK["criterion"],
        top_k=VERIFY_BLOCK["top_k"],
        eta=VERIFY_BLOCK["eta"],
        baselines=" ".join(VERIFY_BLOCK["baselines"]),
        budget=config["recommend"]["budget"] or "",
        lrs=VERIFY.lrs_argument,
        seeds=VERIFY.seeds_argument,
        runs_dir=VERIFY.runs_argument,
        decisions_dir=VERIFY.decisions_argument,
        out_prefix=output_prefix("table", "_verified.parquet"),
    conda:
        ENV
    shell:
        "vitplasticity recommend-verify --no-train --ranking {input.ranking:q}"
        " --experiment {params.experiment:q} --model {wildcards.model}"
        " --dataset {wildcards.dataset} {params.data_flag} {input.dataset:q} {params.text_flags}"
        " --model-spec {params.model_spec:q}"
        " --lrs {params.lrs} --seeds {params.seeds} --criterion {params.criterion}"
        " --top-k {params.top_k} --eta {params.eta} --baselines {params.baselines}"
        " --runs-dir {params.runs_dir:q} --decisions-dir {params.decisions_dir:q}"
        " --out-prefix {params.out_prefix:q}"
        + command_flags(TrainingSettings, [name for name in VERIFY_PARAMS if name != "model_spec"])
        + " --device cpu"
        + (" --budget {params.budget}" if config["recommend"]["budget"] else "")
        + " > {log:q} 2>&1"


rule verify_all:
    input:
        VERIFY.report_files(),
