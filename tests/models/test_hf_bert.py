"""The hf_bert family (BERT, RoBERTa: post-norm encoders) beyond the shared contract: plasticity
in both protocols against an independent float64 computation from the state dict, under the
convention of docs/architectures.md (LN1 the norm after the attention residual, LN2 the norm
after the MLP residual; in situ, each component takes what it receives in the layer), the
parameter groups (an MLM decoder tied to the embedding is the embedding's), LoRA, and the
models and stages refused by name (DeBERTa-v2: tests/models/test_hf_deberta_v2.py)."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.numpy_reference import (
    check_against,
    embedding_protocol,
    layer_norm,
    norm_ratio,
    pair_ratios,
    softmax_rows,
)
from tests.helpers.real_checkpoints import ENGLISH, MINILM_PARAMETERS
from tests.helpers.tiny_models import ENCODER_TINY_CONFIG, TINY_MODELS, perturbed
from vitplasticity.data.text import load_tokenizer, read_sequences
from vitplasticity.models.architectures import ParameterMap, UnsupportedModel, architecture_for
from vitplasticity.models.build import build_model
from vitplasticity.models.text import text_model_spec
from vitplasticity.plasticity.measure import measure

transformers = pytest.importorskip("transformers")

VOCAB = ENCODER_TINY_CONFIG["vocab_size"]
CASES = {case.id: case for case in TINY_MODELS if case.family == "hf_bert"}
RTOL = 1e-9  # float64 end to end: no float32 step inside BERT


def tiny(case_id: str) -> torch.nn.Module:
    return perturbed(CASES[case_id].build())


def ids(n: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, length), generator=generator)


_erf = np.vectorize(math.erf)


class Direct:
    """One BERT / RoBERTa encoder written in numpy from its state dict and config."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.config = model.config
        prefix = f"{model.base_model_prefix}." if hasattr(model, model.base_model_prefix) else ""
        self.w = {
            k.removeprefix(prefix): v.detach().double().numpy()
            for k, v in model.state_dict().items()
        }
        self.eps = self.config.layer_norm_eps
        self.heads = self.config.num_attention_heads
        self.roberta = self.config.model_type == "roberta"

    def norm(self, name: str, t: np.ndarray) -> np.ndarray:
        return layer_norm(t, self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def linear(self, name: str, t: np.ndarray) -> np.ndarray:
        return t @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        if self.roberta:  # positions from pad + 1; a pad token sits at the pad position
            pad = self.config.pad_token_id
            kept = token_ids != pad
            positions = np.cumsum(kept) * kept + pad
        else:
            positions = np.arange(len(token_ids))
        summed = (
            self.w["embeddings.word_embeddings.weight"][token_ids]
            + self.w["embeddings.position_embeddings.weight"][positions]
            + self.w["embeddings.token_type_embeddings.weight"][0]
        )
        return self.norm("embeddings.LayerNorm", summed)

    def attention(self, b: str, x: np.ndarray) -> np.ndarray:
        """q/k/v, bidirectional softmax per head, then the output projection."""
        q, k, v = (self.linear(f"{b}.attention.self.{p}", x) for p in ("query", "key", "value"))
        d_h = q.shape[1] // self.heads
        outputs = []
        for h in range(self.heads):
            part = slice(h * d_h, (h + 1) * d_h)
            weights = softmax_rows(q[:, part] @ k[:, part].T / math.sqrt(d_h))
            outputs.append(weights @ v[:, part])
        return self.linear(f"{b}.attention.output.dense", np.hstack(outputs))

    def ratios(self, x: np.ndarray, y: np.ndarray, protocol: str) -> dict:
        found = {}
        for block in range(self.config.num_hidden_layers):
            b = f"encoder.layer.{block}"

            def ln1(t, b=b):
                return self.norm(f"{b}.attention.output.LayerNorm", t)

            def ln2(t, b=b):
                return self.norm(f"{b}.output.LayerNorm", t)

            def mha(t, b=b):
                return self.attention(b, t)

            def fc1(t, b=b):
                return self.linear(f"{b}.intermediate.dense", t)

            def fc2(t, b=b):
                return self.linear(f"{b}.output.dense", t)

            def gelu(u):  # BERT's "gelu": the exact one
                return 0.5 * u * (1 + _erf(u / math.sqrt(2)))

            if protocol == "embedding":
                parts = embedding_protocol(
                    x, y, ln1=ln1, mha=mha, ln2=ln2, fc1=fc1, fc2=fc2,
                    fc2_width=self.w[f"{b}.output.dense.weight"].shape[1],
                )  # fmt: skip
            else:
                parts = {"mha": norm_ratio(mha, x, y)}
                sx, sy = x + mha(x), y + mha(y)  # LN1 takes the attention residual's sum
                parts["ln1"] = norm_ratio(ln1, sx, sy)
                x1, y1 = ln1(sx), ln1(sy)
                parts["fc1"] = norm_ratio(fc1, x1, y1)
                hx, hy = gelu(fc1(x1)), gelu(fc1(y1))
                parts["fc2"] = norm_ratio(fc2, hx, hy)
                tx, ty = x1 + fc2(hx), y1 + fc2(hy)  # LN2 takes the MLP residual's sum
                parts["ln2"] = norm_ratio(ln2, tx, ty)
                x, y = ln2(tx), ln2(ty)
            for component, value in parts.items():
                found[(block, component)] = value
        return found


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
@pytest.mark.parametrize("case_id", sorted(CASES))
def test_plasticity_matches_a_direct_float64_computation(case_id: str, protocol: str) -> None:
    model = tiny(case_id)
    reference, downstream = ids(3, 10, seed=1), ids(2, 10, seed=2)  # downstream cycles
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    check_against(frame, pair_ratios(Direct(model), reference, downstream, protocol), RTOL)


def test_roberta_pads_take_the_padding_position() -> None:
    """The reference has pad tokens (id 1), which RoBERTa's positions skip: the embedding is
    the model's own, not positions 0..L-1."""
    model = tiny("roberta_tiny")
    inputs = ids(3, 10, seed=1)
    assert (inputs == model.config.pad_token_id).any()
    with torch.no_grad():
        embedded = architecture_for(model).embed(model, inputs).tokens
    expected = np.stack([Direct(model).embed(row.numpy()) for row in inputs])
    np.testing.assert_allclose(embedded.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_sequences_beyond_the_positions_are_refused() -> None:
    for case_id, limit in (("bert_tiny", 16), ("roberta_tiny", 14)):
        model = tiny(case_id)
        architecture_for(model).embed(model, ids(1, limit, seed=0))
        with pytest.raises(ValueError, match=rf"{limit + 1} tokens exceed the model's {limit}"):
            architecture_for(model).embed(model, ids(1, limit + 1, seed=0))


def _groups(model) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for name, owner in ParameterMap(architecture_for(model), model).owners.items():
        groups.setdefault(owner.group, set()).add(name)
    return groups


def _layer(names: list[str], prefix: str = "") -> set[str]:
    return {
        f"{prefix}encoder.layer.{i}.{name}.{p}"
        for i in range(2)
        for name in names
        for p in ("weight", "bias")
    }


def test_parameter_groups() -> None:
    groups = _groups(tiny("bert_tiny"))
    assert groups["ln1"] == _layer(["attention.output.LayerNorm"])
    assert groups["mha"] == _layer(
        [f"attention.self.{p}" for p in ("query", "key", "value")] + ["attention.output.dense"]
    )
    assert groups["ln2"] == _layer(["output.LayerNorm"])
    assert groups["fc1"] == _layer(["intermediate.dense"])
    assert groups["fc2"] == _layer(["output.dense"])
    embeddings = ("word_embeddings", "position_embeddings", "token_type_embeddings")
    assert groups["emb"] == {f"embeddings.{e}.weight" for e in embeddings} | {
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
    }
    assert groups["head"] == {"pooler.dense.weight", "pooler.dense.bias"}


def _saved_without(tmp_path: Path, dropped: tuple[str, ...]) -> Path:
    """A tiny BertModel saved as a transformers folder, the tensors whose names start with
    ``dropped`` taken out of its model.safetensors."""
    config = transformers.BertConfig(**ENCODER_TINY_CONFIG)
    folder = tmp_path / "bert"
    transformers.BertModel(config).save_pretrained(folder)
    weights = folder / "model.safetensors"
    kept = {k: v for k, v in load_file(weights).items() if not k.startswith(dropped)}
    save_file(kept, weights, metadata={"format": "pt"})
    return folder


def test_a_checkpoint_without_the_unused_pooler_loads_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An encoder checkpoint saved without the pooler (as a ...ForMaskedLM or
    sentence-transformers saves one) loads: no stage reads the pooled output, so the model is
    built without its pooler, and the log says so once; every other tensor is the file's."""
    folder = _saved_without(tmp_path, ("pooler.",))
    entry = {"family": "transformers", "hf_id": "tiny-bert", "weights": str(folder)}
    with caplog.at_level(logging.INFO):
        model = build_model(text_model_spec("bert", entry))
    assert model.pooler is None
    said = [r.getMessage() for r in caplog.records if "holds no pooler" in r.getMessage()]
    assert len(said) == 1 and "BertModel is built without it" in said[0]
    stored = load_file(folder / "model.safetensors")
    assert set(dict(model.named_parameters())) == set(stored)
    # The trainable-parameter counts see no pooler: a bare model without it has no head.
    assert "head" not in _groups(model)


@pytest.mark.parametrize(
    "dropped",
    [("pooler.dense.weight",), ("encoder.layer.1.output.dense.weight",)],
    ids=["part of the pooler", "a backbone weight"],
)
def test_a_checkpoint_missing_a_used_weight_is_refused_by_name(
    tmp_path: Path, dropped: tuple[str, ...]
) -> None:
    folder = _saved_without(tmp_path, dropped)
    entry = {"family": "transformers", "hf_id": "tiny-bert", "weights": str(folder)}
    with pytest.raises(ValueError, match=rf"1 missing weight\(s\): {re.escape(dropped[0])}"):
        build_model(text_model_spec("bert", entry))


def test_a_masked_lm_head_leaves_its_tied_decoder_to_the_embedding() -> None:
    model = tiny("bert_masked_lm_tiny")
    decoder = model.cls.predictions.decoder
    assert decoder.weight is model.bert.embeddings.word_embeddings.weight
    groups = _groups(model)
    assert groups["head"] == {
        "cls.predictions.bias",
        *(f"cls.predictions.transform.{m}.{p}" for m in ("dense", "LayerNorm") for p in ("weight", "bias")),
    }  # fmt: skip
    assert "bert.embeddings.word_embeddings.weight" in groups["emb"]
    assert decoder.bias is model.cls.predictions.bias


def test_lora_adapts_query_key_value_and_the_output_projection() -> None:
    from vitplasticity.models.lora import apply_lora, check_adapters_used

    model = tiny("bert_masked_lm_tiny")
    architecture = architecture_for(model)
    assert architecture.lora_targets(model) == [
        f"bert.encoder.layer.{i}.attention.{p}"
        for i in range(2)
        for p in ("self.query", "self.key", "self.value", "output.dense")
    ]
    model = apply_lora(model, rank=2, alpha=4.0)
    check_adapters_used(model, ids(2, 6, seed=0))


@pytest.mark.parametrize("case_id", ["bert_tiny", "roberta_tiny"])
def test_stages_refused_by_name(case_id: str) -> None:
    model = tiny(case_id)
    architecture = architecture_for(model)
    # the bounds on text: bounds --text; finetune on text: finetune --text
    for stage in ("plasticity", "lora", "bounds", "finetune"):
        assert architecture.refusal(stage, model) is None
    # recommend ranks it on labelled text; the next-token ranking (recommend --text) refuses it
    assert architecture.refusal("recommend", model) is None
    assert "encoder attends to the tokens after each one" in architecture.refusal(
        "recommend lm", model
    )


def test_decoders_and_chunked_mlps_are_refused() -> None:
    config = transformers.BertConfig(**ENCODER_TINY_CONFIG, is_decoder=True)
    decoder = transformers.BertLMHeadModel(config)
    with pytest.raises(UnsupportedModel, match="is_decoder: causal attention"):
        architecture_for(decoder).blocks(decoder)
    config = transformers.RobertaConfig(**ENCODER_TINY_CONFIG, chunk_size_feed_forward=4)
    chunked = transformers.RobertaModel(config)
    with pytest.raises(UnsupportedModel, match="chunk_size_feed_forward=4"):
        architecture_for(chunked).blocks(chunked)


def test_sdpa_measures_what_eager_does() -> None:
    eager = tiny("bert_tiny")
    sdpa = tiny("bert_tiny")
    sdpa.config._attn_implementation = "sdpa"
    reference, downstream = ids(2, 8, seed=1), ids(2, 8, seed=2)
    for protocol in ("embedding", "in_situ"):
        got = measure(sdpa, reference, downstream, protocol=protocol)
        expected = measure(eager, reference, downstream, protocol=protocol)
        np.testing.assert_allclose(got["ratio"].to_numpy(), expected["ratio"].to_numpy(), rtol=1e-9)


# --- a real pretrained checkpoint ------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
def test_the_real_minilm_loads_strictly_and_measures_as_a_direct_float64_computation(
    minilm_folder: Path, tmp_path: Path, protocol: str
) -> None:
    """The real checkpoint through the front door (a models: entry with weights: <folder>:
    every tensor of the file loaded, none missing or left over), tokenized by its own
    tokenizer, measured on English text: the plasticity of every component of its 6 blocks
    equals the numpy float64 computation from its state dict."""
    entry = {"family": "transformers", "hf_id": "all-MiniLM-L6-v2", "weights": str(minilm_folder)}
    model = build_model(text_model_spec("minilm", entry)).double().eval()
    assert type(model).__name__ == "BertModel"
    assert sum(p.numel() for p in model.parameters()) == MINILM_PARAMETERS
    stored = load_file(minilm_folder / "model.safetensors")  # the file, read on its own
    parameters = dict(model.named_parameters())
    # Every parameter is the file's; the file's one other tensor is the position ids buffer
    # that transformers 4.8 saved (newer versions make it and do not save it).
    assert set(stored) - set(parameters) == {"embeddings.position_ids"}
    for name, parameter in parameters.items():
        assert torch.equal(parameter, stored[name].double()), name
    text = tmp_path / "english.txt"
    text.write_text(ENGLISH)
    tokenize = load_tokenizer(str(minilm_folder), model.config.vocab_size)
    sequences = torch.from_numpy(read_sequences(text, tokenize, 16))
    assert len(sequences) >= 5
    reference, downstream = sequences[:3], sequences[3:5]
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    assert frame["block"].n_unique() == 6
    check_against(frame, pair_ratios(Direct(model), reference, downstream, protocol), RTOL)
