# Single-component finetuning: one job per (experiment, model, dataset, configuration, lr, seed),
# or, with finetune.pack_runs, one job per (experiment, model, dataset) running its runs in one
# process (each run still has its own folder, summary and metrics).


include: "finetune_packs.smk" if config["finetune"]["pack_runs"] else "finetune_runs.smk"
