# Single-component finetuning: one job per (experiment, model, dataset, configuration, lr, seed),
# or, with finetune.pack_runs, one job per (experiment, model, dataset) running its runs in one
# process (each run still has its own folder, summary and metrics).
from vitplasticity.workflow.config import grid_lr

if not config["finetune"]["pack_runs"]:

    rule finetune:
        input:
            dataset=lambda w: dataset_dir(w.dataset),
            weights=lambda w: weights_files(w.model),
        output:
            summary=f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/summary.json",
            metrics=f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/metrics.parquet",
        log:
            f"{RESULTS}/logs/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.tsv"
        params:
            **FINETUNE_PARAMS,
            out_dir=lambda w, output: os.path.dirname(output.summary),
            # The grid's exact LR (the {lr} wildcard is its 6-digit path label), passed as its
            # repr like the packed runs' JSON: both ways train with the same float.
            lr=lambda w: grid_lr(config, w.experiment, w.dataset, w.lr),
            # Empty for every configuration without "lora": editing finetune.lora reruns LoRA runs only.
            lora_flags=lora_flags,
        resources:
            runtime=finetune_runtime,
        conda:
            ENV
        shell:
            f"{FINETUNE_COMMAND} --configuration {{wildcards.configuration:q}}"
            " --lr {params.lr} --seed {wildcards.seed} --out-dir {params.out_dir:q}"
            " {params.lora_flags} > {log:q} 2>&1"

else:
    # A pack's rule is named by its content, so the workflow profile's per-rule GPU, CPU and
    # memory requests (set-resources: finetune) cannot reach it: on a cluster it would be
    # submitted without a GPU. Refused before the first submission (the executor is known
    # only once the workflow runs, not while this file is parsed).
    ONSTART_CHECKS.append(refuse_packs_on_a_cluster)

    # One rule per experiment and list of (configuration, lr, seed): datasets with their own
    # LR grid get their own rule, so that every output pattern is fixed. Its name comes from
    # its content (vitplasticity.workflow.packs), so it stays put when the config grows.
    for pack in finetune_packs(config):

        rule:
            name:
                pack.name
            input:
                dataset=lambda w: dataset_dir(w.dataset),
                weights=lambda w: weights_files(w.model),
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
                runs=pack_runs_json(pack),
                lora_flags=pack_lora_flags(pack),
            resources:
                runtime=pack_runtime(pack),
            conda:
                ENV
            shell:
                f"{FINETUNE_COMMAND} --runs {{params.runs:q}} {{params.lora_flags}} > {{log:q}} 2>&1"
