# Downloads (local rules: login nodes have internet, compute nodes often do not), datasets into
# the prepared store, and the plasticity reference set.


rule download:
    output:
        f"{RESOURCES}/downloads/{{file}}",
    log:
        f"{RESOURCES}/logs/download/{{file}}.log",
    params:
        url=DATA.download_url,
        checksum=DATA.download_checksum,
    localrule: True
    wildcard_constraints:
        file=DATA.registry_files,
    conda:
        ENV
    shell:
        "vitplasticity download --file {wildcards.file:q} --url {params.url:q}"
        " --checksum {params.checksum:q} --out {output:q} > {log:q} 2>&1"


rule prepare:
    input:
        DATA.prepare_inputs,
    output:
        directory(f"{RESOURCES}/datasets/{{dataset}}"),
    log:
        f"{RESOURCES}/logs/prepare/{{dataset}}.log",
    params:
        spec=DATA.source_spec,
        downloads=DATA.downloads,
    conda:
        ENV
    shell:
        "vitplasticity prepare --dataset {wildcards.dataset} --spec {params.spec:q}"
        " --downloads {params.downloads:q} --out {output:q} > {log:q} 2>&1"


rule reference:
    input:
        DATA.reference_input,
    output:
        f"{RESOURCES}/reference/{{reference}}.parquet",
    log:
        f"{RESOURCES}/logs/reference/{{reference}}.log",
    params:
        source=config["reference"]["source"],
        imagenet=DATA.imagenet,
        dataset_dir=DATA.reference_dataset_dir,
        split=config["reference"]["split"],
        n_images=config["reference"]["n_images"],
        selection=config["reference"]["selection"],
        seed=config["reference"]["seed"],
    conda:
        ENV
    shell:
        "vitplasticity reference --source {params.source} --imagenet={params.imagenet:q}"
        " --dataset-dir={params.dataset_dir:q} --split {params.split}"
        " --n-images {params.n_images} --selection {params.selection} --seed {params.seed}"
        " --out {output:q} > {log:q} 2>&1"
