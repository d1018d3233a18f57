"""Where and in what order a cluster gets the workflow's jobs: CPU-only rules on a partition
of their own (``scheduler.cpu_partition``), and the paper's first results (plasticity,
bounds, the reference set and their figures and tables) before the finetuning grid.

- Partition: the GPU rules (:data:`GPU_RULES`, each asking for ``gpu: 1`` in the workflow
  profile) keep the partition of slurm/profile.yaml's ``default-resources``; every other
  rule gets ``slurm_partition: <scheduler.cpu_partition>`` when that key is set, so no
  CPU-only job lands on the GPU partition without a GPU (local rules, download and weights,
  run on the Snakemake host and ignore it).
- Packs: each rule of ``finetune.pack_runs`` (named by its runs, so that the workflow
  profile's ``set-resources`` cannot name it) asks for what the profile gives the one-run rule
  ``finetune`` (GPU, CPUs per GPU, memory, ``--nice``): on a cluster a pack is a finetuning job
  like the others, whose wall time is its runs' together.
- Order: the rules of :data:`FIRST_RESULT_RULES` get Snakemake priority
  :data:`FIRST_RESULTS_PRIORITY` (0 for every other rule): among the jobs ready at once,
  Snakemake submits them first. SLURM then orders its queue by its own priority; the
  workflow profile gives the finetune rule ``--nice`` so that the grid yields to them there
  too (docs/slurm.md).

Plain Python, no torch import: the Snakefile calls it on every node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The rules whose jobs ask for a GPU (workflow/profiles/default/profile.yaml's `gpu: 1`;
# tests/workflow/test_scheduling.py keeps the two equal), and the prefix of the packed
# finetune rules (finetune.pack_runs, named by their runs).
GPU_RULES = frozenset(
    {"finetune", "finetune_text", "plasticity", "text_plasticity", "recommend", "verify_rung"}
)
GPU_RULE_PREFIX = "finetune_pack_"

# What a user looks at first: plasticity and its bounds need minutes of GPU, not the grid's
# GPU-hours. prepare is here because plasticity reads the prepared datasets (so do the runs).
FIRST_RESULT_RULES = frozenset(
    {
        "prepare",
        "reference",
        "plasticity",
        "bounds",
        "table_plasticity",
        "figure_plasticity_boxplot",
        "figure_plasticity_depth",
        "figure_bounds",
    }
)
FIRST_RESULTS_PRIORITY = 50

SLURM_PARTITION = "slurm_partition"
ONE_RUN_RULE = "finetune"


class PackResourcesError(ValueError):
    """The workflow profile sets what a pack cannot take from the one-run rule."""


def give_packs_the_finetune_resources(
    rules: Iterable[Any], set_resources: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Give each packed finetune rule the profiles' ``set-resources`` of ``finetune``.

    Args:
        rules: Snakemake's rules (``workflow.rules``: ``name``, ``resources``).
        set_resources: the profiles' and command line's ``set-resources``, by rule
            (``workflow.resource_settings.overwrite_resources``).

    Returns:
        The names of the packed rules given them, sorted.

    Raises:
        PackResourcesError: when ``finetune``'s entry sets ``runtime``: that is one run's wall
            time, and a pack asks for its runs' together (the workflow's estimate).
    """
    wanted = set_resources.get(ONE_RUN_RULE, {})
    packs = [rule for rule in rules if rule.name.startswith(GPU_RULE_PREFIX)]
    if packs and "runtime" in wanted:
        raise PackResourcesError(
            f"set-resources: {ONE_RUN_RULE}: runtime is one run's wall time; with"
            " finetune.pack_runs a pack asks for its runs' together, from the workflow's"
            ' estimate (docs/slurm.md, "Wall time"). Remove runtime from set-resources:'
            f" {ONE_RUN_RULE}: or set finetune.pack_runs: false."
        )
    for rule in packs:
        rule.resources.update(wanted)
    return sorted(rule.name for rule in packs)


def is_gpu_rule(name: str) -> bool:
    """Whether the rule ``name``'s jobs ask for a GPU."""
    return name in GPU_RULES or name.startswith(GPU_RULE_PREFIX)


def route_and_prioritize(rules: Iterable[Any], cpu_partition: str | None) -> list[str]:
    """Set each rule's priority and, with ``cpu_partition``, the partition of its CPU jobs.

    Args:
        rules: Snakemake's rules (``workflow.rules``: ``name``, ``priority``, ``resources``).
        cpu_partition: ``scheduler.cpu_partition`` (None: every job the default partition).

    Returns:
        The names of the rules routed to ``cpu_partition``, sorted.
    """
    routed = []
    for rule in rules:
        if rule.name in FIRST_RESULT_RULES:
            rule.priority = FIRST_RESULTS_PRIORITY
        if cpu_partition is None or is_gpu_rule(rule.name):
            continue
        rule.resources[SLURM_PARTITION] = cpu_partition
        routed.append(rule.name)
    return sorted(routed)
