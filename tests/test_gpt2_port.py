"""The hf_gpt2 architecture computes what the old ``adapters.HFGPT2`` computed.

Temporary: it imports the old adapter, and goes with ``vitplasticity/adapters.py``. In float64
on a perturbed tiny GPT2 the embedding output and mask, every block's five embedding-protocol
outputs (FC2 through ``padded_linear`` on the transposed Conv1D weight, where the old adapter
sliced the stored (in, out) weight into an ``addmm``), the in-situ modules and one real block
pass agree to 1e-12.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.tiny_models import TINY_MODELS, perturbed
from vitplasticity import COMPONENTS
from vitplasticity import adapters as old_adapters  # deleted with adapters.py, with this file
from vitplasticity.architectures import architecture_for

ATOL = 1e-12


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    (case,) = (case for case in TINY_MODELS if case.family == "hf_gpt2")
    return perturbed(case.build()), case.inputs(3)


def test_embedding_outputs_equal_the_old_adapter(gpt2) -> None:
    model, ids = gpt2
    new, old = architecture_for(model), old_adapters.HFGPT2()
    assert new.name == old.name == "hf_gpt2"
    with torch.no_grad():
        new_embedded, old_embedded = new.embed(model, ids), old.embed(model, ids)
        torch.testing.assert_close(new_embedded.tokens, old_embedded.tokens, rtol=0, atol=0)
        torch.testing.assert_close(new_embedded.context, old_embedded.context, rtol=0, atol=0)
        for index, block in enumerate(new.blocks(model)):
            new_parts = new.embedding_outputs(block, index, new_embedded)
            old_parts = old.embedding_outputs(block, index, old_embedded)
            for component, found, expected in zip(COMPONENTS, new_parts, old_parts, strict=True):
                assert len(found) == len(expected) == 1, component
                assert found[0].dtype == torch.float64
                torch.testing.assert_close(found[0], expected[0], rtol=0, atol=ATOL)


def test_in_situ_modules_and_block_pass_equal_the_old_adapter(gpt2) -> None:
    model, ids = gpt2
    new, old = architecture_for(model), old_adapters.HFGPT2()
    with torch.no_grad():
        embedded = new.embed(model, ids)
        for index, block in enumerate(new.blocks(model)):
            assert new.components(block) == old.in_situ_modules(block)  # the same modules
            torch.testing.assert_close(
                new.run_block(block, index, embedded.tokens, embedded),
                old.run_block(block, index, embedded.tokens, embedded),
                rtol=0,
                atol=0,
            )
