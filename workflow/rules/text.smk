# Plasticity of transformers text models (models: entries named in text_plasticity.run_models)
# on token sequences cut from text files (config text_plasticity; off by default): the text
# counterpart of the plasticity rule (vitplasticity plasticity --text), same table schema. A
# `weights: hub` model's snapshot comes from the weights stage; the job loads it offline,
# tokenizer included.


rule text_plasticity:
    input:
        reference=DATA.text_reference,
        text=DATA.dataset,
        weights=MODELS.weights,
    output:
        pairs=f"{RESULTS}/plasticity_text/{{model}}/{{dataset}}.parquet",
        summary=f"{RESULTS}/plasticity_text/{{model}}/{{dataset}}_summary.parquet",
    log:
        f"{RESULTS}/logs/plasticity_text/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plasticity_text/{{model}}/{{dataset}}.tsv"
    params:
        model_spec=MODELS.spec,
        **TEXT_PLASTICITY_PARAMS,
    resources:
        mem_mb=MEMORY.text_plasticity,
    wildcard_constraints:
        model=MODELS.of_family("transformers"),
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity plasticity"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --reference {input.reference:q} --text {input.text:q} --dataset {wildcards.dataset}"
        + command_flags(TextPlasticitySettings, TEXT_PLASTICITY_PARAMS)
        + " --out {output.pairs:q} --summary {output.summary:q} > {log:q} 2>&1"


# The paper's bounds of a text model (text_plasticity.bounds_models: GPT2, BERT, RoBERTa; GPT-NeoX
# and Falcon without MHA's), from its weights and the reference sequences' embedding outputs,
# beside its text plasticity.
rule text_bounds:
    input:
        reference=DATA.text_reference,
        plasticity=FILES.text_plasticity_pairs,
        weights=MODELS.weights,
    output:
        table=f"{RESULTS}/bounds_text/{{model}}.parquet",
    log:
        f"{RESULTS}/logs/bounds_text/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/bounds_text/{{model}}.tsv"
    params:
        model_spec=MODELS.spec,
        **TEXT_BOUNDS_PARAMS,
    wildcard_constraints:
        model=MODELS.of_family("transformers"),
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity bounds"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --text {input.reference:q}"
        + command_flags(TextBoundsSettings, TEXT_BOUNDS_PARAMS)
        + " --out {output.table:q} --plasticity {input.plasticity:q} > {log:q} 2>&1"
