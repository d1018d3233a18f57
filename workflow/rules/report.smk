# Aggregation, statistics, LaTeX tables (each also as CSV, browsable in the report) and
# figures, each output captioned for `snakemake --report`. Figure rules take only the
# report.figures settings (FIGURE_PARAMS), so editing one of those reruns only figures.

include: "report_common.smk"


rule aggregate_experiment:
    input:
        experiment_summaries,
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
            experiment=enabled_experiments(config),
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
        tex=report(
            f"{RESULTS}/tables/{{experiment}}_accuracy.tex",
            caption=f"{CAPTIONS}/table_accuracy.rst",
            category="Tables",
            subcategory="{experiment}",
        ),
        csv=report(
            f"{RESULTS}/tables/{{experiment}}_accuracy.csv",
            caption=f"{CAPTIONS}/table_accuracy.rst",
            category="Tables",
            subcategory="{experiment}",
        ),
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
        tex=report(
            f"{RESULTS}/tables/{{experiment}}_wilcoxon.tex",
            caption=f"{CAPTIONS}/table_wilcoxon.rst",
            category="Tables",
            subcategory="{experiment}",
        ),
        csv=report(
            f"{RESULTS}/tables/{{experiment}}_wilcoxon.csv",
            caption=f"{CAPTIONS}/table_wilcoxon.rst",
            category="Tables",
            subcategory="{experiment}",
        ),
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
        [s for model in config["plasticity"]["models"] for s in plasticity_summaries(model)],
    output:
        tex=report(
            f"{RESULTS}/tables/plasticity.tex",
            caption=f"{CAPTIONS}/table_plasticity.rst",
            category="Tables",
            subcategory="plasticity",
        ),
        csv=report(
            f"{RESULTS}/tables/plasticity.csv",
            caption=f"{CAPTIONS}/table_plasticity.rst",
            category="Tables",
            subcategory="plasticity",
        ),
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
        scope_summaries,
    output:
        figure_outputs(
            "plasticity_boxplot/{model}/{scope}", "figure_plasticity_boxplot", "plasticity"
        ),
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
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"


rule figure_plasticity_depth:
    input:
        lambda w: plasticity_summaries(w.model),
    output:
        figure_outputs("plasticity_depth/{model}", "figure_plasticity_depth", "plasticity"),
    log:
        f"{RESULTS}/logs/figures/plasticity_depth/{{model}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind plasticity-depth --inputs {input:q}"
        " --title {wildcards.model:q}"
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"


rule figure_accuracy:
    input:
        f"{RESULTS}/aggregate/{{experiment}}_selected.parquet",
    output:
        figure_outputs("accuracy/{experiment}", "figure_accuracy", "{experiment}"),
    log:
        f"{RESULTS}/logs/figures/accuracy/{{experiment}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind accuracy --inputs {input:q}"
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"


rule figure_robustness:
    input:
        f"{RESULTS}/aggregate/{{experiment}}_runs.parquet",
    output:
        figure_outputs("robustness/{experiment}", "figure_robustness", "{experiment}"),
    log:
        f"{RESULTS}/logs/figures/robustness/{{experiment}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind robustness --inputs {input:q}"
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"


rule figure_curves:
    input:
        unpack(curve_inputs),
    output:
        figure_outputs(
            "curves/{experiment}/{model}/{dataset}", "figure_curves", "{experiment} curves"
        ),
    log:
        f"{RESULTS}/logs/figures/curves/{{experiment}}/{{model}}/{{dataset}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind curves --inputs {input.metrics:q}"
        " --title '{wildcards.experiment}, {wildcards.model}, {wildcards.dataset}'"
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"


rule figure_optimizers:
    input:
        expand(f"{RESULTS}/aggregate/{{experiment}}_selected.parquet", experiment=compared_optimizers()),
    output:
        figure_outputs("optimizers", "figure_optimizers", "optimizers"),
    log:
        f"{RESULTS}/logs/figures/optimizers.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind optimizers --inputs {input:q}"
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"


rule figure_bounds:
    input:
        # The bounds table holds the measured plasticity it is compared with.
        f"{RESULTS}/bounds/{{model}}.parquet",
    output:
        figure_outputs("bounds_{model}", "figure_bounds", "bounds"),
    log:
        f"{RESULTS}/logs/figures/bounds_{{model}}.log",
    params:
        **FIGURE_PARAMS,
    conda:
        ENV
    shell:
        "vitplasticity figure --kind bounds --inputs {input:q} --title {wildcards.model:q}"
        " --width-in {params.width_in} --dpi {params.dpi} --context {params.context}"
        " {params.demo_flag} --out {output:q} > {log:q} 2>&1"
