# Plasticity of every component of every block, per image pair.


rule plasticity:
    input:
        reference=reference_file(),
        dataset=lambda w: dataset_dir(w.dataset),
    output:
        pairs=f"{RESULTS}/plasticity/{{model}}/{{dataset}}.parquet",
        summary=f"{RESULTS}/plasticity/{{model}}/{{dataset}}_summary.parquet",
    log:
        f"{RESULTS}/logs/plasticity/{{model}}/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/plasticity/{{model}}/{{dataset}}.tsv"
    params:
        model_spec=lambda w: as_json(config["models"][w.model]),
        protocols=config["plasticity"]["protocols"],
        n_pairs=config["plasticity"]["n_pairs"],
        split=config["plasticity"].get("downstream_split", "test"),
        batch_size=config["plasticity"].get("batch_size", 64),
        device=config["plasticity"].get("device", "auto"),
        dtype=config["plasticity"].get("dtype", "float32"),
        demo_flag="--demo" if config.get("demo", False) else "",
    resources:
        runtime=plasticity_runtime,
    conda:
        ENV
    shell:
        "vitplasticity plasticity --model {wildcards.model} --model-spec {params.model_spec:q}"
        " --reference {input.reference:q} --dataset-dir {input.dataset:q} --split {params.split}"
        " --protocols {params.protocols} --n-pairs {params.n_pairs}"
        " --batch-size {params.batch_size} --device {params.device} --dtype {params.dtype}"
        " {params.demo_flag}"
        " --out {output.pairs:q} --summary {output.summary:q} > {log:q} 2>&1"
