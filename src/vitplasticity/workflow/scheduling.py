"""Where and in what order a cluster gets the workflow's jobs: CPU-only rules on a partition
of their own (``scheduler.cpu_partition``), and the paper's first results (plasticity,
bounds, the reference set and their figures and tables) before the finetuning grid.

- Partition: the GPU rules (:data:`GPU_RULES`, each asking for a GPU in the workflow
  profile) keep the partition of slurm/profile.yaml's ``default-resources``; every other
  rule gets ``slurm_partition: <scheduler.cpu_partition>`` when that key is set, so no
  CPU-only job lands on the GPU partition without a GPU (local rules, download and weights,
  run on the Snakemake host and ignore it).
- Packs: each rule of ``finetune.pack_runs`` (named by its runs, so that the workflow
  profile's ``set-resources`` cannot name it) asks for what the profile gives the one-run rule
  ``finetune`` (GPU, CPUs per GPU, memory, ``--nice``): on a cluster a pack is a finetuning job
  like the others, whose wall time is its runs' together.
- GPU requests: a rule asks for a GPU in any of snakemake-executor-plugin-slurm's forms,
  ``gpu: 1`` (``--gpus=1``), ``gpu_model`` (``--gpus=<model>:1``) or a ``gres`` naming
  ``gpu`` (``--gres=gpu:1``, ``--gres=gpu:<type>:1``) (:func:`asks_for_gpu`); the workflow
  profile writes it once for every GPU rule. Each such rule also counts as one GPU job for
  Snakemake itself (:data:`GPU_JOBS`), whatever the form, so that ``--resources gpu_jobs=N``
  limits the GPU jobs at once with ``gres`` as with ``gpu``.
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

# The rules whose jobs ask for a GPU (workflow/profiles/default/profile.yaml's GPU request, in
# any form: asks_for_gpu; tests/workflow/test_scheduling.py keeps the two equal), and the
# prefix of the packed finetune rules (finetune.pack_runs, named by their runs).
GPU_RULES = frozenset({"finetune", "plasticity", "text_plasticity", "recommend", "verify_rung"})
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

GPU_JOBS = "gpu_jobs"
"""The resource (1) of every rule that asks for a GPU, in whichever form: Snakemake's own count
of GPU jobs, which ``--resources gpu_jobs=N`` limits (a local run on N GPUs); SLURM never
sees it."""

# The plugin's GPU resources (snakemake_executor_plugin_slurm.utils.set_gres_string): `gpu`
# (with `gpu_model`: --gpus=<model>:<gpu>, gpu defaulting to 1) and `gres` (--gres=<gres>).
GPU_COUNT, GPU_MODEL, GRES = "gpu", "gpu_model", "gres"


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


class GpuRequestError(ValueError):
    """A rule asks for its GPU in two forms at once (``gpu`` and a ``gres`` naming gpu)."""


def _raw(value: Any) -> Any:
    """A resource as the profile wrote it: Snakemake keeps a profile's string (``gpu:1``) as
    an expression to evaluate per job, with the text in ``raw``."""
    return getattr(value, "raw", value)


def gres_names_gpu(gres: Any) -> bool:
    """Whether a ``gres`` value (``gpu:1``, ``gpu:a100:1``, ``gpu``, a comma-separated list)
    holds a GPU."""
    if not isinstance(gres, str):
        return False
    return any(part.strip().split(":")[0] == "gpu" for part in gres.split(","))


def asks_for_gpu(resources: Mapping[str, Any]) -> bool:
    """Whether a rule's ``resources`` ask SLURM for a GPU, in any of the plugin's forms:
    ``gpu: N`` (``--gpus=N``), ``gpu_model`` (``--gpus=<model>:N``), or a ``gres`` naming gpu
    (``--gres=gpu:N``, ``--gres=gpu:<type>:N``)."""
    count = _raw(resources.get(GPU_COUNT))
    return (
        (count is not None and str(count).strip() not in ("", "0"))
        or bool(_raw(resources.get(GPU_MODEL)))
        or gres_names_gpu(_raw(resources.get(GRES)))
    )


def count_gpu_jobs(rules: Iterable[Any]) -> list[str]:
    """Give every rule that asks for a GPU (:func:`asks_for_gpu`) :data:`GPU_JOBS` ``= 1``.

    Args:
        rules: Snakemake's rules (``workflow.rules``: ``name``, ``resources``), the packed
            finetune rules with their resources already given.

    Returns:
        The names of the rules counted, sorted.

    Raises:
        GpuRequestError: naming the rule, when it asks both through ``gpu``/``gpu_model`` and
            through a ``gres`` naming gpu: the plugin would pass sbatch both ``--gpus`` and
            ``--gres``.
    """
    counted = []
    for rule in rules:
        if not asks_for_gpu(rule.resources):
            continue
        as_gpus = asks_for_gpu({k: rule.resources.get(k) for k in (GPU_COUNT, GPU_MODEL)})
        if as_gpus and gres_names_gpu(_raw(rule.resources.get(GRES))):
            raise GpuRequestError(
                f"set-resources: {rule.name}: asks for its GPU twice, as gpu/gpu_model and as"
                f" gres={_raw(rule.resources.get(GRES))!r} (sbatch would get both --gpus and"
                " --gres): keep one form, e.g. replace the workflow profile's &gpu_request"
                ' (docs/slurm.md, "Requesting GPUs")'
            )
        rule.resources[GPU_JOBS] = 1
        counted.append(rule.name)
    return sorted(counted)


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
