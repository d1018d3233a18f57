"""The hf_gpt_neox (GPT-NeoX, Pythia) and hf_falcon families, whose layers run attention and
MLP in parallel (or, configured so, one after the other), beyond the shared contract:
plasticity in both protocols against an independent float64 computation from the state dict
(LayerNorm, the fused query_key_value in each layout, partial rotary, causal softmax, GELU MLP,
the parallel and the sequential residual), the parallel convention (LN1 and LN2 both read the
layer's input), parameter groups, LoRA, the bounds that are and are not defined, and the
layouts refused by name (Falcon's single shared norm, ALiBi)."""

from __future__ import annotations

import math
import re

import numpy as np
import polars as pl
import pytest
import torch

from tests.helpers.contract import check_composition, check_contract
from tests.helpers.numpy_reference import (
    check_against,
    embedding_protocol,
    layer_norm,
    norm_ratio,
    pair_ratios,
    softmax_rows,
)
from tests.helpers.tiny_models import HF_PARALLEL_TINY_CONFIG, TINY_MODELS, perturbed
from vitplasticity.models.architectures import (
    ParameterMap,
    UndefinedStage,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.models.architectures.hf_parallel import PARALLEL, SEQUENTIAL
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.upper_bounds import undefined_bounds, upper_bounds

transformers = pytest.importorskip("transformers")

VOCAB = HF_PARALLEL_TINY_CONFIG["vocab_size"]
CASES = {case.id: case for case in TINY_MODELS if case.family in ("hf_gpt_neox", "hf_falcon")}
PARALLEL_CASES = ["gpt_neox_tiny", "falcon_tiny"]
SEQUENTIAL_CASES = ["gpt_neox_sequential_tiny", "falcon_sequential_tiny"]

# The models compute the rotary angles in float32 even in a float64 model (GPT-NeoX's and
# Falcon's rotary_emb: position_ids.float() * inv_freq.float()): float32-level agreement.
RTOL = 1e-5

_erf = np.vectorize(math.erf)


def tiny(case_id: str) -> torch.nn.Module:
    return perturbed(CASES[case_id].build())


def ids(n: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, length), generator=generator)


# ---------------------------------------------------------------------------------------------
# An independent float64 computation from the state dict


class Direct:
    """One GPT-NeoX or Falcon decoder written in numpy from its state dict and config, not
    from its modules."""

    def __init__(self, model: torch.nn.Module) -> None:
        c = self.config = model.config
        self.falcon = c.model_type == "falcon"
        prefix = {"falcon": "transformer.", "gpt_neox": "gpt_neox."}[c.model_type]
        self.w = {
            k.removeprefix(prefix): v.detach().double().numpy()
            for k, v in model.state_dict().items()
        }
        self.heads, self.d = c.num_attention_heads, c.hidden_size
        self.d_h = self.d // self.heads
        if self.falcon:
            self.layers, self.attn, self.eps = "h", "self_attention", c.layer_norm_epsilon
            self.parallel = c.parallel_attn
            self.norms = (
                ("ln_attn", "ln_mlp")
                if self.parallel
                else ("input_layernorm", "post_attention_layernorm")
            )
            rotary = self.d_h
        else:
            self.layers, self.attn, self.eps = "layers", "attention", c.layer_norm_eps
            self.parallel = c.use_parallel_residual
            self.norms = ("input_layernorm", "post_attention_layernorm")
            rotary = int(self.d_h * c.rope_parameters.get("partial_rotary_factor", 1.0))
        self.rotary = rotary
        theta = c.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / theta ** (np.arange(0, rotary, 2) / rotary)

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        name = "word_embeddings" if self.falcon else "embed_in"
        return self.w[f"{name}.weight"][token_ids]

    def norm(self, block: int, which: int, t: np.ndarray) -> np.ndarray:
        name = f"{self.layers}.{block}.{self.norms[which]}"
        return layer_norm(t, self.w[f"{name}.weight"], self.w[f"{name}.bias"], self.eps)

    def linear(self, block: int, name: str, t: np.ndarray) -> np.ndarray:
        key = f"{self.layers}.{block}.{name}"
        out = t @ self.w[f"{key}.weight"].T
        bias = self.w.get(f"{key}.bias")
        return out if bias is None else out + bias

    def rotate(self, t: np.ndarray) -> np.ndarray:
        """Rotary embedding at positions 0..L-1 on the first ``rotary`` features of a head
        ('rotate half' layout), the rest passed through."""
        turned, kept = t[:, : self.rotary], t[:, self.rotary :]
        angles = np.arange(len(t))[:, None] * self.inv_freq
        cos, sin = np.cos(np.hstack([angles, angles])), np.sin(np.hstack([angles, angles]))
        t1, t2 = np.split(turned, 2, axis=-1)
        return np.hstack([turned * cos + np.hstack([-t2, t1]) * sin, kept])

    def qkv(self, block: int, x: np.ndarray) -> tuple[list, list, list]:
        """Per query head: its query, key and value (L, d_h), read from the fused output in
        the layout the config gives."""
        d_h, heads = self.d_h, self.heads
        fused = self.linear(block, f"{self.attn}.query_key_value", x)
        chunks = [fused[:, i * d_h : (i + 1) * d_h] for i in range(fused.shape[1] // d_h)]
        c = self.config
        if self.falcon and c.new_decoder_architecture:  # per key/value group: queries, k, v
            per_group = heads // c.num_kv_heads
            groups = [
                chunks[g * (per_group + 2) : (g + 1) * (per_group + 2)]
                for g in range(c.num_kv_heads)
            ]
            q = [group[j] for group in groups for j in range(per_group)]
            k = [groups[h // per_group][-2] for h in range(heads)]
            v = [groups[h // per_group][-1] for h in range(heads)]
        elif self.falcon and c.multi_query:  # every query, then one key and one value
            q, k, v = chunks[:heads], [chunks[heads]] * heads, [chunks[heads + 1]] * heads
        else:  # per head: query, key, value
            q, k, v = (chunks[i::3] for i in range(3))
        return q, k, v

    def attention(self, block: int, x: np.ndarray) -> np.ndarray:
        q, k, v = self.qkv(block, x)
        length = len(x)
        blocked = np.arange(length)[None, :] > np.arange(length)[:, None]
        outputs = []
        for h in range(self.heads):
            logits = self.rotate(q[h]) @ self.rotate(k[h]).T / math.sqrt(self.d_h)
            outputs.append(softmax_rows(np.where(blocked, -np.inf, logits)) @ v[h])
        return self.linear(block, f"{self.attn}.dense", np.hstack(outputs))

    def fc1(self, block: int, t: np.ndarray) -> np.ndarray:
        return self.linear(block, "mlp.dense_h_to_4h", t)

    def fc2(self, block: int, t: np.ndarray) -> np.ndarray:
        return self.linear(block, "mlp.dense_4h_to_h", t)

    @staticmethod
    def gelu(u: np.ndarray) -> np.ndarray:  # "gelu": the exact one
        return 0.5 * u * (1 + _erf(u / math.sqrt(2)))

    def ratios(self, x: np.ndarray, y: np.ndarray, protocol: str) -> dict:
        """Per (block, component): numerator and denominator of one pair of sequences."""
        found = {}
        for block in range(self.config.num_hidden_layers):
            ln1 = lambda t, b=block: self.norm(b, 0, t)  # noqa: E731
            ln2 = lambda t, b=block: self.norm(b, 1, t)  # noqa: E731
            mha = lambda t, b=block: self.attention(b, t)  # noqa: E731
            fc1 = lambda t, b=block: self.fc1(b, t)  # noqa: E731
            fc2 = lambda t, b=block: self.fc2(b, t)  # noqa: E731
            if protocol == "embedding":
                width = self.w[f"{self.layers}.{block}.mlp.dense_4h_to_h.weight"].shape[1]
                parts = embedding_protocol(
                    x, y, ln1=ln1, mha=mha, ln2=ln2, fc1=fc1, fc2=fc2, fc2_width=width
                )
            else:
                parts = {"ln1": norm_ratio(ln1, x, y)}
                ux, uy = ln1(x), ln1(y)
                parts["mha"] = norm_ratio(mha, ux, uy)
                ax, ay = mha(ux), mha(uy)
                # Parallel: the MLP's norm reads the layer's input; sequential: the sum after
                # the attention's residual.
                rx, ry = (x, y) if self.parallel else (x + ax, y + ay)
                parts["ln2"] = norm_ratio(ln2, rx, ry)
                vx, vy = ln2(rx), ln2(ry)
                parts["fc1"] = norm_ratio(fc1, vx, vy)
                hx, hy = self.gelu(fc1(vx)), self.gelu(fc1(vy))
                parts["fc2"] = norm_ratio(fc2, hx, hy)
                x = x + ax + fc2(hx)
                y = y + ay + fc2(hy)
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


FALCON_QKV = {
    # falcon_tiny: 3 query heads per key/value group; falcon_sequential_tiny: multi-query
    "one query head per group": {"new_decoder_architecture": True, "num_kv_heads": 3},
    "per head": {"parallel_attn": False, "multi_query": False},
}


@pytest.mark.parametrize("layout", sorted(FALCON_QKV))
def test_falcons_other_qkv_layouts_are_read_as_the_model_reads_them(layout: str) -> None:
    """Falcon's query_key_value holds q, k and v in one of three orders (grouped per
    key/value head, multi-query, per head): each is MHA's, and the numpy computation, which
    reads each order itself, agrees with the model's attention."""
    config = {**HF_PARALLEL_TINY_CONFIG, "ffn_hidden_size": 96, **FALCON_QKV[layout]}
    torch.manual_seed(0)
    model = perturbed(transformers.FalconModel(transformers.FalconConfig(**config)))
    check_contract(architecture_for(model), model, ids(3, 12, seed=0))
    reference, downstream = ids(2, 8, seed=1), ids(2, 8, seed=2)
    for protocol in ("embedding", "in_situ"):
        frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
        check_against(frame, pair_ratios(Direct(model), reference, downstream, protocol), RTOL)


def test_sdpa_measures_what_eager_does() -> None:
    frames = []
    for implementation in ("eager", "sdpa"):
        model = tiny("falcon_tiny")
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        frames.append(measure(model, ids(2, 12, seed=1), ids(2, 12, seed=2), protocol="in_situ"))
    # eager takes its softmax in float32 even in a float64 model: float32-level agreement.
    np.testing.assert_allclose(frames[0]["ratio"], frames[1]["ratio"], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# The parallel convention: LN1 the attention's norm, LN2 the MLP's, both on the layer's input


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_in_situ_ln2_reads_the_layers_input_exactly_when_the_layer_is_parallel(
    case_id: str,
) -> None:
    model = tiny(case_id)
    frame = measure(model, ids(2, 10, seed=1), ids(2, 10, seed=2), protocol="in_situ")
    denominators = {
        (r["block"], r["component"], r["pair"]): r["denominator"]
        for r in frame.iter_rows(named=True)
    }
    same = [
        denominators[(block, "ln2", pair)] == denominators[(block, "ln1", pair)]
        for block in range(2)
        for pair in range(2)
    ]
    assert all(same) if case_id in PARALLEL_CASES else not any(same)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_each_layer_says_its_layout_and_norms(case_id: str) -> None:
    model = tiny(case_id)
    architecture = architecture_for(model)
    norms = {
        "gpt_neox_tiny": ("input_layernorm", "post_attention_layernorm"),
        "gpt_neox_sequential_tiny": ("input_layernorm", "post_attention_layernorm"),
        "falcon_tiny": ("ln_attn", "ln_mlp"),
        "falcon_sequential_tiny": ("input_layernorm", "post_attention_layernorm"),
    }[case_id]
    for block in architecture.blocks(model):
        assert architecture.layout(block) == (PARALLEL if case_id in PARALLEL_CASES else SEQUENTIAL)
        parts = architecture.components(block)
        assert (parts["ln1"][0], parts["ln2"][0]) == tuple(getattr(block, n) for n in norms)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_the_contract_sees_a_layer_composed_in_the_other_layout(case_id: str) -> None:
    model = tiny(case_id)
    base = type(architecture_for(model))
    other = SEQUENTIAL if case_id in PARALLEL_CASES else PARALLEL
    real = base()
    broken = type(
        "Broken",
        (base,),
        {"layout": lambda self, block: other, "norm_names": lambda self, b: real.norm_names(b)},
    )()
    with pytest.raises(AssertionError):
        check_composition(broken, model, CASES[case_id].inputs(3))


# ---------------------------------------------------------------------------------------------
# Which parameters are whose, LoRA, stages


def _groups(model) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for name, owner in ParameterMap(architecture_for(model), model).owners.items():
        groups.setdefault(owner.group, set()).add(name)
    return groups


def _names(prefix: str, modules: tuple[str, ...], kinds: tuple[str, ...]) -> set[str]:
    return {f"{prefix}.{i}.{m}.{k}" for i in range(2) for m in modules for k in kinds}


def test_gpt_neox_parameter_groups_and_lora() -> None:
    """The fused query_key_value is MHA's, with dense; LoRA adapts both whole; the untied
    lm_head of the causal LM is head, with the final norm."""
    model = tiny("gpt_neox_sequential_tiny")  # GPTNeoXForCausalLM
    groups = _groups(model)
    wb = ("weight", "bias")
    p = "gpt_neox.layers"
    assert groups["ln1"] == _names(p, ("input_layernorm",), wb)
    assert groups["ln2"] == _names(p, ("post_attention_layernorm",), wb)
    assert groups["mha"] == _names(p, ("attention.query_key_value", "attention.dense"), wb)
    assert groups["fc1"] == _names(p, ("mlp.dense_h_to_4h",), wb)
    assert groups["fc2"] == _names(p, ("mlp.dense_4h_to_h",), wb)
    assert groups["emb"] == {"gpt_neox.embed_in.weight"}
    assert groups["head"] == {
        "gpt_neox.final_layer_norm.weight",
        "gpt_neox.final_layer_norm.bias",
        "lm_head.weight",
    }
    architecture = architecture_for(model)
    assert architecture.lora_targets(model) == [
        f"{p}.{i}.attention.{n}" for i in range(2) for n in ("query_key_value", "dense")
    ]


def test_falcon_parameter_groups_lora_and_fc1_modes() -> None:
    from vitplasticity.models.lora import apply_lora, check_adapters_used

    model = tiny("falcon_tiny")
    groups = _groups(model)
    wb = ("weight", "bias")
    assert groups["ln1"] == _names("h", ("ln_attn",), wb)
    assert groups["ln2"] == _names("h", ("ln_mlp",), wb)
    assert groups["mha"] == _names(
        "h", ("self_attention.query_key_value", "self_attention.dense"), wb
    )
    assert groups["emb"] == {"word_embeddings.weight"}
    assert groups["head"] == {"ln_f.weight", "ln_f.bias"}
    architecture = architecture_for(model)
    block = model.h[0]
    # A plain MLP: fc1 mode 'up' is its one first stage, as 'stage' is.
    assert architecture.components(block, fc1="up") == architecture.components(block)
    adapted = apply_lora(model, rank=2, alpha=4.0)
    check_adapters_used(adapted, ids(2, 6, seed=0))
    trained = ParameterMap(architecture_for(adapted), adapted).trained_names("lora")
    assert {n for n in trained if "lora_" in n} == {
        f"h.{i}.self_attention.{n}.lora_{m}.default.weight"
        for i in range(2)
        for n in ("query_key_value", "dense")
        for m in "AB"
    }


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_bounds_but_mhas_are_defined(case_id: str) -> None:
    """LayerNorm centres: the LN bounds hold, as the FC ones; MHA's is refused for the rotary
    positions, by name."""
    model = tiny(case_id)
    architecture = architecture_for(model)
    for stage in ("plasticity", "bounds", "finetune", "recommend", "lora"):
        assert architecture.refusal(stage, model) is None, stage
    undefined = undefined_bounds(model)
    assert list(undefined) == ["mha"]
    assert "rotates queries and keys by their positions" in undefined["mha"]
    table = upper_bounds(model, architecture.embed(model, ids(2, 8, seed=0)).tokens)
    assert set(table["component"]) == {"ln1", "ln2", "fc1", "fc2"}
    attention = architecture.components(architecture.blocks(model)[0])["mha"][0]
    with pytest.raises(UndefinedStage, match="rotates queries and keys"):
        architecture.attention_weights(attention)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_measured_plasticity_is_below_the_defined_bounds(case_id: str) -> None:
    """LN1, LN2, FC1 and FC2's bounds are Lipschitz constants over the token set: every pair of
    sequences in the set measures at most the bound, in the embedding protocol they are
    stated for."""
    model = tiny(case_id)
    architecture = architecture_for(model)
    reference, downstream = ids(4, 10, seed=3), ids(4, 10, seed=4)
    with torch.no_grad():
        tokens = torch.cat(
            [architecture.embed(model, batch).tokens for batch in (reference, downstream)]
        )
    bounds = upper_bounds(model, tokens)
    measured = (
        measure(model, reference, downstream, protocol="embedding", batch_size=2)
        .group_by("block", "component")
        .agg(pl.col("ratio").max().alias("worst"))
        .join(bounds, on=["block", "component"])
    )
    assert measured.height == 2 * 4  # blocks x (ln1, ln2, fc1, fc2)
    assert (measured["worst"] > 0).all()
    assert measured.filter(pl.col("worst") > pl.col("bound")).height == 0


# ---------------------------------------------------------------------------------------------
# Refused by name

FALCON_REFUSED = {
    "shared norm (Falcon-7B)": (
        {"parallel_attn": True, "new_decoder_architecture": False},
        "one norm (input_layernorm) feeds both the attention and the MLP",
    ),
    "shared norm (new architecture)": (
        {"new_decoder_architecture": True, "num_ln_in_parallel_attn": 1},
        "no separate LN2",
    ),
    "alibi": ({"alibi": True, "parallel_attn": False}, "ALiBi"),
    "new architecture, sequential": (
        {"new_decoder_architecture": True, "parallel_attn": False},
        "does not run that layout",
    ),
}


@pytest.mark.parametrize("variant", sorted(FALCON_REFUSED))
def test_falcon_layouts_without_ln1_and_ln2_or_with_alibi_are_refused(variant: str) -> None:
    change, reason = FALCON_REFUSED[variant]
    config = {**HF_PARALLEL_TINY_CONFIG, "ffn_hidden_size": 96, **change}
    model = transformers.FalconForCausalLM(transformers.FalconConfig(**config))
    architecture = architecture_for(model)
    assert architecture.name == "hf_falcon"
    with pytest.raises(
        UnsupportedModel, match=rf"FalconForCausalLM is refused: .*{re.escape(reason)}"
    ):
        architecture.blocks(model)
    with pytest.raises(UnsupportedModel, match=re.escape(reason)):
        ParameterMap(architecture, model)
    with pytest.raises(UnsupportedModel, match=re.escape(reason)):
        measure(model, ids(2, 6, seed=1), ids(2, 6, seed=2))


def test_flash_attention_is_refused() -> None:
    model = tiny("gpt_neox_tiny")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(UnsupportedModel, match="attention_implementation 'flex_attention'"):
        architecture_for(model).blocks(model)


def test_every_parallel_family_case_is_matched() -> None:
    for case_id, case in CASES.items():
        assert architecture_for(case.build()).name == case.family, case_id
