"""The host memory (``mem_mb``) a plasticity or text plasticity job asks SLURM for, derived
from its model's checkpoint (docs/slurm.md, "Memory"): a whole model's request or a streamed
one's, as the stage's ``stream`` and ``scheduler.max_mem_mb`` choose.

- Whole: :data:`OVERHEAD_MB` + :data:`WHOLE_FACTOR` x every checkpoint tensor in the dtype the
  host holds the whole model in (float32, the build's, or the measurement's when wider).
- Streamed: :data:`OVERHEAD_MB` + what stays loaded beside the blocks (the embedding, the final
  norm; a causal LM's untied head is never loaded) + the largest block + a margin: one more
  block (the checkpoint's pages mapped while a block is read and cast) and, when the stage
  computes on the CPU (``device: cpu``), the activations it carries from block to block for
  every pair (on a GPU they are the GPU's).

Every size comes from :func:`vitplasticity.plasticity.footprint.footprint`: the checkpoint's
headers and the model's skeleton on the meta device, counted by the code the measurement loads
them with. Which request: ``stream: never`` the whole one, ``always`` the streamed one, ``auto``
the whole one when it fits ``scheduler.max_mem_mb`` (null: no cap, always whole), else the
streamed one; either at most the cap. A model with no safetensors checkpoint to count (``weights:
random``, another format) asks for :data:`DEFAULT_MEM_MB` or the cap when one is set; one the
streamed path cannot read (tensors named otherwise) for its whole estimate.

On the node, ``stream: auto`` decides with the same numbers
(:mod:`vitplasticity.models.stream_decision`): it streams when the weights take more than half
the host's free memory, which in a SLURM job is what its cgroup, the request, leaves. A whole
request leaves at least :data:`WHOLE_FACTOR` = 2 times the weights above the overhead, so the job
measures the model whole; a streamed one leaves less, so it streams, unless the streamed
estimate (its carried activations) is itself that large, and then the whole measurement fits.

The constants are calibrated on the CPU (docs/benchmarks.md, "Memory requests"; no GPU node was
measured): a 2 GB-bf16 Llama's text job used 6110 MiB whole and 1450 MiB streamed and asks for
11817 and 4685; a ViT-S/16 image job used 1838 to 2656 MiB and asks for 4259 to 4702. Most of
an image job's memory is not the model's but the imports and the heap its decoding threads leave
behind, which :data:`OVERHEAD_MB` covers.

Evaluated in the main Snakemake process, this imports torch, timm and transformers and builds
the model's skeleton once per model (seconds); a dry run of a config whose models are random or
not fetched yet imports nothing. The Snakemake process SLURM starts on the node to run the job
evaluates every resource again, inside the job's memory: there it takes what SLURM granted
(``SLURM_MEM_PER_NODE``), which is the request, and imports nothing. A ``weights: hub`` model's
checkpoint is the weights job's output: until it exists the request is Snakemake's ``<TBD>`` (a
FileNotFoundError naming one of the job's inputs), and Snakemake evaluates it again when the job
is ready to run (its scheduler resets a ready job's resources before submitting it).
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitplasticity.workflow.datasets import text_reference_sequences
from vitplasticity.workflow.jobs import ModelJobs
from vitplasticity.workflow.params import Wildcards

if TYPE_CHECKING:
    from vitplasticity.plasticity.footprint import Footprint

MIB = 2**20
"""SLURM reads ``--mem`` (the plugin's ``mem_mb``) in MiB."""
DEFAULT_MEM_MB = 32000
"""The request of a model whose checkpoint cannot be counted (the workflow profile's fixed
value before the requests were derived): enough for ViT-H whole."""
OVERHEAD_MB = 4096
"""What a job holds besides the model: the imports (773 MiB measured on the CPU), the heap an
image job's decoding threads leave (up to about 800 MiB measured at 224 px), a GPU process's
CUDA libraries (not measured), the stage's inputs (the paper's 12,800 ImageNet reference
images are about 1.6 GB encoded, held and in the page cache the job's cgroup is charged for) and
one batch's work."""
WHOLE_FACTOR = 2
"""The whole model's weights count this many times: the model and the checkpoint it is loaded
from (measured 1.38-1.50 for a bf16 checkpoint; a float32 one read whole beside it is 2); also 1 /
``stream_decision.STREAM_FRACTION``, so that a job given the whole request decides, on its node,
to measure whole (tests/workflow/test_memory.py checks they agree)."""
GRANTED_VARIABLE = "SLURM_MEM_PER_NODE"
"""Where a SLURM job finds the memory (MiB) its ``--mem`` was granted."""
READ_BLOCKS = 1
"""Blocks' worth of checkpoint pages mapped while a block is read and cast (the benchmark: about
one)."""


@dataclass(frozen=True)
class Estimates:
    """One job's two requests (MiB)."""

    whole: int
    streamed: int | None
    """None: the streamed path cannot read the checkpoint."""


def estimates(footprint: Footprint, on_cpu: bool) -> Estimates:
    """The whole and the streamed request of a measurement of ``footprint``; ``on_cpu``: its
    carried activations are in host memory (``device: cpu``)."""
    whole = OVERHEAD_MB + _mib(WHOLE_FACTOR * footprint.whole)
    if footprint.outside is None or footprint.block is None or footprint.carried is None:
        return Estimates(whole, None)
    streamed = OVERHEAD_MB + _mib(footprint.outside + footprint.block + margin(footprint, on_cpu))
    return Estimates(whole, streamed)


def margin(footprint: Footprint, on_cpu: bool) -> int:
    """The bytes a streamed measurement holds beyond its outside tensors and one block: the
    pages of :data:`READ_BLOCKS` blocks and, on the CPU, its carried activations."""
    assert footprint.block is not None and footprint.carried is not None
    return READ_BLOCKS * footprint.block + (footprint.carried if on_cpu else 0)


def requested(mode: str, found: Estimates, max_mb: int | None) -> int:
    """The request of a job of ``mode`` (``stream``: auto, always, never) under the cap
    ``max_mb`` (``scheduler.max_mem_mb``; None: none): see the module's docstring."""
    streams = found.streamed is not None and (
        mode == "always" or (mode == "auto" and max_mb is not None and found.whole > max_mb)
    )
    asked = found.streamed if streams and found.streamed is not None else found.whole
    return asked if max_mb is None else min(asked, max_mb)


def _mib(size: int) -> int:
    return math.ceil(size / MIB)


class JobMemory:
    """The ``mem_mb`` resource of the plasticity and text plasticity jobs.

    Args:
        config: the validated config (every default filled in by the schema).
        main_process: whether this is the Snakemake process that plans and submits the jobs
            (``workflow.is_main_process``); not on a SLURM node, which takes the memory SLURM
            granted the job.
    """

    def __init__(self, config: dict[str, Any], main_process: bool = True) -> None:
        self.config = config
        self.max_mb: int | None = config["scheduler"]["max_mem_mb"]
        self.models = ModelJobs(config)
        self.main_process = main_process

    @property
    def uncounted(self) -> int:
        """The request of a model whose checkpoint cannot be counted: the cap, or
        :data:`DEFAULT_MEM_MB`."""
        return DEFAULT_MEM_MB if self.max_mb is None else self.max_mb

    def plasticity(self, wildcards: Wildcards) -> int:
        """MiB for one plasticity job (config ``plasticity``)."""
        return self.request(wildcards.model, "plasticity", sequence_length=None)

    def text_plasticity(self, wildcards: Wildcards) -> int:
        """MiB for one text plasticity job (config ``text_plasticity``; its sequences are cut
        as the reference dataset's entry says)."""
        length = text_reference_sequences(self.config)["sequence_length"]
        return self.request(wildcards.model, "text_plasticity", sequence_length=length)

    def request(self, model: str, block: str, sequence_length: int | None) -> int:
        """MiB for a job of ``model`` measured as config ``block`` says.

        Raises:
            FileNotFoundError: naming the first of a ``weights: hub`` model's weights-stage
                files not fetched yet, one of the job's inputs: Snakemake's ``<TBD>``.
        """
        granted = os.environ.get(GRANTED_VARIABLE)
        if not self.main_process and granted is not None and granted.isdigit():
            return int(granted)
        if self.models.models[model]["weights"] == "random":
            # No checkpoint to count, known from the entry: no torch import in the Snakemake
            # process for it (every demo run plans plasticity jobs of random models).
            return self.uncounted
        self._check_fetched(model)
        stage = self.config[block]
        found = _estimates(
            self.models.compute_spec(model),
            stage["dtype"],
            (stage["n_pairs"], stage["batch_size"], tuple(stage["protocols"]), sequence_length),
            stage["device"] == "cpu",
        )
        return self.uncounted if found is None else requested(stage["stream"], found, self.max_mb)

    def _check_fetched(self, model: str) -> None:
        for name in self.models.weights_files(model):
            if not Path(name).exists():
                raise FileNotFoundError(errno.ENOENT, "not fetched yet", name)


@functools.cache
def _estimates(
    spec_json: str,
    dtype: str,
    pairs: tuple[int, int, Sequence[str], int | None],
    on_cpu: bool,
) -> Estimates | None:
    """:func:`estimates` of the compute spec ``spec_json`` (once per process and arguments);
    None when it has no checkpoint to count."""
    import torch

    from vitplasticity.models.checkpoint_tensors import NotStreamable
    from vitplasticity.models.spec import ModelSpec
    from vitplasticity.plasticity.footprint import Pairs, footprint

    spec = ModelSpec.from_config(json.loads(spec_json))
    try:
        found = footprint(spec, getattr(torch, dtype), Pairs(*pairs))
    except (NotStreamable, FileNotFoundError):
        return None
    return estimates(found, on_cpu)
