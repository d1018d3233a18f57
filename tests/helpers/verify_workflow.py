"""The verification the workflow tests run (tests/pipeline/test_slurm_verify.py, on the local
SLURM; tests/workflow/test_bad_verify_config.py, its config refused): the demo model and data,
one configuration of the demo grid as its experiment, two learning rates and two seeds."""

from __future__ import annotations

EXPERIMENT = "verify_demo"
LRS = [0.01, 0.05]
VERIFY = {
    "finetune": {"pack_runs": True},  # the demo's packing: the one-run rule serves the runs
    "experiments": {
        EXPERIMENT: {
            "enabled": False,
            "optimizer": "sgd",
            "models": ["demo_vit"],
            "datasets": ["demo-stripes"],
            "configurations": ["head"],
            "lrs": LRS,
            "lrs_by_dataset": {},
            "seeds": [0, 1],
        }
    },
    "recommend": {
        "enabled": True,
        "datasets": ["demo-stripes"],
        "verify": {
            "enabled": True,
            "experiment": EXPERIMENT,
            "top_k": 1,
            "baselines": ["head"],
        },
    },
}
CELL = f"finetune/{EXPERIMENT}/demo_vit/demo-stripes"
