"""The footprint of a plasticity measurement (vitplasticity.plasticity.footprint), counted on the
meta device, is what the measurement really loads and carries: the tensors outside the blocks
are those load_outside_blocks reads, the carried activations those of real batches, and the
whole model's bytes the stream decision's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.saved_checkpoints import saved_causal_lm, saved_vit
from vitplasticity.models.architectures import architecture_for
from vitplasticity.models.checkpoint_tensors import (
    NotStreamable,
    checkpoint_bytes,
    checkpoint_files,
)
from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.streamed import open_streamed
from vitplasticity.plasticity.footprint import Pairs, footprint
from vitplasticity.plasticity.streamed import carried_bytes

CPU = torch.device("cpu")


def _entry(tmp_path: Path, kind: str) -> dict:
    return saved_vit(tmp_path) if kind == "vit" else saved_causal_lm(tmp_path, kind)


def _inputs(kind: str, n: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if kind == "vit":
        return torch.randn(n, 3, 32, 32, generator=generator)
    return torch.randint(0, 64, (n, 8), generator=generator)


@pytest.mark.parametrize("kind", ["vit", "llama", "gpt2"])
def test_outside_bytes_are_what_load_outside_blocks_reads(tmp_path: Path, kind: str) -> None:
    """A Llama's untied head is not read; GPT2's tied head is its embedding, read once."""
    streamed = open_streamed(ModelSpec.from_config(_entry(tmp_path, kind))).to(CPU, torch.float64)
    before = {id(t) for t in [*streamed.model.parameters(), *streamed.model.buffers()]}
    streamed.load_outside_blocks()
    loaded = {
        id(t): t
        for t in [*streamed.model.parameters(), *streamed.model.buffers()]
        if id(t) not in before and t.device.type == "cpu"
    }
    assert loaded
    assert streamed.outside_bytes() == sum(t.numel() * t.element_size() for t in loaded.values())


@pytest.mark.parametrize("protocols", [("embedding",), ("embedding", "in_situ")])
@pytest.mark.parametrize("kind", ["vit", "llama"])
def test_the_carried_bytes_counted_on_meta_are_those_of_real_batches(
    tmp_path: Path, kind: str, protocols: tuple[str, ...]
) -> None:
    spec = ModelSpec.from_config(_entry(tmp_path, kind))
    pairs = Pairs(n_pairs=10, batch_size=4, protocols=protocols, sequence_length=8)
    counted = footprint(spec, torch.float32, pairs).carried

    real = open_streamed(spec).to(CPU, torch.float32)
    real.load_outside_blocks()
    batch = _inputs(kind, 2 * pairs.batch_size)
    found = carried_bytes(real, architecture_for(real.model), batch, 3, protocols)
    assert counted == found > 0  # 10 pairs in batches of 4: 3 batches


def test_the_whole_model_is_counted_in_the_dtype_the_host_holds_it_in(tmp_path: Path) -> None:
    """float32 (the build's) for a float32 or bfloat16 measurement, float64 for a float64 one."""
    spec = ModelSpec.from_config(_entry(tmp_path, "llama"))
    files = checkpoint_files(spec)
    pairs = Pairs(n_pairs=2, batch_size=2, protocols=("embedding",), sequence_length=8)
    for dtype, held in [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float64, torch.float64),
    ]:
        found = footprint(spec, dtype, pairs)
        assert found.whole == checkpoint_bytes(files, held)
        streamed = open_streamed(spec).to(CPU, dtype)
        assert (found.outside, found.block) == (streamed.outside_bytes(), streamed.block_bytes())


def test_a_checkpoint_the_streamed_path_cannot_read_has_a_whole_footprint(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "vit")
    state = load_file(entry["weights"])
    state["blocks.0.attn.qkv.w"] = state.pop("blocks.0.attn.qkv.weight")
    save_file(state, entry["weights"])
    spec = ModelSpec.from_config(entry)
    found = footprint(spec, torch.float32, Pairs(2, 2, ("embedding",)))
    assert found.whole == checkpoint_bytes(checkpoint_files(spec), torch.float32)
    assert (found.outside, found.block, found.carried) == (None, None, None)
    assert found.not_streamable is not None and "stream: never" in found.not_streamable
    random = ModelSpec.from_config({**entry, "weights": "random"})
    with pytest.raises(NotStreamable):
        footprint(random, torch.float32, Pairs(2, 2, ("embedding",)))
