# Helpers of recommend.smk: the recommend block's settings, targets and wall time. Kept
# apart from the rule, as `snakemake --lint` asks.


def recommend_settings():
    """The recommend block (empty when absent); its models and datasets checked by name."""
    settings = config.get("recommend") or {}
    problems = [
        f"recommend.{key}: unknown {kind} {name!r} (defined: {', '.join(sorted(config[group]))})"
        for key, kind, group in (("models", "model", "models"), ("datasets", "dataset", "datasets"))
        for name in settings.get(key) or []
        if name not in config[group]
    ]
    if problems:
        raise ValueError("; ".join(problems))
    return settings


def recommend_setting(key, default):
    """One key of the recommend block (its default when absent or null)."""
    value = recommend_settings().get(key)
    return default if value is None else value


def recommend_targets():
    """Report, table and figure of every recommend (model, dataset); none unless enabled."""
    settings = recommend_settings()
    if not settings.get("enabled", False):
        return []
    models = settings.get("models") or config["plasticity"]["models"]
    datasets = settings.get("datasets") or config["plasticity"]["datasets"]
    return expand(
        f"{RESULTS}/recommend/{{model}}/{{dataset}}.{{ext}}",
        model=models,
        dataset=datasets,
        ext=["md", "parquet", "png", "pdf"],
    )


def recommend_runtime(wildcards, attempt):
    """Minutes for one recommend job: its plasticity pairs and head warm-up forwards (1/3 of a
    training step per image) and its gradient batches (one step's work per image) at the
    model's step time, with a 10x margin for decoding, +20 min."""
    n_pairs = recommend_setting("n_pairs", config["plasticity"]["n_pairs"])
    batch_size = recommend_setting("batch_size", 32)
    images = (
        2 * n_pairs / 3
        + recommend_setting("warmup_steps", 50) * batch_size / 3
        + recommend_setting("batches", 8) * batch_size
    )
    seconds = 10 * images * step_seconds(wildcards.model) / 512
    return int(attempt * (20 + seconds / 60))
