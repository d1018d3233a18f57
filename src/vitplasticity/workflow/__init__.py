"""What the Snakefile imports (no torch): config keys and cross-checks, the run grid, packs,
runtime; and each rule's inputs, params, wall time and targets, bound to the config by the
rule files (jobs, datasets, results, costs, finetune_jobs, report, targets)."""
