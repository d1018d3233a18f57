"""The relative gradient norm of a Gemma RMSNorm (1, 2, 3) is relative to the scale the layer
applies, 1 + weight, as the family declares (hf_gemma.offset_norm_gains), not to the stored
offset (0 at init: the ratio would be undefined). Checked in float64 against a direct
computation whose scale is read from what each norm module does to an input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.tiny_models import TINY_MODELS, perturbed
from vitplasticity.recommend.gradients import gradient_statistics

pytest.importorskip("transformers")

# (tiny model, whether its first norm's stored gain is set to 0: a Gemma norm at init; a
# Llama norm of gain 0 applies 0, its ratio undefined either way)
CASES = [("gemma_tiny", True), ("gemma2_tiny", True), ("gemma3_tiny", True), ("llama_tiny", False)]


def _applied_scale(norm: nn.Module) -> torch.Tensor:
    """The per-channel scale ``norm`` multiplies its normalised input by, measured: its output
    over x / rms(x) on a random input (float64)."""
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    x = torch.randn(4, norm.weight.shape[0], dtype=torch.float64)
    normalised = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    with torch.no_grad():
        return (norm(x) / normalised).mean(0)


@pytest.mark.parametrize(("case_id", "zero_first"), CASES, ids=[case[0] for case in CASES])
def test_a_norms_relative_gradient_norm_divides_by_the_scale_it_applies(
    case_id: str, zero_first: bool
) -> None:
    tiny = next(t for t in TINY_MODELS if t.id == case_id)
    model = perturbed(tiny.build())
    norms = {
        f"{name}.weight": module
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RMSNorm")
    }
    first = next(iter(norms.values()))
    if zero_first:
        with torch.no_grad():
            first.weight.zero_()
    batches = [tiny.inputs(2), tiny.inputs(3)]

    def loss(batch: torch.Tensor) -> torch.Tensor:
        return model(batch).last_hidden_state.pow(2).mean()

    table = gradient_statistics(model, batches, list(norms), loss)

    params = [norms[name].weight for name in norms]
    ratios = torch.zeros(len(params), dtype=torch.float64)
    for batch in batches:
        for index, gradient in enumerate(torch.autograd.grad(loss(batch), params)):
            scale = _applied_scale(norms[list(norms)[index]])
            ratios[index] += gradient.norm() / scale.norm() / len(batches)
    measured = dict(table.select("parameter", "relative_gradient_norm").iter_rows())
    for index, name in enumerate(norms):
        # rel 1e-6: Gemma's norms apply 1 + weight in float32 whatever the model's dtype, so the
        # measured scale holds float32 rounding; the stored offset's norm is off by far more.
        assert measured[name] == pytest.approx(ratios[index].item(), rel=1e-6), name
