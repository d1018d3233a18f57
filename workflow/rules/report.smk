# Aggregation, statistics, LaTeX tables and figures.


rule aggregate_experiment:
    input:
        experiment_summaries,
    output:
        runs=f"{RESULTS}/aggregate/{{experiment}}_runs.parquet",
        selected=f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
    log:
        f"{RESULTS}/logs/aggregate/{{experiment}}.log",
    params:
        lr_selection=config["report"].get("lr_selection", "val"),
        demo_flag="--demo" if config.get("demo", False) else "",
    conda:
        ENV
    shell:
        "vitplasticity aggregate --experiment {wildcards.experiment} --summaries {input:q}"
        " --lr-selection {params.lr_selection} {params.demo_flag}"
        " --runs-out {output.runs:q} --selected-out {output.selected:q} > {log:q} 2>&1"


rule aggregate_all:
    input:
        expand(f"{RESULTS}/aggregate/{{experiment}}_runs.parquet", experiment=enabled_experiments(config)),
    output:
        f"{RESULTS}/aggregate/runs.parquet",
    log:
        f"{RESULTS}/logs/aggregate/all.log",
    conda:
        ENV
    shell:
        "vitplasticity concat --inputs {input:q} --out {output:q} > {log:q} 2>&1"
