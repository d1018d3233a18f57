# Which components should I finetune? Plasticity and alternative criteria per component of one
# (model, dataset), ranked, with a recommendation under a parameter budget (config recommend;
# off by default): vitplasticity recommend.


include: "recommend_common.smk"


rule recommend:
    input:
        reference=reference_file(),
        dataset=lambda w: dataset_dir(w.dataset),
        weights=lambda w: weights_files(w.model),
    output:
        markdown=f"{RESULTS}/recommend/{{model}}/{{dataset}}.md",
        table=f"{RESULTS}/recommend/{{model}}/{{dataset}}.parquet",
        png=f"{RESULTS}/recommend/{{model}}/{{dataset}}.png",
        pdf=f"{RESULTS}/recommend/{{model}}/{{dataset}}.pdf",
    log:
        f"{RESULTS}/logs/recommend/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/recommend/{{model}}/{{dataset}}.tsv"
    params:
        model_spec=lambda w: compute_model_spec(w.model),
        n_pairs=recommend_setting("n_pairs", config["plasticity"]["n_pairs"]),
        batch_size=recommend_setting("batch_size", 32),
        batches=recommend_setting("batches", 8),
        warmup_steps=recommend_setting("warmup_steps", 50),
        warmup_lr=recommend_setting("warmup_lr", 0.01),
        budget=str(recommend_setting("budget", "none")),
        criterion=recommend_setting("criterion", "plasticity"),
        combine_flag="--combine" if recommend_setting("combine", False) else "",
        configurations=recommend_setting(
            "configurations", ["ln1", "mha", "ln2", "fc1", "fc2", "mha+fc1", "ln1+ln2", "fc1+fc2"]
        ),
        seed=recommend_setting("seed", 0),
        device=recommend_setting("device", "auto"),
        demo_flag="--demo" if config.get("demo", False) else "",
        out_prefix=lambda w, output: output.table.removesuffix(".parquet"),
    resources:
        runtime=recommend_runtime,
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity recommend"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --dataset {wildcards.dataset} --dataset-dir {input.dataset:q}"
        " --reference {input.reference:q} --n-pairs {params.n_pairs}"
        " --batch-size {params.batch_size} --batches {params.batches}"
        " --warmup-steps {params.warmup_steps} --warmup-lr {params.warmup_lr}"
        " --budget {params.budget:q} --criterion {params.criterion} {params.combine_flag}"
        " --configurations {params.configurations:q} --seed {params.seed}"
        " --device {params.device} {params.demo_flag}"
        " --out-prefix {params.out_prefix:q} > {log:q} 2>&1"
