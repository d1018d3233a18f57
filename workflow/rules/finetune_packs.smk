# finetune.pack_runs: one finetuning job per (experiment, model, dataset), running its runs in
# one process, one rule per vitplasticity.workflow.packs.FinetunePack.

# A pack's rule is named by its content, so the workflow profile's set-resources cannot name
# it: the Snakefile gives every pack what they give the one-run rule finetune (GPU, CPUs,
# memory, --nice; vitplasticity.workflow.scheduling), and a wall time of one start-up allowance
# and its runs' compute (vitplasticity.workflow.runtime.pack_minutes).

# One rule per experiment and list of (configuration, lr, seed): datasets with their own
# LR grid get their own rule, so that every output pattern is fixed. Its name comes from
# its content (vitplasticity.workflow.packs), so it stays put when the config grows.
# A pack that would ask for more than scheduler.max_runtime_minutes is cut into several.
PACKS = cut_packs(finetune_packs(config), config, RUNTIMES)
for pack in PACKS:

    rule:
        name:
            pack.name
        input:
            dataset=DATA.dataset,
            weights=MODELS.weights,
        output:
            [f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{run}/{kind}" for run in pack.run_dirs for kind in ("summary.json", "metrics.parquet")],
        log:
            f"{RESULTS}/logs/finetune/{{experiment}}/{{model}}/{{dataset}}/{pack.name}.log",
        benchmark:
            f"{RESULTS}/benchmarks/finetune/{{experiment}}/{{model}}/{{dataset}}/{pack.name}.tsv"
        wildcard_constraints:
            experiment=pack.experiment,
            model=pack.models_pattern,
            dataset=pack.datasets_pattern,
        params:
            **FINETUNE_PARAMS,
            runs=FINETUNE.pack_runs(pack),
            lora_flags=FINETUNE.pack_lora_flags(pack),
        resources:
            runtime=RUNTIMES.pack(pack),
        conda:
            ENV
        shell:
            f"{FINETUNE_COMMAND} --runs {{params.runs:q}} {{params.lora_flags}} > {{log:q}} 2>&1"
