"""The hf_deberta_v2 family (DeBERTa-v2 / v3: post-norm encoders with disentangled attention)
beyond the shared contract: plasticity in both protocols against an independent float64
computation from the state dict (content, content-to-position and position-to-content logits,
log-bucketed or clamped relative distances, the encoder's relative embeddings and their norm),
under BERT's convention (LN1 the norm after the attention residual, LN2 the norm after the MLP
residual); the relative embeddings declared and trained with MHA; the parameter groups, LoRA,
the bounds (MHA refused with relative attention, every bound defined without it), and the
configurations refused by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.contract import check_forward
from tests.helpers.numpy_reference import (
    check_against,
    embedding_protocol,
    layer_norm,
    norm_ratio,
    pair_ratios,
    softmax_rows,
)
from tests.helpers.tiny_models import ENCODER_TINY_CONFIG, TINY_MODELS, perturbed
from vitplasticity.models.architectures import (
    ParameterMap,
    UndefinedStage,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.models.architectures.hf_deberta_v2 import HFDebertaV2
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.upper_bounds import undefined_bounds, upper_bounds

transformers = pytest.importorskip("transformers")

VOCAB = ENCODER_TINY_CONFIG["vocab_size"]
CASES = {case.id: case for case in TINY_MODELS if case.family == "hf_deberta_v2"}
# float64 throughout, but the module takes sqrt(d_h * terms) in float32 (scaled_size_sqrt)
RTOL = 1e-6


def tiny(case_id: str) -> torch.nn.Module:
    return perturbed(CASES[case_id].build())


def ids(n: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, length), generator=generator)


_erf = np.vectorize(math.erf)


def gelu(u: np.ndarray) -> np.ndarray:  # "gelu": the exact one
    return 0.5 * u * (1 + _erf(u / math.sqrt(2)))


class Direct:
    """One DeBERTa-v2 encoder written in numpy from its state dict and config."""

    def __init__(self, model: torch.nn.Module) -> None:
        c = self.config = model.config
        prefix = "deberta." if hasattr(model, "deberta") else ""
        self.w = {
            k.removeprefix(prefix): v.detach().double().numpy()
            for k, v in model.state_dict().items()
        }
        self.eps = c.layer_norm_eps
        self.heads = c.num_attention_heads
        self.d_h = c.hidden_size // c.num_attention_heads
        self.terms = [t for t in ("c2p", "p2c") if t in (c.pos_att_type or [])]
        self.scale = math.sqrt(self.d_h * (1 + len(self.terms)))
        self.relative = c.relative_attention
        self.buckets = getattr(c, "position_buckets", -1)
        self.max_distance = (
            c.max_relative_positions if c.max_relative_positions >= 1 else c.max_position_embeddings
        )
        self.span = self.buckets if self.buckets > 0 else self.max_distance
        self.shared = getattr(c, "share_att_key", False)
        if self.relative:
            table = self.w["encoder.rel_embeddings.weight"][: 2 * self.span]
            if "encoder.LayerNorm.weight" in self.w:  # norm_rel_ebd: layer_norm
                table = self.norm("encoder.LayerNorm", table)
            self.table = table

    def norm(self, name: str, t: np.ndarray) -> np.ndarray:
        return layer_norm(t, self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def linear(self, name: str, t: np.ndarray) -> np.ndarray:
        out = t @ self.w[f"{name}.weight"].T
        bias = self.w.get(f"{name}.bias")
        return out if bias is None else out + bias

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        c = self.config
        e = self.w["embeddings.word_embeddings.weight"][token_ids]
        if c.position_biased_input:
            e = e + self.w["embeddings.position_embeddings.weight"][np.arange(len(token_ids))]
        if c.type_vocab_size > 0:
            e = e + self.w["embeddings.token_type_embeddings.weight"][0]
        if "embeddings.embed_proj.weight" in self.w:
            e = self.linear("embeddings.embed_proj", e)
        return self.norm("embeddings.LayerNorm", e)

    def distance(self, length: int) -> np.ndarray:
        """(L, L) relative distances i - j, log-bucketed beyond half the buckets."""
        rel = np.arange(length)[:, None] - np.arange(length)[None, :]
        if self.buckets <= 0:
            return rel
        mid = self.buckets // 2
        near = (rel < mid) & (rel > -mid)
        far = np.where(near, mid - 1, np.abs(rel))
        log = np.ceil(np.log(far / mid) / np.log((self.max_distance - 1) / mid) * (mid - 1)) + mid
        return np.where(far <= mid, rel, log * np.sign(rel)).astype(int)

    def attention(self, b: str, x: np.ndarray) -> np.ndarray:
        """Content, c2p and p2c logits per head, softmax over every token, then the output
        projection."""
        a = f"{b}.attention.self"
        q, k, v = (self.linear(f"{a}.{p}_proj", x) for p in ("query", "key", "value"))
        if self.relative:
            rel = self.distance(len(x))
            c2p = np.clip(rel + self.span, 0, 2 * self.span - 1)  # (i, j): r(i, j)
            p2c = np.clip(-rel + self.span, 0, 2 * self.span - 1)  # (j, i): -r(j, i)
            key_proj = "key_proj" if self.shared else "pos_key_proj"
            query_proj = "query_proj" if self.shared else "pos_query_proj"
            if "c2p" in self.terms:
                pk = self.linear(f"{a}.{key_proj}", self.table)  # (2 span, h d_h)
            if "p2c" in self.terms:
                pq = self.linear(f"{a}.{query_proj}", self.table)
        outputs = []
        for h in range(self.heads):
            part = slice(h * self.d_h, (h + 1) * self.d_h)
            logits = q[:, part] @ k[:, part].T / self.scale
            if self.relative and "c2p" in self.terms:
                scores = q[:, part] @ pk[:, part].T  # (i, position)
                logits = logits + np.take_along_axis(scores, c2p, axis=1) / self.scale
            if self.relative and "p2c" in self.terms:
                scores = k[:, part] @ pq[:, part].T  # (j, position)
                logits = logits + np.take_along_axis(scores, p2c, axis=1).T / self.scale
            outputs.append(softmax_rows(logits) @ v[:, part])
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
    reference, downstream = ids(3, 12, seed=1), ids(2, 12, seed=2)  # downstream cycles
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    check_against(frame, pair_ratios(Direct(model), reference, downstream, protocol), RTOL)


def test_the_relative_distances_are_the_models() -> None:
    """The reference's bucketed distances are those the encoder hands every layer."""
    model = tiny("deberta_v2_tiny")
    embedded = architecture_for(model).embed(model, ids(1, 12, seed=0))
    expected = Direct(model).distance(12)
    assert np.abs(expected).max() < 11  # bucketed: 11 tokens apart is not 11
    np.testing.assert_array_equal(embedded.context.relative_pos[0].numpy(), expected)


def test_the_contract_sees_unnormed_relative_embeddings() -> None:
    """The layers get the encoder's relative embeddings after its LayerNorm, as the model's
    forward gives them: the table before the norm is caught."""

    class Broken(HFDebertaV2):
        def embed(self, model, inputs):
            embedded = super().embed(model, inputs)
            raw = model.encoder.rel_embeddings.weight
            context = type(embedded.context)(
                embedded.context.mask, embedded.context.relative_pos, raw
            )
            return type(embedded)(embedded.tokens, context)

    model = tiny("deberta_v2_tiny")
    check_forward(HFDebertaV2(), model, ids(3, 12, seed=3))
    with pytest.raises(AssertionError):
        check_forward(Broken(), model, ids(3, 12, seed=3))


def test_sequences_beyond_the_positions_are_refused() -> None:
    model = tiny("deberta_v2_tiny")
    architecture_for(model).embed(model, ids(1, 16, seed=0))
    with pytest.raises(ValueError, match="17 tokens exceed the model's 16 positions"):
        architecture_for(model).embed(model, ids(1, 17, seed=0))


# ---------------------------------------------------------------------------------------------
# Which parameters are whose, LoRA, stages


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


def test_parameter_groups_and_the_relative_embeddings_trained_with_mha() -> None:
    model = tiny("deberta_v2_tiny")
    parameters = ParameterMap(architecture_for(model), model)
    groups = _groups(model)
    assert groups["ln1"] == _layer(["attention.output.LayerNorm"])
    assert groups["mha"] == _layer(
        [f"attention.self.{p}_proj" for p in ("query", "key", "value")] + ["attention.output.dense"]
    )  # share_att_key: no position projections of their own
    assert groups["ln2"] == _layer(["output.LayerNorm"])
    assert groups["fc1"] == _layer(["intermediate.dense"])
    assert groups["fc2"] == _layer(["output.dense"])
    assert groups["emb"] == {
        "embeddings.word_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
    }  # no absolute positions, no token types
    assert "head" not in groups  # a bare model: no pooler
    relative = {
        "encoder.rel_embeddings.weight",
        "encoder.LayerNorm.weight",
        "encoder.LayerNorm.bias",
    }
    assert {n for n, o in parameters.owners.items() if o.trained_by == "mha"} - groups[
        "mha"
    ] == relative
    for name in relative:
        assert parameters.owners[name].block is None  # held once, for every layer
        assert name in parameters.trained_names("mha")
        assert name not in parameters.trained_names("fc2")


def test_a_masked_lm_head_leaves_its_tied_decoder_to_the_embedding() -> None:
    model = tiny("deberta_v2_masked_lm_tiny")
    decoder = model.cls.predictions.decoder
    assert decoder.weight is model.deberta.embeddings.word_embeddings.weight
    groups = _groups(model)
    assert groups["head"] == {
        "cls.predictions.bias",
        *(f"cls.predictions.transform.{m}.{p}" for m in ("dense", "LayerNorm") for p in ("weight", "bias")),
    }  # fmt: skip
    assert groups["mha"] >= _layer(
        [f"attention.self.pos_{p}_proj" for p in ("key", "query")], "deberta."
    )
    embeddings = ("word_embeddings", "position_embeddings", "token_type_embeddings")
    assert groups["emb"] == {f"deberta.embeddings.{e}.weight" for e in embeddings} | {
        "deberta.embeddings.embed_proj.weight",
        "deberta.embeddings.LayerNorm.weight",
        "deberta.embeddings.LayerNorm.bias",
    }


def test_the_non_legacy_masked_lm_head_is_the_head() -> None:
    """``legacy: false``: the prediction head multiplies by the word embedding in its forward
    (no module of its own holds it): its dense, norm and bias are the head."""
    config = transformers.DebertaV2Config(**ENCODER_TINY_CONFIG, legacy=False)
    model = transformers.DebertaV2ForMaskedLM(config)
    assert _groups(model)["head"] == {
        "lm_predictions.lm_head.bias",
        *(f"lm_predictions.lm_head.{m}.{p}" for m in ("dense", "LayerNorm") for p in ("weight", "bias")),
    }  # fmt: skip


def test_lora_adapts_every_projection_of_the_attention() -> None:
    from vitplasticity.models.lora import apply_lora, check_adapters_used

    model = tiny("deberta_v2_masked_lm_tiny")
    architecture = architecture_for(model)
    assert architecture.lora_targets(model) == [
        f"deberta.encoder.layer.{i}.attention.{p}"
        for i in range(2)
        for p in (
            "self.query_proj",
            "self.key_proj",
            "self.value_proj",
            "self.pos_key_proj",
            "self.pos_query_proj",
            "output.dense",
        )
    ]
    model = apply_lora(model, rank=2, alpha=4.0)
    check_adapters_used(model, ids(2, 6, seed=0))


def test_stages_refused_by_name() -> None:
    model = tiny("deberta_v2_tiny")
    architecture = architecture_for(model)
    for stage in ("plasticity", "lora", "bounds", "finetune"):
        assert architecture.refusal(stage, model) is None
    assert architecture.text_task == "masked"
    assert architecture.refusal("recommend", model) is None  # on labelled text
    assert "encoder attends to the tokens after each one" in architecture.refusal(
        "recommend lm", model
    )


def test_the_mha_bound_is_refused_with_relative_attention() -> None:
    model = tiny("deberta_v2_tiny")
    undefined = undefined_bounds(model)
    assert list(undefined) == ["mha"]
    assert "adds disentangled relative-position terms" in undefined["mha"]
    block = model.encoder.layer[0]
    with pytest.raises(UndefinedStage, match="relative-position terms"):
        architecture_for(model).mha_weights((block.attention.self, block.attention.output.dense))


def test_without_relative_attention_every_bound_is_defined_at_the_modules_scale() -> None:
    """relative_attention off: the logits are q.k divided by sqrt(d_h (1 + terms)) (the
    pos_att_type terms still count), so A^h is Q^h K^hT at that scale: the attention rebuilt
    from the bound's weights is the module's."""
    config = transformers.DebertaV2Config(**ENCODER_TINY_CONFIG, pos_att_type=["c2p"])
    torch.manual_seed(0)
    model = perturbed(transformers.DebertaV2Model(config))
    assert undefined_bounds(model) == {}
    inputs = ids(2, 8, seed=4)
    architecture = architecture_for(model)
    embedded = architecture.embed(model, inputs)
    table = upper_bounds(model, embedded.tokens)
    assert set(table["component"]) == {"ln1", "mha", "ln2", "fc1", "fc2"}
    block = model.encoder.layer[0]
    attention = block.attention.self
    for linear in (attention.query_proj, attention.key_proj, attention.value_proj):
        torch.nn.init.zeros_(linear.bias)  # the bound is for attention without biases
    torch.nn.init.zeros_(block.attention.output.dense.bias)
    weights = architecture.mha_weights((attention, block.attention.output.dense))
    assert weights.logit_scale == pytest.approx(1 / math.sqrt(16 * 2))
    x = embedded.tokens[0]
    d_h = 16
    heads = []
    for h in range(weights.num_heads):
        rows = slice(h * d_h, (h + 1) * d_h)
        logits = (x @ weights.query[rows].T) @ (x @ weights.key[rows].T).T * weights.logit_scale
        heads.append(torch.softmax(logits, -1) @ (x @ weights.value[rows].T))
    expected = torch.cat(heads, -1) @ weights.output.T
    with torch.no_grad():
        got = block.attention.output.dense(architecture.attend(attention, x[None], embedded, 0))
    torch.testing.assert_close(got[0], expected, rtol=1e-6, atol=1e-9)


def test_the_convolution_and_repeated_layers_are_refused() -> None:
    config = transformers.DebertaV2Config(**ENCODER_TINY_CONFIG, conv_kernel_size=3)
    model = transformers.DebertaV2ForMaskedLM(config)
    with pytest.raises(UnsupportedModel, match=r"conv_kernel_size=3: encoder\.conv adds"):
        architecture_for(model).blocks(model)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(**ENCODER_TINY_CONFIG))
    model.z_steps = 2
    with pytest.raises(UnsupportedModel, match=r"z_steps=2"):
        architecture_for(model).blocks(model)


def test_every_task_class_is_matched() -> None:
    config = transformers.DebertaV2Config(**ENCODER_TINY_CONFIG)
    for task in ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"):
        model = getattr(transformers, f"DebertaV2{task}")(config)
        assert architecture_for(model).name == "hf_deberta_v2", task
