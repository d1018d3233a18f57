# Which components should I finetune? Plasticity and alternative criteria per component of one
# (model, dataset), ranked, with a recommendation under a parameter budget (config recommend;
# off by default): vitplasticity recommend, on an image dataset or, for a text model, on labelled
# text (a sequence classifier with a new head, against text_plasticity's reference text cut as the
# labelled dataset is cut; vitplasticity.workflow.recommend_jobs pairs models and datasets). With
# text_plasticity enabled too, the same for every text model on every text file, against its
# reference text (recommend_text: vitplasticity recommend --text, gradients of the next-token
# loss, no head warm-up).


include: "recommend_common.smk"


rule recommend:
    input:
        reference=DATA.recommend_reference,
        dataset=DATA.dataset,
        weights=MODELS.weights,
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
        model_spec=MODELS.spec,
        # --dataset-dir, or --labelled-text with its tokenizer and sequence length (its
        # finetuning runs' cut, which the reference text is cut by too).
        data_flag=FINETUNE.data_flag,
        text_flags=FINETUNE.text_flags,
        **RECOMMEND_PARAMS,
        out_prefix=output_prefix("table", ".parquet"),
    resources:
        runtime=RUNTIMES.recommend,
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity recommend"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --dataset {wildcards.dataset} {params.data_flag} {input.dataset:q} {params.text_flags}"
        " --reference {input.reference:q}"
        + command_flags(RecommendImageSettings, RECOMMEND_PARAMS)
        + " --out-prefix {params.out_prefix:q} > {log:q} 2>&1"


rule recommend_text:
    input:
        reference=DATA.text_reference,
        text=DATA.dataset,
        weights=MODELS.weights,
    output:
        markdown=f"{RESULTS}/recommend_text/{{model}}/{{dataset}}.md",
        export=f"{RESULTS}/recommend_text/{{model}}/{{dataset}}.json",
        table=f"{RESULTS}/recommend_text/{{model}}/{{dataset}}.parquet",
        png=f"{RESULTS}/recommend_text/{{model}}/{{dataset}}.png",
        pdf=f"{RESULTS}/recommend_text/{{model}}/{{dataset}}.pdf",
    log:
        f"{RESULTS}/logs/recommend_text/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/recommend_text/{{model}}/{{dataset}}.tsv"
    params:
        model_spec=MODELS.spec,
        **RECOMMEND_TEXT_PARAMS,
        out_prefix=output_prefix("table", ".parquet"),
    wildcard_constraints:
        model=MODELS.of_family("transformers"),
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity recommend"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --dataset {wildcards.dataset} --reference {input.reference:q} --text {input.text:q}"
        + command_flags(RecommendTextSettings, RECOMMEND_TEXT_PARAMS)
        + " --out-prefix {params.out_prefix:q} > {log:q} 2>&1"
