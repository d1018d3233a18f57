# The recommend rules' settings (recommend.smk). Kept apart from the rules, as `snakemake
# --lint` asks.
from vitplasticity.workflow.recommend_jobs import recommend_params, recommend_text_params

# Each rule's settings, one params entry per key, with the pairs resolved: recommend.n_pairs,
# or the measuring stage's where it is null (vitplasticity.workflow.recommend_jobs).
RECOMMEND_PARAMS = recommend_params(config, RecommendImageSettings)
RECOMMEND_TEXT_PARAMS = recommend_text_params(config, RecommendTextSettings)
