# Single-component finetuning of transformers text models on text files (config
# text_finetune; off by default): one job per (model, text dataset, configuration, lr, seed).
# A causal LM trains with the next-token loss, an encoder (its ...ForMaskedLM class) with the
# masked-LM loss; the result is the lowest validation loss and its perplexity. The runs'
# folders are under finetune_text/, apart from the image grid's finetune/ (whose report
# selects by validation accuracy). Training keys from the finetune block, the grid's own from
# text_finetune (vitplasticity.workflow.text_finetune_jobs).
# The grid is checked by check_config (the Snakefile), before any job.
from vitplasticity.workflow.text_finetune_jobs import TEXT_EXPERIMENT, TextFinetuneJobs

TEXT_FINETUNE = TextFinetuneJobs(config)
TEXT_FINETUNE_PARAMS = TEXT_FINETUNE.params()


rule finetune_text:
    input:
        text=TEXT_FINETUNE.text_file,
        weights=MODELS.weights,
    output:
        summary=f"{RESULTS}/finetune_text/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/summary.json",
        metrics=f"{RESULTS}/finetune_text/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/metrics.parquet",
    log:
        f"{RESULTS}/logs/finetune_text/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/finetune_text/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.tsv"
    wildcard_constraints:
        model=MODELS.of_family("transformers"),
    params:
        model_spec=MODELS.spec,
        **TEXT_FINETUNE_PARAMS,
        out_dir=output_folder("summary"),
        # The grid's exact LR (the {lr} wildcard is its 6-digit path label).
        lr=TEXT_FINETUNE.lr,
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity finetune-text --experiment {TEXT_EXPERIMENT}"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --dataset {wildcards.dataset} --text {input.text:q}"
        " --configuration {wildcards.configuration:q} --lr {params.lr}"
        " --seed {wildcards.seed} --out-dir {params.out_dir:q}"
        + TEXT_FINETUNE.command_flags()
        + " > {log:q} 2>&1"

