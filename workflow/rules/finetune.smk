# Single-component finetuning: one job per (experiment, model, dataset, configuration, lr, seed),
# or, with finetune.pack_runs, one job per (experiment, model, dataset) running its runs in one
# process (each run still has its own folder, summary and metrics). Unpacked, the one-run rule
# serves every experiment; packed, only recommend.verify's (FinetuneJobs.one_run_rule).


if FINETUNE.packed:

    include: "finetune_packs.smk"


if FINETUNE.one_run_rule:

    include: "finetune_runs.smk"
