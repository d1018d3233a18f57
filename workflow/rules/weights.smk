# Pretrained weights: one local job per `weights: hub` model fetches them from the hub (login
# nodes have internet, compute nodes often do not; 1,500 jobs asking the hub at once invite
# rate limits). Compute jobs then load the local copy with HF_HUB_OFFLINE=1.


# A timm model: the one safetensors file timm would load.
rule weights:
    output:
        weights=f"{RESOURCES}/weights/{{model}}/{LOCAL_FILENAME}",
        record=f"{RESOURCES}/weights/{{model}}/{RECORD_FILENAME}",
    log:
        f"{RESOURCES}/logs/weights/{{model}}.log",
    params:
        # Only what decides the file: editing another model key does not fetch again.
        timm_id=MODELS.entry_value("timm_id"),
        revision=MODELS.entry_value("revision"),
        source_kwargs=MODELS.source_kwargs,
        out_dir=output_folder("weights"),
    localrule: True
    wildcard_constraints:
        model=MODELS.of_family("timm"),
    conda:
        ENV
    shell:
        "vitplasticity weights --model {wildcards.model:q} --timm-id {params.timm_id:q}"
        " --revision {params.revision:q} --source-kwargs {params.source_kwargs:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


# A transformers model: a snapshot of its repo (config.json, the safetensors shards, the image
# processor and tokenizer files) into the folder; weights.json, written last, lists each file
# with its sha256 and is the folder's sentinel.
rule weights_snapshot:
    output:
        record=f"{RESOURCES}/weights/{{model}}/{RECORD_FILENAME}",
    log:
        f"{RESOURCES}/logs/weights/{{model}}.log",
    params:
        hf_id=MODELS.entry_value("hf_id"),
        revision=MODELS.entry_value("revision"),
        out_dir=output_folder("record"),
    localrule: True
    wildcard_constraints:
        model=MODELS.of_family("transformers"),
    conda:
        ENV
    shell:
        "vitplasticity weights --model {wildcards.model:q} --hf-id {params.hf_id:q}"
        " --revision {params.revision:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
