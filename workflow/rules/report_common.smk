# The report rules' shared params (report.smk). Kept apart from the rules, as `snakemake --lint`
# asks. Their tables and figures are declared in vitplasticity.workflow.report (REPORT_FILES).
from vitplasticity.workflow.experiments import compared_optimizers

# The validated config: the schema (workflow/schemas/config.schema.yaml) fills in every
# default, so no setting has a fallback here.
REPORT = config["report"]
# The params of every figure rule: only report.figures, so editing one reruns only figures.
FIGURE_PARAMS = REPORT_FILES.figure_params()
