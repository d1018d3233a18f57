# The criteria rules' settings (criteria.smk). Kept apart from the rules, as `snakemake --lint`
# asks.

# report.criteria, one params entry per key (vitplasticity.workflow.params.stage_params).
CRITERIA_PARAMS = stage_params(config, CriteriaSettings, "report.criteria")
