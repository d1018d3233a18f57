# Aggregation, statistics, LaTeX tables (each also as CSV, browsable in the report) and
# figures, each output captioned for `snakemake --report`. Figure rules take only the
# report.figures settings (FIGURE_PARAMS), so editing one of those reruns only figures.

include: "report_common.smk"


rule aggregate_experiment:
    input:
        FILES.experiment_summaries,
    output:
        runs=f"{RESULTS}/aggregate/{{experiment}}_runs.parquet",
        selected=f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
    log:
        f"{RESULTS}/logs/aggregate/{{experiment}}.log",
    params:
        lr_selection=REPORT["lr_selection"],
        demo_flag=DEMO_FLAG,
    conda:
        ENV
    shell:
        "vitplasticity aggregate --experiment {wildcards.experiment} --summaries {input:q}"
        " --lr-selection {params.lr_selection} {params.demo_flag}"
        " --runs-out {output.runs:q} --selected-out {output.selected:q} > {log:q} 2>&1"


rule aggregate_all:
    input:
        expand(
            f"{RESULTS}/aggregate/{{experiment}}_runs.parquet",
            experiment=classification_experiments(config),
        ),
    output:
        f"{RESULTS}/aggregate/runs.parquet",
    log:
        f"{RESULTS}/logs/aggregate/all.log",
    conda:
        ENV
    shell:
        "vitplasticity concat --inputs {input:q} --out {output:q} > {log:q} 2>&1"


rule wilcoxon:
    input:
        f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
    output:
        f"{RESULTS}/stats/{{experiment}}_wilcoxon.parquet",
    log:
        f"{RESULTS}/logs/stats/{{experiment}}_wilcoxon.log",
    params:
        reference=REPORT["reference_component"],
        alternative=REPORT["alternative"],
        alpha=REPORT["alpha"],
        demo_flag=DEMO_FLAG,
    conda:
        ENV
    shell:
        "vitplasticity stats --selected {input:q} --reference {params.reference}"
        " --alternative {params.alternative} --alpha {params.alpha} {params.demo_flag}"
        " --out {output:q} > {log:q} 2>&1"


rule table_accuracy:
    input:
        f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
    output:
        **REPORT_FILES.table_outputs("accuracy"),
    log:
        f"{RESULTS}/logs/tables/{{experiment}}_accuracy.log",
    params:
        demo_flag=DEMO_FLAG,
    conda:
        ENV
    shell:
        "vitplasticity table --kind accuracy --experiment {wildcards.experiment}"
        " --inputs {input:q} {params.demo_flag} --out {output.tex:q} --csv {output.csv:q}"
        " > {log:q} 2>&1"


rule table_wilcoxon:
    input:
        f"{RESULTS}/stats/{{experiment}}_wilcoxon.parquet",
    output:
        **REPORT_FILES.table_outputs("wilcoxon"),
    log:
        f"{RESULTS}/logs/tables/{{experiment}}_wilcoxon.log",
    params:
        demo_flag=DEMO_FLAG,
    conda:
        ENV
    shell:
        "vitplasticity table --kind wilcoxon --experiment {wildcards.experiment}"
        " --inputs {input:q} {params.demo_flag} --out {output.tex:q} --csv {output.csv:q}"
        " > {log:q} 2>&1"


rule table_plasticity:
    input:
        FILES.grid_summaries(),
    output:
        **REPORT_FILES.table_outputs("plasticity"),
    log:
        f"{RESULTS}/logs/tables/plasticity.log",
    params:
        demo_flag=DEMO_FLAG,
    conda:
        ENV
    shell:
        "vitplasticity table --kind plasticity --inputs {input:q} {params.demo_flag}"
        " --out {output.tex:q} --csv {output.csv:q} > {log:q} 2>&1"


rule figure_plasticity_boxplot:
    input:
        FILES.scope_summaries,
    output:
        REPORT_FILES.figure_outputs("plasticity_boxplot"),
    log:
        f"{RESULTS}/logs/figures/plasticity_boxplot/{{model}}/{{scope}}.log",
    wildcard_constraints:
        scope=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind plasticity-boxplot --inputs {input:q}"
        " --title '{wildcards.model}, {wildcards.scope}'"
        f"{FIGURE_FLAGS}"


rule figure_plasticity_depth:
    input:
        FILES.model_summaries,
    output:
        REPORT_FILES.figure_outputs("plasticity_depth"),
    log:
        f"{RESULTS}/logs/figures/plasticity_depth/{{model}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind plasticity-depth --inputs {input:q}"
        " --title {wildcards.model:q}"
        f"{FIGURE_FLAGS}"


rule figure_accuracy:
    input:
        f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
    output:
        REPORT_FILES.figure_outputs("accuracy"),
    log:
        f"{RESULTS}/logs/figures/accuracy/{{experiment}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind accuracy --inputs {input:q}"
        f"{FIGURE_FLAGS}"


rule figure_robustness:
    input:
        f"{RESULTS}/aggregate/{{experiment}}_runs.parquet",
    output:
        REPORT_FILES.figure_outputs("robustness"),
    log:
        f"{RESULTS}/logs/figures/robustness/{{experiment}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind robustness --inputs {input:q}"
        f"{FIGURE_FLAGS}"


rule figure_curves:
    input:
        unpack(FILES.curve_inputs),
    output:
        REPORT_FILES.figure_outputs("curves"),
    log:
        f"{RESULTS}/logs/figures/curves/{{experiment}}/{{model}}/{{dataset}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind curves --inputs {input.metrics:q}"
        " --title '{wildcards.experiment}, {wildcards.model}, {wildcards.dataset}'"
        f"{FIGURE_FLAGS}"


rule figure_optimizers:
    input:
        expand(f"{RESULTS}/aggregate/{{experiment}}_selected.parquet", experiment=compared_optimizers(config)),
    output:
        REPORT_FILES.figure_outputs("optimizers"),
    log:
        f"{RESULTS}/logs/figures/optimizers.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind optimizers --inputs {input:q}"
        f"{FIGURE_FLAGS}"


rule figure_bounds:
    input:
        # The bounds table holds the measured plasticity it is compared with.
        f"{RESULTS}/bounds/{{model}}.parquet",
    output:
        REPORT_FILES.figure_outputs("bounds"),
    log:
        f"{RESULTS}/logs/figures/bounds_{{model}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind bounds --inputs {input:q} --title {wildcards.model:q}"
        f"{FIGURE_FLAGS}"
