# Which per-component criterion predicts the finetuning accuracy: rank correlations per
# dataset, Wilcoxon tests across datasets (vitplasticity.report.criteria), a table and a figure.


include: "criteria_common.smk"


rule criteria_stats:
    input:
        selected=f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
        plasticity=FILES.criteria_plasticity,
        recommend=FILES.criteria_recommend,
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
        **REPORT_FILES.table_outputs("criteria"),
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
        REPORT_FILES.figure_outputs("criteria"),
    log:
        f"{RESULTS}/logs/figures/criteria/{{experiment}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity criteria-figure --input {input:q}"
        f"{FIGURE_FLAGS}"


rule criteria_all:
    input:
        TARGETS.criteria(),


# A text experiment's check (vitplasticity.report.text_criteria): per configuration the
# learning rate of lowest mean validation loss, then every criterion (recommend-text's tables
# and text plasticity where they measure the experiment's model and dataset, the
# trainable-parameter baseline) scored against it as the image criteria are.
rule text_criteria:
    input:
        runs=FILES.experiment_summaries,
        recommend=FILES.criteria_recommend,
        plasticity=FILES.criteria_plasticity,
    output:
        selected=f"{RESULTS}/stats/{{experiment}}/selected.parquet",
        scores=f"{RESULTS}/stats/{{experiment}}/criteria.parquet",
        markdown=f"{RESULTS}/stats/{{experiment}}/criteria.md",
    log:
        f"{RESULTS}/logs/stats/{{experiment}}_text_criteria.log",
    params:
        **CRITERIA_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity criteria --experiment {wildcards.experiment} --runs {input.runs:q}"
        " --recommend {input.recommend:q} --plasticity {input.plasticity:q}"
        + command_flags(CriteriaSettings, CRITERIA_PARAMS)
        + " --selected-out {output.selected:q} --out {output.scores:q}"
        " --markdown {output.markdown:q} > {log:q} 2>&1"
