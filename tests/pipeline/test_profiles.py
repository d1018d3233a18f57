"""The shipped profiles' requests, without a cluster: every attempt of every rule asks for
memory a 128 GB node has (tests/pipeline/test_slurm.py submits them to its 131,072 MB test node);
the plasticity rules' memory is left to the rules, which derive it from the model's checkpoint
(vitplasticity.workflow.memory; tests/workflow/test_memory.py)."""

from __future__ import annotations

import yaml

from tests.helpers.slurm_harness import GLOBAL_PROFILE, WORKFLOW_PROFILE
from vitplasticity.workflow.memory import DEFAULT_MEM_MB

NODE_MB = 128 * 1024
# The rules whose mem_mb comes from the model's checkpoint: a profile's value would replace it.
DERIVED = {"plasticity", "text_plasticity"}


def test_every_attempt_asks_for_memory_a_128_gb_node_has() -> None:
    # The workflow profile once asked min(48000 * attempt, 144000): sbatch refused the third
    # attempt on a 128 GB node. The attempts are counted by slurm/profile.yaml's retries.
    profile = yaml.safe_load(WORKFLOW_PROFILE.read_text())
    retries = yaml.safe_load((GLOBAL_PROFILE / "profile.yaml").read_text())["retries"]
    env = {"__builtins__": {}, "min": min}  # mem_mb: a number or an expression of `attempt`
    assert set(profile["set-resources"]) >= DERIVED
    for rule, wanted in profile["set-resources"].items():
        if rule in DERIVED:
            # Derived from the checkpoint, or this for a model without one (scheduler.max_mem_mb
            # caps either: set it to the nodes' memory).
            assert "mem_mb" not in wanted and DEFAULT_MEM_MB < NODE_MB, rule
            continue
        for attempt in range(1, retries + 2):
            mem_mb = eval(str(wanted["mem_mb"]), env, {"attempt": attempt})
            assert mem_mb < NODE_MB, (rule, attempt, mem_mb)
