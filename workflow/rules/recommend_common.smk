# The recommend rules' settings (recommend.smk). Kept apart from the rules, as `snakemake
# --lint` asks.
from vitplasticity.workflow.fallbacks import recommend_text_n_pairs, recommend_value

# Each rule's settings, one params entry per key, with the pairs resolved: recommend.n_pairs,
# or the measuring stage's where it is null (vitplasticity.workflow.fallbacks).
RECOMMEND_PARAMS = {
    **stage_params(config, RecommendImageSettings, "recommend"),
    "n_pairs": recommend_value(config, "n_pairs"),
}
RECOMMEND_TEXT_PARAMS = {
    **rule_params(RecommendTextSettings, config["text_plasticity"], "text_plasticity"),
    **stage_params(config, RecommendTextSettings, "recommend"),
    "n_pairs": recommend_text_n_pairs(config),
}
