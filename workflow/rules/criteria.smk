# Which per-component criterion predicts the finetuning accuracy: rank correlations per
# dataset, Wilcoxon tests across datasets (vitplasticity.report.criteria), a table and a figure.


include: "criteria_common.smk"


rule criteria_stats:
    input:
        selected=f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
        plasticity=lambda w: criteria_plasticity(w.experiment),
        recommend=lambda w: criteria_recommend(w.experiment),
    output:
        f"{RESULTS}/stats/{{experiment}}_criteria.parquet",
    log:
        f"{RESULTS}/logs/stats/{{experiment}}_criteria.log",
    params:
        **CRITERIA_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity criteria --selected {input.selected:q}"
        " --plasticity {input.plasticity:q} --recommend {input.recommend:q}"
        + command_flags(CriteriaSettings, CRITERIA_PARAMS)
        + " --out {output:q} > {log:q} 2>&1"


rule criteria_table:
    input:
        f"{RESULTS}/stats/{{experiment}}_criteria.parquet",
    output:
        tex=report(
            f"{RESULTS}/tables/{{experiment}}_criteria.tex",
            caption=f"{CAPTIONS}/criteria_table.rst",
            category="Tables",
            subcategory="{experiment}",
        ),
        csv=report(
            f"{RESULTS}/tables/{{experiment}}_criteria.csv",
            caption=f"{CAPTIONS}/criteria_table.rst",
            category="Tables",
            subcategory="{experiment}",
        ),
    log:
        f"{RESULTS}/logs/tables/{{experiment}}_criteria.log",
    params:
        demo_flag=DEMO_FLAG,
    conda:
        ENV
    shell:
        "vitplasticity criteria-table --input {input:q} {params.demo_flag}"
        " --out {output.tex:q} --csv {output.csv:q} > {log:q} 2>&1"


rule criteria_figure:
    input:
        f"{RESULTS}/stats/{{experiment}}_criteria.parquet",
    output:
        figure_outputs("criteria/{experiment}", "criteria_figure", "{experiment}"),
    log:
        f"{RESULTS}/logs/figures/criteria/{{experiment}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity criteria-figure --input {input:q}"
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"


rule criteria_all:
    input:
        criteria_targets(),
