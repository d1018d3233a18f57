import re

# Single-component finetuning: one job per (experiment, model, dataset, configuration, lr, seed),
# or, with finetune.pack_runs, one job per (experiment, model, dataset) running its runs in one
# process (each run still has its own folder, summary and metrics).


# The one-run rule serves every experiment unpacked; packed, it serves only the experiment of
# recommend.verify (its runs are chosen as the verification goes, not a fixed grid to pack).
PACKED = config["finetune"]["pack_runs"]
VERIFIED = config["recommend"]["enabled"] and config["recommend"]["verify"]["enabled"]
ONE_RUN_EXPERIMENTS = (
    re.escape(config["recommend"]["verify"]["experiment"]) if PACKED and VERIFIED else r"[A-Za-z0-9_]+"
)


if PACKED:

    include: "finetune_packs.smk"


if not PACKED or VERIFIED:

    include: "finetune_runs.smk"
