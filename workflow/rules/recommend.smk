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
        export=f"{RESULTS}/recommend/{{model}}/{{dataset}}.json",
        table=f"{RESULTS}/recommend/{{model}}/{{dataset}}.parquet",
        png=f"{RESULTS}/recommend/{{model}}/{{dataset}}.png",
        pdf=f"{RESULTS}/recommend/{{model}}/{{dataset}}.pdf",
    log:
        f"{RESULTS}/logs/recommend/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/recommend/{{model}}/{{dataset}}.tsv"
    params:
        model_spec=lambda w: compute_model_spec(w.model),
        n_pairs=recommend_or_plasticity("n_pairs"),
        batch_size=RECOMMEND["batch_size"],
        batches=RECOMMEND["batches"],
        warmup_steps=RECOMMEND["warmup_steps"],
        warmup_lr=RECOMMEND["warmup_lr"],
        # null (no budget) is the command's "none".
        budget="none" if RECOMMEND["budget"] is None else str(RECOMMEND["budget"]),
        criterion=RECOMMEND["criterion"],
        combine_flag="--combine" if RECOMMEND["combine"] else "",
        configurations=RECOMMEND["configurations"],
        seed=RECOMMEND["seed"],
        device=RECOMMEND["device"],
        demo_flag=DEMO_FLAG,
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
