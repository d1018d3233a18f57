# Helpers of recommend.smk: the recommend block's settings, targets and wall time. Kept
# apart from the rule, as `snakemake --lint` asks.


# The recommend block, every default filled in by the schema and checked by check_config.
RECOMMEND = config["recommend"]


def recommend_or_plasticity(key):
    """recommend.<key>, or plasticity.<key> where it is null (its schema default)."""
    value = RECOMMEND[key]
    return config["plasticity"][key] if value is None else value


def recommend_text_n_pairs():
    """recommend.n_pairs, or text_plasticity.n_pairs where it is null."""
    value = RECOMMEND["n_pairs"]
    return TEXT["n_pairs"] if value is None else value


# Each rule's settings, one params entry per key (vitplasticity.settings.stages), with the
# pairs resolved: recommend.n_pairs, or the measuring stage's where it is null.
RECOMMEND_PARAMS = {
    **stage_params(RecommendImageSettings, "recommend"),
    "n_pairs": recommend_or_plasticity("n_pairs"),
}
RECOMMEND_TEXT_PARAMS = {
    **rule_params(RecommendTextSettings, TEXT, "text_plasticity"),
    **stage_params(RecommendTextSettings, "recommend"),
    "n_pairs": recommend_text_n_pairs(),
}


def recommend_targets():
    """Report, decision, table and figure of every recommend (model, dataset), and those of
    every text recommend (recommend_text_targets); none unless enabled."""
    if not RECOMMEND["enabled"]:
        return []
    models = recommend_or_plasticity("models")
    datasets = recommend_or_plasticity("datasets")
    images = expand(
        f"{RESULTS}/recommend/{{model}}/{{dataset}}.{{ext}}",
        model=models,
        dataset=datasets,
        ext=["md", "json", "parquet", "png", "pdf"],
    )
    return images + recommend_text_targets()


def recommend_text_targets():
    """Report, decision and table of every text model x text dataset that text_plasticity
    measures; none unless recommend and text_plasticity are both enabled."""
    if not (RECOMMEND["enabled"] and TEXT["enabled"]):
        return []
    return expand(
        f"{RESULTS}/recommend_text/{{model}}/{{dataset}}.{{ext}}",
        model=TEXT["run_models"],
        dataset=list(TEXT["datasets"]),
        ext=["md", "json", "parquet"],
    )


def recommend_runtime(wildcards, attempt):
    """Minutes for one recommend job: vitplasticity.workflow.runtime's estimate from the block
    (common.smk's model_minutes: a transformers model's job asks for the cap)."""
    return model_minutes(
        wildcards.model,
        lambda timm_id: runtime.recommend_minutes(
            recommend_or_plasticity("n_pairs"),
            RECOMMEND["batch_size"],
            RECOMMEND["warmup_steps"],
            RECOMMEND["batches"],
            timm_id,
            attempt,
        ),
    )
