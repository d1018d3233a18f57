# Aggregation, statistics, LaTeX tables and figures.


def experiment_summaries(wildcards):
    return [finetune_summary(run) for run in experiment_runs(config, wildcards.experiment)]


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
        demo=config.get("demo", False),
    shell:
        "vitplasticity aggregate --experiment {wildcards.experiment} --summaries {input:q}"
        " --lr-selection {params.lr_selection} $( [ {params.demo} = True ] && echo --demo )"
        " --runs-out {output.runs:q} --selected-out {output.selected:q} > {log:q} 2>&1"


rule aggregate_all:
    input:
        expand(f"{RESULTS}/aggregate/{{experiment}}_runs.parquet", experiment=enabled_experiments(config)),
    output:
        f"{RESULTS}/aggregate/runs.parquet",
    log:
        f"{RESULTS}/logs/aggregate/all.log",
    shell:
        "vitplasticity concat --inputs {input:q} --out {output:q} > {log:q} 2>&1"


def report_targets():
    experiments = enabled_experiments(config)
    return [
        f"{RESULTS}/aggregate/runs.parquet",
        *expand(f"{RESULTS}/aggregate/{{experiment}}_selected.parquet", experiment=experiments),
    ]
