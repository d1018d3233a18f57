# Plasticity of transformers text models (models: entries named in text_plasticity.run_models)
# on token sequences cut from text files (config text_plasticity; off by default): the text
# counterpart of the plasticity rule, same table schema. A `weights: hub` model's snapshot
# comes from the weights stage; the job loads it offline, tokenizer included.


rule text_plasticity:
    input:
        reference=lambda w: text_plasticity_settings()["reference"],
        text=text_dataset_file,
        weights=lambda w: weights_files(w.model),
    output:
        pairs=f"{RESULTS}/plasticity_text/{{model}}/{{dataset}}.parquet",
        summary=f"{RESULTS}/plasticity_text/{{model}}/{{dataset}}_summary.parquet",
    log:
        f"{RESULTS}/logs/plasticity_text/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plasticity_text/{{model}}/{{dataset}}.tsv"
    params:
        model_spec=lambda w: compute_model_spec(w.model),
        tokenizer=text_plasticity_setting("tokenizer"),
        sequence_length=text_plasticity_setting("sequence_length"),
        n_pairs=text_plasticity_setting("n_pairs"),
        batch_size=text_plasticity_setting("batch_size"),
        protocols=text_plasticity_setting("protocols"),
        device=text_plasticity_setting("device"),
        dtype=text_plasticity_setting("dtype"),
        demo_flag="--demo" if config["demo"] else "",
    wildcard_constraints:
        model=names_pattern(family_models("transformers")),
    conda:
        ENV
    shell:
        f"{OFFLINE} {GPU_SLOT} vitplasticity text-plasticity"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --reference {input.reference:q} --text {input.text:q} --dataset {wildcards.dataset}"
        " --tokenizer {params.tokenizer:q} --sequence-length {params.sequence_length}"
        " --n-pairs {params.n_pairs} --batch-size {params.batch_size}"
        " --protocols {params.protocols} --device {params.device} --dtype {params.dtype}"
        " {params.demo_flag}"
        " --out {output.pairs:q} --summary {output.summary:q} > {log:q} 2>&1"
