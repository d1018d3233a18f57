# Single-component finetuning: one job per (experiment, model, dataset, configuration, lr, seed).


rule finetune:
    input:
        dataset=lambda w: dataset_dir(w.dataset),
    output:
        summary=f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/summary.json",
        metrics=f"{RESULTS}/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}/metrics.parquet",
    log:
        f"{RESULTS}/logs/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/finetune/{{experiment}}/{{model}}/{{dataset}}/{{configuration}}/lr{{lr}}_seed{{seed}}.tsv"
    params:
        model_spec=lambda w: as_json(config["models"][w.model]),
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
        out_dir=lambda w, output: os.path.dirname(output.summary),
        demo_flag="--demo" if config.get("demo", False) else "",
        # Empty for every configuration without "lora": editing finetune.lora reruns LoRA runs only.
        lora_flags=lora_flags,
    resources:
        runtime=finetune_runtime,
    conda:
        ENV
    shell:
        "vitplasticity finetune --experiment {wildcards.experiment} --model {wildcards.model}"
        " --dataset {wildcards.dataset} --model-spec {params.model_spec:q}"
        " --dataset-dir {input.dataset:q}"
        " --configuration {wildcards.configuration:q} --optimizer {params.optimizer}"
        " --lr {wildcards.lr} --seed {wildcards.seed} --steps {params.steps}"
        " --val-every {params.val_every} --batch-size {params.batch_size}"
        " --micro-batch-size {params.micro_batch_size} --warmup-steps {params.warmup_steps}"
        " --clip-grad-norm {params.clip_grad_norm} --momentum {params.momentum}"
        " --adam-betas {params.adam_betas} --val-fraction {params.val_fraction}"
        " --precision {params.precision} --device {params.device}"
        " --num-workers {params.num_workers} --augment {params.augment} --compile {params.compile}"
        " --log-every {params.log_every}"
        " --checkpoint-every {params.checkpoint_every} {params.demo_flag} {params.lora_flags}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
