"""The memory a plasticity job asks for (vitplasticity.workflow.memory): the whole model's
request or the streamed one's, each the sum of the pieces the measurement loads (counted by
StreamedModel and the checkpoint's headers), chosen by ``stream`` and scheduler.max_mem_mb; on
the node, ``stream: auto`` decides as the request says; and Snakemake's dry run asks for it."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.helpers.configs import DEMO, PAPER, Configure, dry_run
from tests.helpers.repo import REPO
from tests.helpers.saved_checkpoints import saved_causal_lm, saved_vit
from vitplasticity.models import stream_decision as decision
from vitplasticity.models.checkpoint_tensors import checkpoint_bytes, checkpoint_files
from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.streamed import open_streamed
from vitplasticity.plasticity.footprint import Pairs, footprint
from vitplasticity.workflow.memory import (
    DEFAULT_MEM_MB,
    MIB,
    OVERHEAD_MB,
    READ_BLOCKS,
    WHOLE_FACTOR,
    Estimates,
    JobMemory,
    requested,
)

TEXT = {"tokenizer": "bytes", "sequence_length": 8, "steps": 1, "val_every": 1}


def _config(
    demo_with: Configure, tmp_path: Path, kind: str, entry: dict | None = None, **stage: Any
) -> dict[str, Any]:
    """The demo's config with model ``m`` a tiny saved checkpoint (``entry``, else one saved
    here): a ViT measured by the plasticity stage, a causal LM by the text one (sequences of 8
    tokens), ``stage`` merged into that stage's block."""
    if kind == "vit":
        entry = entry or saved_vit(tmp_path)
        block = {"plasticity": {"models": ["m"], **stage}}
    else:
        entry = entry or saved_causal_lm(tmp_path, kind)
        text = {"source": "text_file", "path": str(tmp_path / "t.txt"), **TEXT}
        block = {
            "datasets": {"ref": text, "notes": text},
            "text_plasticity": {
                "run_models": ["m"], "reference": "ref", "datasets": ["notes"], **stage
            },
        }  # fmt: skip
    return demo_with({"models": {"m": entry}, **block})


def _asked(config: dict[str, Any], kind: str) -> int:
    jobs = JobMemory(config)
    wildcards = SimpleNamespace(model="m", dataset="notes")
    return jobs.plasticity(wildcards) if kind == "vit" else jobs.text_plasticity(wildcards)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("kind", ["vit", "llama", "gpt2"])
def test_each_request_is_the_sum_of_what_the_measurement_holds(
    demo_with: Configure, tmp_path: Path, kind: str, device: str
) -> None:
    """Streamed: the overhead, the tensors outside the blocks, the largest block and a margin
    (one more block, and on the CPU the carried activations); whole: the overhead and twice
    the checkpoint in float32."""
    always = _config(demo_with, tmp_path, kind, stream="always", device=device)
    block = always["plasticity" if kind == "vit" else "text_plasticity"]
    spec = ModelSpec.from_config(always["models"]["m"])
    streamed = open_streamed(spec).to(torch.device("cpu"), torch.float32)
    pairs = Pairs(block["n_pairs"], block["batch_size"], block["protocols"], 8)
    carried = footprint(spec, torch.float32, pairs).carried
    assert carried is not None and carried > 0
    margin = READ_BLOCKS * streamed.block_bytes() + (carried if device == "cpu" else 0)
    pieces = streamed.outside_bytes() + streamed.block_bytes() + margin
    assert _asked(always, kind) == OVERHEAD_MB + math.ceil(pieces / MIB)

    never = _config(demo_with, tmp_path, kind, stream="never", device=device)
    whole = checkpoint_bytes(checkpoint_files(spec), torch.float32)
    assert _asked(never, kind) == OVERHEAD_MB + math.ceil(WHOLE_FACTOR * whole / MIB)


def test_auto_asks_for_the_whole_model_unless_it_exceeds_the_cap() -> None:
    found = Estimates(whole=9000, streamed=5000)
    assert requested("auto", found, None) == 9000  # no cap: whole
    assert requested("auto", found, 9000) == 9000  # it fits
    assert requested("auto", found, 8999) == 5000  # it does not: one block's
    assert requested("auto", found, 4000) == 4000  # neither does that: the cap
    assert requested("never", found, None) == requested("never", found, 20000) == 9000
    assert requested("never", found, 8000) == 8000
    assert requested("always", found, None) == 5000
    # A checkpoint the streamed path cannot read: the whole model's, whatever the mode.
    unstreamable = Estimates(whole=9000, streamed=None)
    assert requested("always", unstreamable, None) == requested("auto", unstreamable, None) == 9000
    assert requested("auto", unstreamable, 8000) == 8000


def test_a_model_without_a_checkpoint_asks_for_the_default_or_the_cap(
    demo_with: Configure,
) -> None:
    wildcards = SimpleNamespace(model="demo_vit", dataset="demo-stripes")  # weights: random
    assert JobMemory(demo_with({})).plasticity(wildcards) == DEFAULT_MEM_MB == 32000
    capped = demo_with({"scheduler": {"max_mem_mb": 64000}})
    assert JobMemory(capped).plasticity(wildcards) == 64000


def test_a_random_model_asks_without_importing_torch() -> None:
    """The Snakemake process that plans a demo run (random weights) never imports torch for a
    memory request: the entry says there is no checkpoint to count."""
    code = (
        "import sys\n"
        "from types import SimpleNamespace\n"
        "from tests.helpers.configs import DEMO, PAPER, load_config, validated\n"
        "from vitplasticity.workflow.memory import JobMemory\n"
        "jobs = JobMemory(validated(load_config(PAPER, DEMO)))\n"
        "asked = jobs.plasticity(SimpleNamespace(model='demo_vit', dataset='demo-stripes'))\n"
        "print(asked, 'torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.split()[-2:] == [str(DEFAULT_MEM_MB), "False"], result.stdout


def test_a_hub_model_not_fetched_yet_is_snakemakes_tbd(demo_with: Configure) -> None:
    """The error names the weights job's output, one of the job's inputs: Snakemake then
    takes the request as <TBD> and evaluates it again when the job is ready."""
    from snakemake.exceptions import is_file_not_found_error

    config = demo_with({"models": {"demo_vit": {"weights": "hub"}}})
    jobs = JobMemory(config)
    wildcards = SimpleNamespace(model="demo_vit", dataset="demo-stripes")
    with pytest.raises(FileNotFoundError) as error:
        jobs.plasticity(wildcards)
    inputs = jobs.models.weights(wildcards)
    assert error.value.filename == inputs[0]
    assert is_file_not_found_error(error.value, inputs)


def test_on_a_slurm_node_the_job_takes_the_memory_it_was_granted(
    demo_with: Configure, monkeypatch: pytest.MonkeyPatch
) -> None:
    wildcards = SimpleNamespace(model="demo_vit", dataset="demo-stripes")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "4321")
    assert JobMemory(demo_with({}), main_process=False).plasticity(wildcards) == 4321
    assert JobMemory(demo_with({}), main_process=True).plasticity(wildcards) == DEFAULT_MEM_MB


def test_the_whole_factor_is_the_stream_decisions_fraction() -> None:
    assert WHOLE_FACTOR * decision.STREAM_FRACTION == 1


def test_the_node_decides_as_its_request_says(
    demo_with: Configure, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU job (its activations the GPU's) of 8 blocks, given either request as its cgroup
    limit: with what the overhead leaves free, ``stream: auto`` measures the whole model under
    the whole request and streams under the one-block request (the memory queries replaced by
    those figures; the GPU has room)."""
    entry = saved_causal_lm(tmp_path, "llama", layers=8, width=256)
    spec = ModelSpec.from_config(entry)
    rooms = {
        mode: MIB
        * (
            _asked(
                _config(demo_with, tmp_path, "llama", entry, device="cuda", stream=mode), "llama"
            )
            - OVERHEAD_MB
        )
        for mode in ("never", "always")
    }
    assert rooms["always"] < rooms["never"]
    for mode, streams in (("never", False), ("always", True)):
        room = rooms[mode]
        monkeypatch.setattr(
            decision, "free_memory", lambda device, r=room: 10**15 if device.type == "cuda" else r
        )
        assert (
            decision.stream_decision("auto", spec, torch.device("cuda"), torch.float32)[0]
            is streams
        )


MEM_MB = re.compile(
    r"^(?:local)?rule plasticity:\n(?:\s+.*\n)*?\s+resources: .*\bmem_mb=(\d+)", re.M
)


@pytest.mark.slow
def test_snakemakes_dry_run_asks_for_the_derived_memory(
    demo_with: Configure, tmp_path: Path
) -> None:
    """The demo with its ViT's weights a local safetensors file: its plasticity jobs ask for
    the whole model's memory (never), one block's (always), and with auto under a cap below
    the whole model's request the streamed one, as JobMemory derives them."""
    weights = {"models": {"demo_vit": {"weights": saved_vit(tmp_path)["weights"]}}}  # demo_vit's
    wildcards = SimpleNamespace(model="demo_vit", dataset="demo-stripes")
    whole = JobMemory(demo_with({**weights, "plasticity": {"stream": "never"}})).plasticity(
        wildcards
    )
    edits = {
        "never": {"plasticity": {"stream": "never"}},
        "always": {"plasticity": {"stream": "always"}},
        "auto_capped": {"scheduler": {"max_mem_mb": whole - 1}},
    }
    asked = {}
    for name, edit in edits.items():
        edit = {**edit, **weights}
        workdir = tmp_path / name
        workdir.mkdir()
        result = dry_run(workdir, PAPER, DEMO, edit=edit)
        assert result.returncode == 0, result.stderr[-3000:]
        found = {int(m) for m in MEM_MB.findall(result.stdout + result.stderr)}
        assert found == {JobMemory(demo_with(edit)).plasticity(wildcards)}, name
        asked[name] = found.pop()
    assert asked["never"] == whole != asked["always"]
    assert asked["auto_capped"] == min(asked["always"], whole - 1)
