# Pretrained weights: one local job per `weights: hub` model fetches its checkpoint from the hub
# (login nodes have internet, compute nodes often do not; 1,500 jobs asking the hub at once
# invite rate limits). Compute jobs then load the local file with HF_HUB_OFFLINE=1.


rule weights:
    output:
        weights=f"{RESOURCES}/weights/{{model}}/{LOCAL_FILENAME}",
        record=f"{RESOURCES}/weights/{{model}}/{RECORD_FILENAME}",
    log:
        f"{RESOURCES}/logs/weights/{{model}}.log",
    params:
        # Only what decides the file: editing another model key does not fetch again.
        timm_id=lambda w: config["models"][w.model]["timm_id"],
        revision=lambda w: config["models"][w.model]["revision"],
        source_kwargs=lambda w: weights_source_kwargs(w.model),
        out_dir=lambda w, output: os.path.dirname(output.weights),
    localrule: True
    wildcard_constraints:
        model="|".join(re.escape(name) for name in config["models"]),
    conda:
        ENV
    shell:
        "vitplasticity weights --model {wildcards.model:q} --timm-id {params.timm_id:q}"
        " --revision {params.revision:q} --source-kwargs {params.source_kwargs:q}"
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
