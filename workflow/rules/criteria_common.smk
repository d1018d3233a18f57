# Helpers of the criteria rules (criteria.smk): which criteria files score an experiment, and
# the targets. Kept apart from the rules, as `snakemake --lint` asks.

# report.criteria, every default filled in by the schema and checked by check_config.
CRITERIA = REPORT["criteria"]
CRITERIA_PARAMS = stage_params(CriteriaSettings, "report.criteria")


def recommend_enabled():
    return config["recommend"]["enabled"]


def criteria_cells(experiment):
    exp = config["experiments"][experiment]
    return [(model, dataset) for model in exp["models"] for dataset in exp["datasets"]]


def criteria_plasticity(experiment):
    """The measured plasticity summaries of the experiment's (model, dataset) cells."""
    p = config["plasticity"]
    return [
        f"{RESULTS}/plasticity/{model}/{dataset}_summary.parquet"
        for model, dataset in criteria_cells(experiment)
        if model in p["models"] and dataset in p["datasets"]
    ]


def criteria_recommend(experiment):
    """The recommend tables of the experiment's cells, when the recommend block is enabled."""
    if not recommend_enabled():
        return []
    return [
        f"{RESULTS}/recommend/{model}/{dataset}.parquet"
        for model, dataset in criteria_cells(experiment)
    ]


def criteria_experiments():
    """The experiments scored: on when report.criteria.enabled or recommend.enabled; those of
    report.criteria.experiments that are enabled and have a criterion to score."""
    if not (CRITERIA["enabled"] or recommend_enabled()):
        return []
    enabled = set(enabled_experiments(config))
    names = []
    for name in CRITERIA["experiments"]:
        has_criterion = CRITERIA["parameters"] or recommend_enabled() or criteria_plasticity(name)
        if name in enabled and has_criterion:
            names.append(name)
    return names


def criteria_targets():
    """Stats (Parquet), table (.tex + .csv) and figure of every scored experiment."""
    names = criteria_experiments()
    return [
        *expand(f"{RESULTS}/stats/{{experiment}}_criteria.parquet", experiment=names),
        *expand(f"{RESULTS}/tables/{{experiment}}_criteria.{{ext}}", experiment=names, ext=["tex", "csv"]),
        *figure_targets("criteria/{experiment}", experiment=names),
    ]
