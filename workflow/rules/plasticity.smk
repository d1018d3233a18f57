# Plasticity of every component of every block, per image pair.


rule plasticity:
    input:
        reference=DATA.reference_file(),
        dataset=DATA.dataset,
        weights=MODELS.weights,
    output:
        pairs=f"{RESULTS}/plasticity/{{model}}/{{dataset}}.parquet",
        summary=f"{RESULTS}/plasticity/{{model}}/{{dataset}}_summary.parquet",
    log:
        f"{RESULTS}/logs/plasticity/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plasticity/{{model}}/{{dataset}}.tsv"
    params:
        model_spec=MODELS.spec,
        **PLASTICITY_PARAMS,
    resources:
        runtime=RUNTIMES.plasticity,
        mem_mb=MEMORY.plasticity,
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity plasticity"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --reference {input.reference:q} --dataset-dir {input.dataset:q}"
        + command_flags(PlasticitySettings, PLASTICITY_PARAMS)
        + " --out {output.pairs:q} --summary {output.summary:q} > {log:q} 2>&1"


# The paper's theoretical bounds per (block, component), from the model's weights and the
# reference images' embedding outputs, beside the measured plasticity (the figure:
# figure_bounds in report.smk).
rule bounds:
    input:
        reference=DATA.reference_file(),
        plasticity=FILES.plasticity_pairs,
        weights=MODELS.weights,
    output:
        table=f"{RESULTS}/bounds/{{model}}.parquet",
    log:
        f"{RESULTS}/logs/bounds/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/bounds/{{model}}.tsv"
    params:
        model_spec=MODELS.spec,
        **BOUNDS_PARAMS,
    conda:
        ENV
    shell:
        f"{OFFLINE} vitplasticity bounds"
        " --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --reference {input.reference:q}"
        + command_flags(BoundsSettings, BOUNDS_PARAMS)
        + " --out {output.table:q} --plasticity {input.plasticity:q} > {log:q} 2>&1"
