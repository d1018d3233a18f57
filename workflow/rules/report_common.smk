# Helpers of the report rules (report.smk): figure outputs in every configured format, tables
# as .tex and .csv, their inputs, and the list of every stats/table/figure target (used by
# report_targets()).
# Kept apart from the rules, as `snakemake --lint` asks.

# The validated config: the schema (workflow/schemas/config.schema.yaml) fills in every
# default, so no setting has a fallback here.
REPORT = config["report"]
FIGURES = REPORT["figures"]
FIGURE_FORMATS = FIGURES["formats"]
DEMO_FLAG = "--demo" if config["demo"] else ""
# The params of every figure rule: only report.figures, so editing one reruns only figures.
FIGURE_PARAMS = dict(
    width_in=FIGURES["width_in"],
    dpi=FIGURES["dpi"],
    context=FIGURES["context"],
    demo_flag=DEMO_FLAG,
)
CAPTIONS = "../report"
# Snakemake's report() under another name: a line starting with "report" is parsed as the
# global `report:` directive outside of rule bodies.
report_flag = report


def figure_outputs(stem, caption, subcategory):
    """One file per configured format; the PNG (else the first format) goes into the report."""
    shown = "png" if "png" in FIGURE_FORMATS else FIGURE_FORMATS[0]
    return [
        report_flag(
            f"{RESULTS}/figures/{stem}.{fmt}",
            caption=f"{CAPTIONS}/{caption}.rst",
            category="Figures",
            subcategory=subcategory,
        )
        if fmt == shown
        else f"{RESULTS}/figures/{stem}.{fmt}"
        for fmt in FIGURE_FORMATS
    ]


def figure_targets(stem, **wildcards):
    """The files of figure ``stem`` (wildcards expanded) in every configured format."""
    stems = expand(stem, **wildcards) if wildcards else [stem]
    return [f"{RESULTS}/figures/{s}.{fmt}" for s in stems for fmt in FIGURE_FORMATS]


def table_targets(stem, **wildcards):
    """The .tex and .csv files of table ``stem`` (wildcards expanded)."""
    stems = expand(stem, **wildcards) if wildcards else [stem]
    return [f"{RESULTS}/tables/{s}.{fmt}" for s in stems for fmt in ("tex", "csv")]


def plasticity_summaries(model, datasets=None):
    names = datasets or config["plasticity"]["datasets"]
    return [f"{RESULTS}/plasticity/{model}/{d}_summary.parquet" for d in names]


def scope_summaries(wildcards):
    """The plasticity summaries of one dataset, or of every dataset for the "pooled" scope."""
    scope = wildcards.scope
    return plasticity_summaries(wildcards.model, None if scope == "pooled" else [scope])


def curve_inputs(wildcards):
    runs = [
        run
        for run in experiment_runs(config, wildcards.experiment)
        if run.model == wildcards.model and run.dataset == wildcards.dataset
    ]
    return {
        "metrics": [f"{RESULTS}/finetune/{run.directory}/metrics.parquet" for run in runs],
        "summaries": [f"{RESULTS}/finetune/{run.directory}/summary.json" for run in runs],
    }


def compared_optimizers():
    """The two enabled experiments of report.optimizer_comparison, or [] when not both are."""
    names = REPORT["optimizer_comparison"]
    enabled = set(enabled_experiments(config))
    return names if len(names) == 2 and all(n in enabled for n in names) else []


def stats_experiments():
    """Enabled experiments that have the reference configuration and other ones to test."""
    reference = REPORT["reference_component"]
    return [
        name
        for name in enabled_experiments(config)
        if reference in config["experiments"][name]["configurations"]
        and len(config["experiments"][name]["configurations"]) > 1
    ]


def report_figure_and_table_targets():
    """Every stats file, table and figure of the enabled experiments and the plasticity grid."""
    experiments = enabled_experiments(config)
    p = config["plasticity"]
    targets = [
        *expand(f"{RESULTS}/stats/{{experiment}}_wilcoxon.parquet", experiment=stats_experiments()),
        *table_targets("{experiment}_wilcoxon", experiment=stats_experiments()),
        *table_targets("{experiment}_accuracy", experiment=experiments),
        *figure_targets("accuracy/{experiment}", experiment=experiments),
        *figure_targets("robustness/{experiment}", experiment=experiments),
    ]
    for name in experiments:
        exp = config["experiments"][name]
        targets += figure_targets(
            f"curves/{name}/{{model}}/{{dataset}}", model=exp["models"], dataset=exp["datasets"]
        )
    if p["models"] and p["datasets"]:
        targets += table_targets("plasticity")
        targets += figure_targets(
            "plasticity_boxplot/{model}/{scope}",
            model=p["models"],
            scope=[*p["datasets"], "pooled"],
        )
        targets += figure_targets("plasticity_depth/{model}", model=p["models"])
    if compared_optimizers():
        targets += figure_targets("optimizers")
    targets += figure_targets("bounds_{model}", model=p["models"])
    return targets
