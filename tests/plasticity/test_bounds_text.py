"""The bounds of the text families (GPT2, BERT, RoBERTa, bare and in a task class;
docs/architectures.md): each equal to a float64 numpy computation written here from the paper's
formulas (docs/protocol.md, section 2), at or above the plasticity the text stage measures on
the same models (causal GPT2 attention included), the bounds CLI on text against the library, and
Llama and Gemma refused with their reason.

The models are tiny random inits built from config objects (no hub), their weights perturbed so
that the norms' gammas differ from 1 and attention is peaked. The query bias stays zero: the
paper's MHA bound is for bias-free attention, and of the biases only the query's does not cancel
(vitplasticity.plasticity.upper_bounds); the key and value biases are perturbed like the rest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from torch import nn

from tests.helpers.tiny_models import TINY_MODELS
from vitplasticity.cli import main
from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import UndefinedStage, architecture_for
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.upper_bounds import upper_bounds

transformers = pytest.importorskip("transformers")

WIDTH, HEADS, LAYERS, VOCAB, POSITIONS = 32, 4, 2, 64, 24
D_H = WIDTH // HEADS
LENGTH = 12
"""Tokens per test sequence."""


# -- the models -----------------------------------------------------------------------------


def gpt2(model_class: str = "GPT2Model", **overrides: object) -> nn.Module:
    config = transformers.GPT2Config(
        n_layer=LAYERS, n_embd=WIDTH, n_head=HEADS, vocab_size=VOCAB, n_positions=POSITIONS
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return getattr(transformers, model_class)(config)


def encoder(config_class: str, model_class: str) -> nn.Module:
    config = getattr(transformers, config_class)(
        num_hidden_layers=LAYERS,
        hidden_size=WIDTH,
        num_attention_heads=HEADS,
        intermediate_size=4 * WIDTH,
        vocab_size=VOCAB,
        max_position_embeddings=POSITIONS + 2,  # RoBERTa numbers from pad_token_id + 1
    )
    return getattr(transformers, model_class)(config)


def perturbed(model: nn.Module, seed: int) -> nn.Module:
    """``model`` in float64, eval mode, its weights moved off the init: norm gammas around 1 with
    spread, query and key weights large enough to peak the attention, the rest jittered; every
    query bias zero."""
    model = model.double().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if name.endswith("weight") and ("ln_" in name or "LayerNorm" in name):
                parameter.copy_(1.0 + 0.5 * noise)
            elif name.endswith(("c_attn.weight", "query.weight", "key.weight")):
                parameter.copy_(0.3 * noise)
            else:
                parameter.add_(0.05 * noise)
        for module in model.modules():
            if hasattr(module, "c_attn"):  # GPT2: the query is the first third of c_attn
                module.c_attn.bias[:WIDTH] = 0.0
            if hasattr(module, "query") and isinstance(module.query, nn.Linear):
                module.query.bias.zero_()
    return model


# -- the paper's formulas, from the state dict ------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One block's weights in the paper's notation, numpy float64: head h's Q^h, K^h, V^h
    (d x d_h, x -> x^T Q^h) and O^h (d_h x d), the logits' scale, the norms' gammas and eps,
    and the MLP's two weights (either layout: a spectral norm does not mind)."""

    queries: list[np.ndarray]
    keys: list[np.ndarray]
    values: list[np.ndarray]
    outputs: list[np.ndarray]
    logit_scale: float
    gammas: tuple[np.ndarray, np.ndarray]
    eps: float
    fc1: np.ndarray
    fc2: np.ndarray


def _heads(matrix: np.ndarray, axis: int) -> list[np.ndarray]:
    """The D_H-wide slices of ``matrix`` along ``axis``, head by head."""
    return [np.take(matrix, np.arange(h * D_H, (h + 1) * D_H), axis=axis) for h in range(HEADS)]


def gpt2_blocks(w: dict[str, np.ndarray], prefix: str, config: object) -> list[Block]:
    """GPT2's Conv1D weights are stored (in, out): c_attn's columns are [Q | K | V], head h the
    columns h*d_h:(h+1)*d_h of each; c_proj's rows are the heads' concatenated features."""
    blocks = []
    for b in range(LAYERS):
        p = f"{prefix}h.{b}"
        c_attn = w[f"{p}.attn.c_attn.weight"]  # (d, 3d)
        scale = 1 / np.sqrt(D_H) if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            scale /= b + 1
        blocks.append(
            Block(
                queries=_heads(c_attn[:, :WIDTH], axis=1),
                keys=_heads(c_attn[:, WIDTH : 2 * WIDTH], axis=1),
                values=_heads(c_attn[:, 2 * WIDTH :], axis=1),
                outputs=_heads(w[f"{p}.attn.c_proj.weight"], axis=0),
                logit_scale=scale,
                gammas=(w[f"{p}.ln_1.weight"], w[f"{p}.ln_2.weight"]),
                eps=config.layer_norm_epsilon,
                fc1=w[f"{p}.mlp.c_fc.weight"],
                fc2=w[f"{p}.mlp.c_proj.weight"],
            )
        )
    return blocks


def encoder_blocks(w: dict[str, np.ndarray], prefix: str, config: object) -> list[Block]:
    """BERT's Linear weights are (out, in): head h is rows h*d_h:(h+1)*d_h of query, key and
    value (Q^h their transpose) and columns h*d_h:(h+1)*d_h of attention.output.dense. Post-norm
    (docs/architectures.md): LN1 is attention.output.LayerNorm, LN2 output.LayerNorm."""
    blocks = []
    for b in range(LAYERS):
        p = f"{prefix}encoder.layer.{b}"
        q, k, v = (w[f"{p}.attention.self.{name}.weight"].T for name in ("query", "key", "value"))
        blocks.append(
            Block(
                queries=_heads(q, axis=1),
                keys=_heads(k, axis=1),
                values=_heads(v, axis=1),
                outputs=_heads(w[f"{p}.attention.output.dense.weight"].T, axis=0),
                logit_scale=1 / np.sqrt(D_H),
                gammas=(
                    w[f"{p}.attention.output.LayerNorm.weight"],
                    w[f"{p}.output.LayerNorm.weight"],
                ),
                eps=config.layer_norm_eps,
                fc1=w[f"{p}.intermediate.dense.weight"],
                fc2=w[f"{p}.output.dense.weight"],
            )
        )
    return blocks


def gpt2_embedding(w: dict[str, np.ndarray], prefix: str, config: object, ids: np.ndarray):
    """wte(ids) + wpe(0..L-1) (dropout: an identity in eval)."""
    return w[f"{prefix}wte.weight"][ids] + w[f"{prefix}wpe.weight"][np.arange(ids.shape[1])]


def encoder_embedding(w: dict[str, np.ndarray], prefix: str, config: object, ids: np.ndarray):
    """LayerNorm(word(ids) + position + token type 0); RoBERTa's positions start after its
    padding id (the test's ids hold no pad token)."""
    start = config.pad_token_id + 1 if config.model_type == "roberta" else 0
    p = f"{prefix}embeddings"
    x = (
        w[f"{p}.word_embeddings.weight"][ids]
        + w[f"{p}.position_embeddings.weight"][start + np.arange(ids.shape[1])]
        + w[f"{p}.token_type_embeddings.weight"][0]
    )
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + config.layer_norm_eps) * w[f"{p}.LayerNorm.weight"] + w[
        f"{p}.LayerNorm.bias"
    ]


def direct_bounds(blocks: list[Block], tokens: np.ndarray) -> dict[tuple[int, str], tuple]:
    """(block, component) -> (bound, energy bound or None), docs/protocol.md section 2."""
    n = tokens.shape[1]
    squared = (tokens**2).sum(-1)  # (N, n)
    r, energy = np.sqrt(squared.max()), squared.sum(-1).max()
    min_var = tokens.reshape(-1, tokens.shape[-1]).var(-1).min()
    found: dict[tuple[int, str], tuple] = {}
    for b, block in enumerate(blocks):
        for component, gamma in zip(("ln1", "ln2"), block.gammas, strict=True):
            found[(b, component)] = (np.abs(gamma).max() / np.sqrt(min_var + block.eps), None)
        found[(b, "fc1")] = (np.linalg.norm(block.fc1, ord=2), None)
        found[(b, "fc2")] = (np.linalg.norm(block.fc2, ord=2), None)
        bound = bound_energy = 0.0
        for q, k, v, o in zip(block.queries, block.keys, block.values, block.outputs, strict=True):
            a = np.linalg.norm(q @ k.T * block.logit_scale, ord=2)  # A^h = Q^h K^hT / sqrt(d_h)
            ov = np.linalg.norm(o, ord=2) * np.linalg.norm(v, ord=2)
            bound += ov * np.sqrt(3 * n + (12 * n + 3) * r**4 * a**2)
            bound_energy += ov * (np.sqrt(n) + energy * a)  # alpha = 1
        found[(b, "mha")] = (bound, bound_energy)
    return found


@dataclass(frozen=True)
class Case:
    build: Callable[[], nn.Module]
    prefix: str
    blocks: Callable[..., list[Block]]
    embedding: Callable[..., np.ndarray]


CASES = {
    "gpt2": Case(gpt2, "", gpt2_blocks, gpt2_embedding),
    "gpt2_lm_head": Case(
        lambda: gpt2("GPT2LMHeadModel"), "transformer.", gpt2_blocks, gpt2_embedding
    ),
    # logits q.k unscaled, then divided by the layer's number: A^h follows the module's scale
    "gpt2_rescaled": Case(
        lambda: gpt2(scale_attn_weights=False, scale_attn_by_inverse_layer_idx=True),
        "",
        gpt2_blocks,
        gpt2_embedding,
    ),
    "bert": Case(lambda: encoder("BertConfig", "BertModel"), "", encoder_blocks, encoder_embedding),
    "roberta_mlm": Case(
        lambda: encoder("RobertaConfig", "RobertaForMaskedLM"),
        "roberta.",
        encoder_blocks,
        encoder_embedding,
    ),
}


def token_ids(n: int, seed: int) -> torch.Tensor:
    """(n, LENGTH) ids in [2, VOCAB): no pad token (RoBERTa's is 1)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (n, LENGTH), generator=generator)


def _model(case_id: str) -> nn.Module:
    torch.manual_seed(0)
    return perturbed(CASES[case_id].build(), seed=7)


def _embedded(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return architecture_for(model).embed(model, ids).tokens


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_bounds_equal_direct_computation(case_id: str) -> None:
    case, model = CASES[case_id], _model(case_id)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    ids = token_ids(5, seed=1)
    tokens = case.embedding(weights, case.prefix, model.config, ids.numpy())  # (N, n, d)
    # The stage's token set is the embedding output, computed here from the state dict.
    np.testing.assert_allclose(_embedded(model, ids).numpy(), tokens, rtol=0, atol=1e-12)

    table = upper_bounds(model, torch.from_numpy(tokens))
    assert table.height == LAYERS * len(COMPONENTS)
    expected = direct_bounds(case.blocks(weights, case.prefix, model.config), tokens)
    for row in table.iter_rows(named=True):
        bound, bound_energy = expected[(row["block"], row["component"])]
        assert row["bound"] == pytest.approx(bound, rel=1e-10), row
        if bound_energy is None:
            assert row["bound_energy"] is None
        else:
            assert row["bound_energy"] == pytest.approx(bound_energy, rel=1e-10), row
            assert row["n_tokens"] == LENGTH


def _one_token_changed(ids: torch.Tensor, seed: int) -> torch.Tensor:
    """``ids`` with one token of each sequence replaced by another: the closest pairs text has."""
    generator = torch.Generator().manual_seed(seed)
    changed = ids.clone()
    rows = torch.arange(len(ids))
    columns = torch.randint(0, LENGTH, (len(ids),), generator=generator)
    shift = torch.randint(1, VOCAB - 2, (len(ids),), generator=generator)
    changed[rows, columns] = (ids[rows, columns] - 2 + shift) % (VOCAB - 2) + 2
    return changed


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_measured_plasticity_is_below_the_bounds(case_id: str) -> None:
    """The paper's bounds are Lipschitz constants over the token set, so every pair whose both
    sequences are in the set measures at most the bound, in the embedding protocol the bounds
    are stated for. GPT2's attention is causal: each row's softmax runs over a prefix, a face of
    the simplex the bound takes its supremum over, so the bound still holds."""
    model = _model(case_id)
    reference = token_ids(6, seed=3)
    for downstream in (token_ids(6, seed=4), _one_token_changed(reference, seed=5)):
        # Both sequences of every pair belong to the set the bound assumes.
        tokens = torch.cat([_embedded(model, reference), _embedded(model, downstream)])
        bounds = upper_bounds(model, tokens)
        measured = (
            measure(model, reference, downstream, protocol="embedding", batch_size=3)
            .group_by("block", "component")
            .agg(pl.col("ratio").max().alias("worst"))
            .join(bounds, on=["block", "component"])
        )
        assert measured.height == LAYERS * len(COMPONENTS)
        assert (measured["worst"] > 0).all()
        above = measured.filter(pl.col("worst") > pl.col("bound"))
        assert above.height == 0, above
        mha = measured.filter(pl.col("component") == "mha")
        assert (mha["worst"] <= mha["bound_energy"]).all(), mha


@pytest.mark.parametrize("case_id", ["llama_tiny", "gemma2_tiny"])
def test_llama_and_gemma_stay_refused_with_their_reason(case_id: str) -> None:
    case = next(case for case in TINY_MODELS if case.id == case_id)
    model = case.build().eval()
    tokens = architecture_for(model).embed(model, case.inputs(2)).tokens
    with pytest.raises(UndefinedStage, match="RMSNorm does not centre") as error:
        upper_bounds(model, tokens)
    assert "rotary positions" in str(error.value) and type(model).__name__ in str(error.value)


def test_token_ids_instead_of_tokens_are_named() -> None:
    with pytest.raises(ValueError, match=r"expected \(N, n, d\) sequences, got \(5, 12\)"):
        upper_bounds(_model("gpt2"), token_ids(5, seed=1))


# -- the bounds command on text ------------------------------------------------------------------

TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256, "n_positions": 64}
REFERENCE_TEXT = "".join(
    f"Document {i}: the quick brown fox jumps over the lazy dog, {i * 7} times.\n" for i in range(8)
)
DOWNSTREAM_TEXT = "Caf\u00e9 cr\u00e8me\nna\u00efve text, short.\nAnother line, a longer one.\n"


def gpt2_entry(model_type: str = "gpt2", **config: object) -> dict:
    """The models: entry of a random-init tiny GPT2 (or, of ``model_type`` with ``config``,
    another text model)."""
    return {
        "family": "transformers",
        "hf_id": "tiny",
        "weights": "random",
        "config": {"model_type": model_type, **(config or TINY_GPT2)},
        "init_seed": 3,
    }


def _text_argv(command: str, tmp_path: Path, entry: dict, *extra: str) -> list[str]:
    """``command`` on a text model: plasticity's reference text is --reference (beside its
    --text), bounds' is --text."""
    reference = tmp_path / "reference.txt"
    reference.write_text(REFERENCE_TEXT, encoding="utf-8")
    flag = "--text" if command == "bounds" else "--reference"
    common = ["--model", "tiny", "--model-spec", json.dumps(entry), flag, str(reference)]
    common += ["--tokenizer", "bytes", "--sequence-length", "16", "--device", "cpu", "--demo"]
    return [command, *common, *extra]


TINY_BERT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}
CLI_ENTRIES = {"gpt2": gpt2_entry(), "bert": gpt2_entry("bert", **TINY_BERT)}


@pytest.mark.parametrize("family", sorted(CLI_ENTRIES))
def test_cli_equals_the_library_beside_the_measured_plasticity(tmp_path: Path, family: str) -> None:
    from vitplasticity.models.build import build_model
    from vitplasticity.models.text import text_model_spec
    from vitplasticity.utils.io import read_parquet_metadata

    text = tmp_path / "downstream.txt"
    text.write_text(DOWNSTREAM_TEXT, encoding="utf-8")
    pairs, summary = tmp_path / "pairs.parquet", tmp_path / "summary.parquet"
    entry = CLI_ENTRIES[family]
    measure_argv = _text_argv("plasticity", tmp_path, entry, "--text", str(text))
    measure_argv += ["--n-pairs", "6", "--out", str(pairs), "--summary", str(summary)]
    assert main(measure_argv) == 0
    out, prefix = tmp_path / "bounds" / "tiny.parquet", tmp_path / "figures" / "bounds_tiny"
    argv = _text_argv("bounds", tmp_path, entry, "--n-sequences", "5")
    argv += ["--out", str(out), "--plasticity", str(pairs), "--figure-prefix", str(prefix)]
    assert main(argv) == 0

    table = pl.read_parquet(out)
    assert table.height == LAYERS * len(COMPONENTS)
    assert set(table["model"]) == {"tiny"} and set(table["n_datasets"]) == {1}
    meta = read_parquet_metadata(out)
    assert meta["demo"] is True and "undefined" not in meta
    assert meta["provenance"]["settings"]["token_statistics"]["n_sequences"] == 5
    assert meta["provenance"]["settings"]["tokenizer"] == "bytes"
    for suffix in ("pdf", "png"):
        assert (tmp_path / "figures" / f"bounds_tiny.{suffix}").stat().st_size > 1000

    # The bounds equal upper_bounds() on the same weights and the first 5 reference sequences
    # (bytes of the non-empty lines, each with its newline, cut every 16).
    model = build_model(text_model_spec("tiny", entry)).eval().double()
    stream = "".join(line + "\n" for line in REFERENCE_TEXT.split("\n") if line.strip())
    ids = torch.tensor(list(stream.encode("utf-8")[: 5 * 16])).reshape(5, 16)
    expected = upper_bounds(model, _embedded(model, ids))
    np.testing.assert_allclose(table["bound"], expected["bound"], rtol=1e-12)

    # The measured columns are the text plasticity's embedding-protocol ratios.
    means = (
        pl.read_parquet(pairs)
        .filter(pl.col("protocol") == "embedding")
        .group_by("block", "component")
        .agg(pl.col("ratio").mean())
    )
    joined = table.join(means, on=["block", "component"])
    assert joined.height == table.height
    np.testing.assert_allclose(joined["measured_mean"], joined["ratio"], rtol=1e-12)


@pytest.mark.parametrize(
    ("entry", "extra", "message"),
    [
        (gpt2_entry(), ["--n-sequences", "99"], "fewer than --n-sequences 99"),
        (gpt2_entry(), ["--plasticity", "gone.parquet"], "gone.parquet"),
        (gpt2_entry(), ["--sequence-length", "65"], "exceeds the 64 positions"),
        (
            {"family": "timm", "timm_id": "vit_tiny_patch16_224", "weights": "random"},
            [],
            "--model-spec of model 'tiny': family 'timm'",
        ),
        (
            gpt2_entry(
                "llama",
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                vocab_size=256,
            ),
            [],
            "RMSNorm does not centre",
        ),
    ],
    ids=["too-few-sequences", "missing-plasticity", "too-long", "image-model", "llama"],
)
def test_cli_names_the_bad_input(
    tmp_path: Path, entry: dict, extra: list[str], message: str, caplog
) -> None:
    out = tmp_path / "bounds.parquet"
    argv = _text_argv("bounds", tmp_path, entry, "--n-sequences", "3", "--out", str(out))
    with caplog.at_level(logging.ERROR):
        assert main([*argv, *extra]) == 2
    assert any(message in m for m in caplog.messages), caplog.messages
    assert not out.exists()
