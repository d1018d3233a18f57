"""The hf_gpt2 architecture beyond the shared contract: its embedding-protocol outputs against
an independent float64 computation from the state dict, causality, token-id batches, the
parameter groups, LoRA targets and the stages it refuses by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.tiny_models import GPT2_TINY_CONFIG, TINY_MODELS, perturbed
from vitplasticity.models.architectures import (
    ParameterMap,
    UnsupportedModel,
    architecture_for,
)

transformers = pytest.importorskip("transformers")


def tiny() -> torch.nn.Module:
    (case,) = (case for case in TINY_MODELS if case.family == "hf_gpt2")
    return perturbed(case.build())


def ids(n: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, GPT2_TINY_CONFIG["vocab_size"], (n, length), generator=generator)


def direct_embedding_outputs(model: torch.nn.Module, tokens: np.ndarray, block: int) -> list:
    """ln1, mha, ln2, fc1, fc2 of one block on one sequence's embedding output (L, d), from the
    state dict: Conv1D is t @ W + b with W (in, out); FC2 gets [t, 0, ..., 0]."""
    w = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    b, heads, eps = f"h.{block}", model.config.n_head, model.config.layer_norm_epsilon

    def ln(name: str, t: np.ndarray) -> np.ndarray:
        mean, var = t.mean(-1, keepdims=True), t.var(-1, keepdims=True)
        return (t - mean) / np.sqrt(var + eps) * w[f"{b}.{name}.weight"] + w[f"{b}.{name}.bias"]

    def conv1d(name: str, t: np.ndarray) -> np.ndarray:
        return t @ w[f"{b}.{name}.weight"] + w[f"{b}.{name}.bias"]

    length, d = tokens.shape
    d_h = d // heads
    q, k, v = np.split(conv1d("attn.c_attn", tokens), 3, axis=1)
    future = np.triu(np.ones((length, length), dtype=bool), 1)
    outputs = []
    for h in range(heads):
        cols = slice(h * d_h, (h + 1) * d_h)
        logits = np.where(future, -np.inf, q[:, cols] @ k[:, cols].T / np.sqrt(d_h))
        weights = np.exp(logits - logits.max(1, keepdims=True))
        outputs.append(weights / weights.sum(1, keepdims=True) @ v[:, cols])
    padded = np.hstack([tokens, np.zeros((length, w[f"{b}.mlp.c_proj.weight"].shape[0] - d))])
    return [
        ln("ln_1", tokens),
        conv1d("attn.c_proj", np.hstack(outputs)),
        ln("ln_2", tokens),
        conv1d("mlp.c_fc", tokens),
        conv1d("mlp.c_proj", padded),
    ]


def test_embedding_outputs_match_a_direct_float64_computation() -> None:
    model, batch = tiny(), ids(2, 10, seed=1)
    architecture = architecture_for(model)
    w = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    with torch.no_grad():
        embedded = architecture.embed(model, batch)
        for index, block in enumerate(architecture.blocks(model)):
            parts = architecture.embedding_outputs(block, index, embedded)
            for sequence in range(len(batch)):
                tokens = w["wte.weight"][batch[sequence].numpy()] + w["wpe.weight"][:10]
                np.testing.assert_allclose(embedded.tokens[sequence].numpy(), tokens, atol=1e-12)
                expected = direct_embedding_outputs(model, tokens, index)
                for (found,), want in zip(parts, expected, strict=True):
                    np.testing.assert_allclose(found[sequence].numpy(), want, atol=1e-10)


def test_mha_is_causal() -> None:
    """Changing the last token leaves every earlier token's attention output unchanged."""
    model = tiny()
    architecture = architecture_for(model)
    first = ids(1, 8, seed=3)
    changed = first.clone()
    changed[0, -1] = (changed[0, -1] + 1) % GPT2_TINY_CONFIG["vocab_size"]
    block = model.h[0]
    with torch.no_grad():
        a = architecture.embedding_outputs(block, 0, architecture.embed(model, first))[1][0]
        b = architecture.embedding_outputs(block, 0, architecture.embed(model, changed))[1][0]
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=0)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_batches_are_token_ids_within_the_positions() -> None:
    model = tiny()
    architecture = architecture_for(model)
    assert architecture.inputs == "tokens"
    architecture.check_batch(ids(2, 4, seed=0), "reference")
    with pytest.raises(ValueError, match=r"reference: expected token-id batches \(N, L\)"):
        architecture.check_batch(torch.zeros(2, 3, 8, 8), "reference")
    with pytest.raises(ValueError, match=r"downstream: .*torch\.float32"):
        architecture.check_batch(torch.zeros(2, 4), "downstream")
    moved = architecture.to_device(ids(1, 4, seed=0).int(), torch.device("cpu"), torch.float64)
    assert moved.dtype == torch.long
    with pytest.raises(ValueError, match="17 tokens exceed the model's 16 positions"):
        architecture.embed(model, ids(1, 17, seed=0))


def test_parameter_groups_lora_targets_and_refusals() -> None:
    model = tiny()
    architecture = architecture_for(model)
    owners = ParameterMap(architecture, model).owners
    assert {n for n, o in owners.items() if o.group == "emb"} == {"wte.weight", "wpe.weight"}
    assert {n for n, o in owners.items() if o.group == "head"} == {"ln_f.weight", "ln_f.bias"}
    assert {n for n, o in owners.items() if o.group == "fc2"} == {
        f"h.{i}.mlp.c_proj.{p}" for i in range(2) for p in ("weight", "bias")
    }
    assert architecture.lora_targets(model) == [
        "h.0.attn.c_attn",
        "h.0.attn.c_proj",
        "h.1.attn.c_attn",
        "h.1.attn.c_proj",
    ]
    assert architecture.refusal("plasticity", model) is None
    assert architecture.refusal("lora", model) is None
    assert architecture.refusal("finetune", model) is None  # on text: finetune --text
    assert architecture.refusal("bounds", model) is None  # on text: bounds --text
    assert architecture.refusal("recommend", model) is None  # on text: recommend --text
    weights = architecture.attention_weights(model.h[0].attn)
    d = model.config.n_embd
    c_attn = model.h[0].attn.c_attn.weight  # Conv1D (in, out)
    assert torch.equal(weights.query, c_attn[:, :d].T)
    assert torch.equal(weights.key, c_attn[:, d : 2 * d].T)
    assert torch.equal(weights.value, c_attn[:, 2 * d :].T)
    assert torch.equal(weights.output, model.h[0].attn.c_proj.weight.T)
    assert weights.num_heads == model.config.n_head


def test_cross_attention_blocks_are_refused_by_name() -> None:
    config = transformers.GPT2Config(**GPT2_TINY_CONFIG, add_cross_attention=True)
    model = transformers.GPT2Model(config)
    with pytest.raises(UnsupportedModel, match="block 0 of GPT2Model has cross-attention"):
        architecture_for(model).blocks(model)
