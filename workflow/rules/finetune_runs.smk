# One finetuning job per (experiment, model, dataset, configuration, lr, seed).


rule finetune:
    input:
        # Refuses Snakemake groups of this rule before any job (finetune.pack_runs packs).
        dataset=UNGROUPED.checked_input(DATA.dataset),
        weights=MODELS.weights,
    output:
        summary=f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/summary.json",
        metrics=f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/metrics.parquet",
    log:
        f"{RESULTS}/logs/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.tsv"
    wildcard_constraints:
        experiment=FINETUNE.one_run_experiments,
    params:
        **FINETUNE_PARAMS,
        out_dir=output_folder("summary"),
        # The grid's exact LR (the {lr} wildcard is its 6-digit path label), passed as its
        # repr like the packed runs' JSON: both ways train with the same float.
        lr=FINETUNE.lr,
        # Empty for every configuration without "lora": editing finetune.lora reruns LoRA runs only.
        lora_flags=FINETUNE.lora_flags,
    resources:
        runtime=RUNTIMES.finetune,
    conda:
        ENV
    shell:
        f"{FINETUNE_COMMAND} --configuration {{wildcards.configuration:q}}"
        " --lr {params.lr} --seed {wildcards.seed} --out-dir {params.out_dir:q}"
        " {params.lora_flags} > {log:q} 2>&1"
