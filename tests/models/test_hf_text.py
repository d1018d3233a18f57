"""The hf_llama (Llama, Mistral, Qwen2, Qwen3, Gemma v1), hf_gemma (Gemma 2, Gemma 3 text),
hf_phi3, hf_olmo2 and hf_moe (Mixtral, Qwen2-MoE) families beyond the shared contract:
plasticity in both protocols against an independent float64 computation from the state dict
(RMSNorm, rotary, grouped-query attention, causal and sliding softmax, SwiGLU / GeGLU, OLMo2's
post-branch norms, top-k routed experts and a gated shared expert), the per-layer context the
model's own forward gives (sliding windows, Gemma3's local and global rotary, Gemma's scaled
embedding), parameter groups, LoRA, the stages refused by name, and the transformers classes the
registry refuses by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.contract import check_composition, check_forward
from tests.helpers.numpy_reference import (
    check_against,
    embedding_protocol,
    norm_ratio,
    pair_ratios,
    softmax_rows,
)
from tests.helpers.tiny_models import HF_TEXT_TINY_CONFIG, TINY_MODELS, perturbed
from vitplasticity.models.architectures import (
    ParameterMap,
    UndefinedStage,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.models.architectures.hf_gemma import HFGemma
from vitplasticity.models.architectures.hf_text_common import additive_mask
from vitplasticity.plasticity.measure import measure

transformers = pytest.importorskip("transformers")

VOCAB = HF_TEXT_TINY_CONFIG["vocab_size"]
HF_TEXT_CASES = {
    case.id: case
    for case in TINY_MODELS
    if case.family in ("hf_llama", "hf_gemma", "hf_phi3", "hf_olmo2", "hf_moe")
}

# transformers computes RMSNorm (Llama: x.to(float32); Gemma: x.float()) and the rotary angles in
# float32 even in a float64 model: the model agrees with float64 numpy at float32 precision
# (measured: ~1e-7 relative), not at float64's.
RTOL = 1e-5


def tiny(case_id: str) -> torch.nn.Module:
    return perturbed(HF_TEXT_CASES[case_id].build())


def ids(n: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n, length), generator=generator)


# ---------------------------------------------------------------------------------------------
# An independent float64 computation from the state dict


class Direct:
    """One decoder LM written in numpy from its state dict and config, not from its modules."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.config = model.config
        self.gemma = "gemma" in self.config.model_type  # (1 + w) RMSNorm, scaled embedding
        self.sandwich = self.config.model_type in ("gemma2", "gemma3_text")  # post-norms
        self.olmo2 = self.config.model_type == "olmo2"  # post-branch norms only
        prefix = "model." if hasattr(model, "lm_head") else ""
        self.w = {
            k.removeprefix(prefix): v.detach().double().numpy()
            for k, v in model.state_dict().items()
        }
        c = self.config
        self.heads, self.kv_heads, self.d_h = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        if c.model_type == "phi3":  # fused projections: row blocks of one weight
            q_rows, kv_rows = self.heads * self.d_h, self.kv_heads * self.d_h
            self.split("self_attn.qkv", {"q": q_rows, "k": kv_rows, "v": kv_rows})
            self.split("mlp.gate_up", {"gate": c.intermediate_size, "up": c.intermediate_size})
        self.eps = c.rms_norm_eps
        self.scaling = (c.query_pre_attn_scalar if self.sandwich else self.d_h) ** -0.5
        self.softcap = getattr(c, "attn_logit_softcapping", None)
        theta = c.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.d_h, 2) / self.d_h)
        if c.model_type in ("mistral", "phi3", "mixtral"):
            self.windows = [c.sliding_window] * c.num_hidden_layers
        else:
            self.windows = [
                c.sliding_window if t == "sliding_attention" else None
                for t in getattr(c, "layer_types", ["full_attention"] * c.num_hidden_layers)
            ]

    def split(self, fused: str, rows: dict[str, int]) -> None:
        """Each layer's fused ``{fused}_proj`` weight as its row blocks, in order, named as
        the separate projections (``{part}_proj``)."""
        module, _, parts = fused.rpartition(".")
        for block in range(self.config.num_hidden_layers):
            prefix = f"layers.{block}.{module}"
            weight = self.w.pop(f"{prefix}.{parts}_proj.weight")
            assert len(weight) == sum(rows.values())
            bounds = np.cumsum([0, *rows.values()])
            for part, start, stop in zip(rows, bounds[:-1], bounds[1:], strict=True):
                self.w[f"{prefix}.{part}_proj.weight"] = weight[start:stop]

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        table = self.w["embed_tokens.weight"][token_ids]
        return table * np.sqrt(self.config.hidden_size) if self.gemma else table

    def rms(self, t: np.ndarray, weight: np.ndarray) -> np.ndarray:
        gain = 1.0 + weight if self.gemma else weight  # Gemma: (1 + weight)
        return t / np.sqrt((t**2).mean(axis=-1, keepdims=True) + self.eps) * gain

    def norm(self, b: str, name: str, t: np.ndarray) -> np.ndarray:
        return self.rms(t, self.w[f"{b}.{name}.weight"])

    def linear(self, b: str, name: str, t: np.ndarray) -> np.ndarray:
        out = t @ self.w[f"{b}.{name}.weight"].T
        bias = self.w.get(f"{b}.{name}.bias")
        return out if bias is None else out + bias

    def rotate(self, t: np.ndarray) -> np.ndarray:
        """Rotary embedding at positions 0..L-1, 'rotate half' layout."""
        angles = np.arange(len(t))[:, None] * self.inv_freq  # (L, d_h / 2)
        cos, sin = np.cos(np.hstack([angles, angles])), np.sin(np.hstack([angles, angles]))
        t1, t2 = np.split(t, 2, axis=-1)
        return t * cos + np.hstack([-t2, t1]) * sin

    def attention(self, block: int, x: np.ndarray) -> np.ndarray:
        b, length, d_h = f"layers.{block}", len(x), self.d_h
        q, k, v = (self.linear(b, f"self_attn.{p}_proj", x) for p in "qkv")
        if self.olmo2:  # q_norm / k_norm over all heads together, before the head split
            q, k = self.norm(b, "self_attn.q_norm", q), self.norm(b, "self_attn.k_norm", k)
        query, key = np.arange(length)[:, None], np.arange(length)[None, :]
        blocked = key > query
        if self.windows[block] is not None:
            blocked |= key <= query - self.windows[block]
        outputs = []
        for h in range(self.heads):
            g = h // (self.heads // self.kv_heads)  # grouped-query: the key/value head of h
            qh, kh = q[:, h * d_h : (h + 1) * d_h], k[:, g * d_h : (g + 1) * d_h]
            if f"{b}.self_attn.q_norm.weight" in self.w and not self.olmo2:  # Qwen3, Gemma3
                qh, kh = self.norm(b, "self_attn.q_norm", qh), self.norm(b, "self_attn.k_norm", kh)
            logits = self.rotate(qh) @ self.rotate(kh).T * self.scaling
            if self.softcap is not None:  # Gemma2
                logits = np.tanh(logits / self.softcap) * self.softcap
            weights = softmax_rows(np.where(blocked, -np.inf, logits))
            outputs.append(weights @ v[:, g * d_h : (g + 1) * d_h])
        return self.linear(b, "self_attn.o_proj", np.hstack(outputs))

    def act(self, u: np.ndarray) -> np.ndarray:
        if self.gemma:  # gelu_pytorch_tanh
            return 0.5 * u * (1 + np.tanh(np.sqrt(2 / np.pi) * (u + 0.044715 * u**3)))
        return u / (1 + np.exp(-u))  # silu

    def ln1_name(self) -> str:
        return "post_attention_layernorm" if self.olmo2 else "input_layernorm"

    # A sparse mixture of experts (Mixtral, Qwen2-MoE): FC1 is the picked experts' gate/up
    # (zeros for the others) then the shared expert's; FC2's input the routing-weighted expert
    # hiddens, FC2 the sum of every expert's down of its block (docs/protocol.md, section 3.1).

    def moe(self) -> bool:
        return self.config.model_type in ("mixtral", "qwen2_moe")

    def route(self, b: str, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per token, the k experts the router picks and their weights."""
        probs = softmax_rows(t @ self.w[f"{b}.mlp.gate.weight"].T)
        top = np.argsort(-probs, axis=1, kind="stable")[:, : self.config.num_experts_per_tok]
        weights = np.take_along_axis(probs, top, axis=1)
        if self.config.model_type == "mixtral" or self.config.norm_topk_prob:
            weights = weights / weights.sum(axis=1, keepdims=True)
        return top, weights

    def shared(self, b: str) -> bool:
        return f"{b}.mlp.shared_expert_gate.weight" in self.w

    def experts_fc1(self, b: str, t: np.ndarray) -> np.ndarray:
        gate_up = self.w[f"{b}.mlp.experts.gate_up_proj"]  # (E, 2I, d)
        out = np.zeros((len(t), *gate_up.shape[:2]))
        for token, picked in enumerate(self.route(b, t)[0]):
            for expert in picked:
                out[token, expert] = gate_up[expert] @ t[token]
        parts = [out.reshape(len(t), -1)]
        if self.shared(b):
            parts += [self.linear(b, f"mlp.shared_expert.{p}_proj", t) for p in ("gate", "up")]
        return np.hstack(parts)

    def experts_hidden(self, b: str, t: np.ndarray) -> np.ndarray:
        gate_up = self.w[f"{b}.mlp.experts.gate_up_proj"]
        experts, inner = gate_up.shape[0], gate_up.shape[1] // 2
        stage = self.experts_fc1(b, t)
        routed = stage[:, : experts * 2 * inner].reshape(len(t), experts, 2, inner)
        hidden = np.zeros((len(t), experts, inner))
        top, weights = self.route(b, t)
        for token in range(len(t)):
            for expert, weight in zip(top[token], weights[token], strict=True):
                gate, up = routed[token, expert]
                hidden[token, expert] = self.act(gate) * up * weight
        parts = [hidden.reshape(len(t), -1)]
        if self.shared(b):
            gate, up = np.split(stage[:, experts * 2 * inner :], 2, axis=1)
            scale = 1 / (1 + np.exp(-(t @ self.w[f"{b}.mlp.shared_expert_gate.weight"].T)))
            parts.append(self.act(gate) * up * scale)
        return np.hstack(parts)

    def experts_fc2(self, b: str, h: np.ndarray) -> np.ndarray:
        down = self.w[f"{b}.mlp.experts.down_proj"]  # (E, d, I)
        experts, _, inner = down.shape
        out = sum(h[:, e * inner : (e + 1) * inner] @ down[e].T for e in range(experts))
        if self.shared(b):
            out = out + self.linear(b, "mlp.shared_expert.down_proj", h[:, experts * inner :])
        return out

    def fc2_width(self, b: str) -> int:
        if not self.moe():
            return self.w[f"{b}.mlp.down_proj.weight"].shape[1]
        down = self.w[f"{b}.mlp.experts.down_proj"]
        shared = self.w.get(f"{b}.mlp.shared_expert.down_proj.weight")
        return down.shape[0] * down.shape[2] + (0 if shared is None else shared.shape[1])

    def ln2_name(self) -> str:
        if self.olmo2:
            return "post_feedforward_layernorm"
        return "pre_feedforward_layernorm" if self.sandwich else "post_attention_layernorm"

    def ratios(self, x: np.ndarray, y: np.ndarray, protocol: str, fc1_mode: str) -> dict:
        """Per (block, component): numerator and denominator of one pair of sequences."""
        found = {}
        ln1, ln2 = self.ln1_name(), self.ln2_name()
        for block in range(self.config.num_hidden_layers):
            b = f"layers.{block}"

            def fc1(t, b=b):
                if self.moe():
                    return self.experts_fc1(b, t)
                up = self.linear(b, "mlp.up_proj", t)
                return (
                    up if fc1_mode == "up" else np.hstack([self.linear(b, "mlp.gate_proj", t), up])
                )

            def hidden(t, b=b):
                if self.moe():
                    return self.experts_hidden(b, t)
                return self.act(self.linear(b, "mlp.gate_proj", t)) * self.linear(
                    b, "mlp.up_proj", t
                )

            def fc2(h, b=b):
                if self.moe():
                    return self.experts_fc2(b, h)
                return self.linear(b, "mlp.down_proj", h)

            def post(name, t, b=b):  # Gemma 2/3's sandwich post-norms
                return self.norm(b, name, t) if self.sandwich else t

            if protocol == "embedding":
                parts = embedding_protocol(
                    x,
                    y,
                    ln1=lambda t, b=b: self.norm(b, ln1, t),
                    mha=lambda t, i=block: self.attention(i, t),
                    ln2=lambda t, b=b: self.norm(b, ln2, t),
                    fc1=fc1,
                    fc2=fc2,
                    fc2_width=self.fc2_width(b),
                )
            elif self.olmo2:  # x1 = x + LN1(MHA(x)), x2 = x1 + LN2(FC2(act(FC1(x1))))
                ax, ay = self.attention(block, x), self.attention(block, y)
                parts = {
                    "mha": norm_ratio(lambda t, i=block: self.attention(i, t), x, y),
                    "ln1": norm_ratio(lambda t, b=b: self.norm(b, ln1, t), ax, ay),
                }
                rx, ry = x + self.norm(b, ln1, ax), y + self.norm(b, ln1, ay)
                parts["fc1"] = norm_ratio(fc1, rx, ry)
                hx, hy = hidden(rx), hidden(ry)
                parts["fc2"] = norm_ratio(lambda t, b=b: self.linear(b, "mlp.down_proj", t), hx, hy)
                dx, dy = self.linear(b, "mlp.down_proj", hx), self.linear(b, "mlp.down_proj", hy)
                parts["ln2"] = norm_ratio(lambda t, b=b: self.norm(b, ln2, t), dx, dy)
                x, y = rx + self.norm(b, ln2, dx), ry + self.norm(b, ln2, dy)
            else:
                parts = {"ln1": norm_ratio(lambda t, b=b: self.norm(b, "input_layernorm", t), x, y)}
                ux, uy = self.norm(b, "input_layernorm", x), self.norm(b, "input_layernorm", y)
                parts["mha"] = norm_ratio(lambda t, i=block: self.attention(i, t), ux, uy)
                rx = x + post("post_attention_layernorm", self.attention(block, ux))
                ry = y + post("post_attention_layernorm", self.attention(block, uy))
                parts["ln2"] = norm_ratio(lambda t, b=b: self.norm(b, ln2, t), rx, ry)
                vx, vy = self.norm(b, ln2, rx), self.norm(b, ln2, ry)
                parts["fc1"] = norm_ratio(fc1, vx, vy)
                hx, hy = hidden(vx), hidden(vy)
                parts["fc2"] = norm_ratio(fc2, hx, hy)
                x = rx + post("post_feedforward_layernorm", fc2(hx))
                y = ry + post("post_feedforward_layernorm", fc2(hy))
            for component, value in parts.items():
                found[(block, component)] = value
        return found


DIRECT_CASES = [
    "llama_causal_lm_tiny",  # grouped-query attention, q/k/v/o and MLP biases, a causal LM
    "mistral_tiny",  # a sliding window of 4 on every layer
    "qwen2_tiny",  # q/k/v biases, a sliding window on layer 1 only
    "qwen3_tiny",  # per-head q_norm / k_norm
    "gemma_tiny",  # (1 + w) RMSNorm, scaled embedding, GeGLU, Llama's layer (no post-norms)
    "gemma2_tiny",  # (1 + w) RMSNorm, scaled embedding, softcapped logits, sandwich norms
    "phi3_tiny",  # fused qkv_proj and gate_up_proj, a sliding window of 4 on every layer
    "olmo2_tiny",  # norms after each branch (LN1, LN2), none before; q/k_norm over all heads
    "mixtral_tiny",  # 4 routed experts wider than a token, top 2 renormalised
    "qwen2_moe_tiny",  # 4 experts narrower than a token, a gated shared expert, a window on layer 0
]


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
@pytest.mark.parametrize("case_id", DIRECT_CASES)
def test_plasticity_matches_a_direct_float64_computation(case_id: str, protocol: str) -> None:
    model = tiny(case_id)
    reference, downstream = ids(3, 10, seed=1), ids(2, 10, seed=2)  # downstream cycles
    frame = measure(model, reference, downstream, protocol=protocol, batch_size=2)
    check_against(
        frame, pair_ratios(Direct(model), reference, downstream, protocol, fc1_mode="stage"), RTOL
    )


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
def test_fc1_up_mode_is_the_up_projection_alone(protocol: str) -> None:
    model = tiny("llama_tiny")
    reference, downstream = ids(2, 8, seed=1), ids(2, 8, seed=2)
    frame = measure(model, reference, downstream, protocol=protocol, fc1="up")
    check_against(
        frame, pair_ratios(Direct(model), reference, downstream, protocol, fc1_mode="up"), RTOL
    )
    block = model.layers[0]
    assert architecture_for(model).components(block, fc1="up")["fc1"] == (block.mlp.up_proj,)


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
@pytest.mark.parametrize("case_id", sorted(HF_TEXT_CASES))
def test_plasticity_runs_on_every_tiny_model(case_id: str, protocol: str) -> None:
    model = tiny(case_id)
    frame = measure(model, ids(3, 12, seed=1), ids(3, 12, seed=2), protocol=protocol)
    assert frame.height == 2 * 5 * 3  # blocks x components x pairs
    assert np.isfinite(frame["ratio"].to_numpy()).all()


def test_sdpa_measures_what_eager_does() -> None:
    """The explicit masks make SDPA attention compute what eager does, sliding windows too."""
    case = HF_TEXT_CASES["qwen2_tiny"]
    frames = []
    for implementation in ("eager", "sdpa"):
        model = perturbed(case.build())
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        frames.append(measure(model, ids(2, 12, seed=1), ids(2, 12, seed=2), protocol="in_situ"))
    # eager takes its softmax in float32 even in a float64 model: float32-level agreement.
    np.testing.assert_allclose(frames[0]["ratio"], frames[1]["ratio"], rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# What every layer gets: masks, rotary tables, the embedding output


def test_each_layer_gets_the_window_its_config_gives() -> None:
    windows = {
        case_id: architecture_for(model := tiny(case_id)).windows(model)
        for case_id in (
            "llama_tiny",
            "mistral_tiny",
            "qwen2_tiny",
            "gemma_tiny",
            "gemma2_tiny",
            "gemma3_tiny",
            "phi3_tiny",
            "mixtral_tiny",
            "qwen2_moe_tiny",
        )
    }
    assert windows == {
        "llama_tiny": [None, None],
        "mistral_tiny": [4, 4],
        "qwen2_tiny": [None, 4],  # max_window_layers=1: layers from 1 on slide
        "gemma_tiny": [None, None],  # Gemma v1 never slides
        "gemma2_tiny": [4, None],  # Gemma2 alternates sliding and global layers
        "gemma3_tiny": [4, None],
        "phi3_tiny": [4, 4],  # Phi3 slides on every layer when sliding_window is set
        "mixtral_tiny": [None, None],  # Mixtral as Mistral, no sliding_window set
        "qwen2_moe_tiny": [4, None],  # Qwen2-MoE as Qwen2: max_window_layers=1
    }
    mask = additive_mask(6, 4, torch.zeros(1, dtype=torch.float64))[0, 0] == 0
    assert mask[5].tolist() == [False, False, True, True, True, True]  # 4 keys: itself + 3 back
    assert mask[2].tolist() == [True, True, True, False, False, False]  # causal


def test_gemma3_layers_get_their_local_or_global_rotary_table() -> None:
    model = tiny("gemma3_tiny")
    architecture = architecture_for(model)
    embedded = architecture.embed(model, ids(1, 12, seed=0))
    positions = torch.arange(12)[None]
    local = model.rotary_emb(embedded.tokens, positions, "sliding_attention")
    global_ = model.rotary_emb(embedded.tokens, positions, "full_attention")
    assert model.config.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert model.config.rope_parameters["full_attention"]["rope_theta"] == 1e6
    for found, wanted in zip(embedded.context.rotary, (local, global_), strict=True):
        torch.testing.assert_close(found, wanted, rtol=0, atol=0)
    assert not torch.allclose(local[0], global_[0])


def test_gemma_embedding_output_is_scaled_by_the_root_of_the_width() -> None:
    for case_id in ("gemma_tiny", "gemma2_tiny", "gemma3_tiny"):
        model = tiny(case_id)
        batch = ids(2, 5, seed=0)
        tokens = architecture_for(model).embed(model, batch).tokens
        expected = model.embed_tokens.weight[batch] * HF_TEXT_TINY_CONFIG["hidden_size"] ** 0.5
        # The model keeps sqrt(hidden) as a float32 buffer: float32-level agreement.
        torch.testing.assert_close(tokens, expected, rtol=1e-7, atol=0)
        assert not torch.allclose(tokens, model.embed_tokens.weight[batch])


def _broken(case_id: str, **methods):
    model = tiny(case_id)
    base = type(architecture_for(model))
    return type("Broken", (base,), methods)(), model, HF_TEXT_CASES[case_id].inputs(3)


@pytest.mark.parametrize(
    "case_id",
    ["mistral_tiny", "qwen2_tiny", "gemma2_tiny", "gemma3_tiny", "phi3_tiny", "qwen2_moe_tiny"],
)
def test_the_contract_sees_a_missing_sliding_window(case_id: str) -> None:
    architecture, model, inputs = _broken(
        case_id, windows=lambda self, model: [None] * model.config.num_hidden_layers
    )
    with pytest.raises(AssertionError):
        check_forward(architecture, model, inputs)


def test_the_contract_sees_a_wrong_gemma3_rotary_table() -> None:
    def global_everywhere(self, model, inputs):
        embedded = HFGemma.embed(self, model, inputs)
        context = embedded.context
        rotary = (context.rotary[1],) * len(context.rotary)  # layer 1 is the global one
        context = type(context)(context.positions, context.masks, rotary)
        return type(embedded)(embedded.tokens, context)

    architecture, model, inputs = _broken("gemma3_tiny", embed=global_everywhere)
    with pytest.raises(AssertionError):
        check_forward(architecture, model, inputs)


def test_token_batches_within_the_positions() -> None:
    model = tiny("llama_tiny")
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
        measure(model, ids(2, 17, seed=0), ids(2, 17, seed=1))


def test_mha_is_causal() -> None:
    """Changing the last token leaves every earlier token's attention output unchanged."""
    model = tiny("qwen3_tiny")
    architecture = architecture_for(model)
    first = ids(1, 8, seed=3)
    changed = first.clone()
    changed[0, -1] = (changed[0, -1] + 1) % VOCAB
    block = model.layers[0]
    with torch.no_grad():
        a = architecture.embedding_outputs(block, 0, architecture.embed(model, first))[1][0]
        b = architecture.embedding_outputs(block, 0, architecture.embed(model, changed))[1][0]
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0, atol=0)
    assert not torch.allclose(a[:, -1], b[:, -1])


# ---------------------------------------------------------------------------------------------
# Which parameters are whose, LoRA, stages


def _groups(model) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for name, owner in ParameterMap(architecture_for(model), model).owners.items():
        groups.setdefault(owner.group, set()).add(name)
    return groups


def test_llama_parameter_groups() -> None:
    groups = _groups(tiny("llama_tiny"))
    assert groups["emb"] == {"embed_tokens.weight"}
    assert groups["head"] == {"norm.weight"}
    assert groups["ln1"] == {f"layers.{i}.input_layernorm.weight" for i in range(2)}
    assert groups["ln2"] == {f"layers.{i}.post_attention_layernorm.weight" for i in range(2)}
    assert groups["fc1"] == {
        f"layers.{i}.mlp.{p}_proj.weight" for i in range(2) for p in ("gate", "up")
    }
    assert groups["fc2"] == {f"layers.{i}.mlp.down_proj.weight" for i in range(2)}
    qwen3 = _groups(tiny("qwen3_tiny"))
    assert "layers.0.self_attn.q_norm.weight" in qwen3["mha"]
    assert "layers.0.self_attn.k_norm.weight" in qwen3["mha"]


def test_gemma_v1_has_llamas_groups_and_no_post_norms() -> None:
    """Gemma v1's post_attention_layernorm is its LN2 (the norm before the MLP), not a
    post-branch norm as Gemma 2's is."""
    model = tiny("gemma_tiny")
    assert architecture_for(model).name == "hf_llama"
    groups = _groups(model)
    assert groups["ln2"] == {f"layers.{i}.post_attention_layernorm.weight" for i in range(2)}
    assert groups["emb"] == {"embed_tokens.weight"}
    assert groups["head"] == {"norm.weight"}
    assert architecture_for(model).declared(model) == []


def test_phi3_fused_projections_are_trained_and_adapted_whole() -> None:
    """q/k/v and gate/up are row blocks of one weight each: MHA owns ``qkv_proj`` and
    ``o_proj``, FC1 ``gate_up_proj``; LoRA adapts the fused weight; ``fc1: up`` is refused."""
    model = tiny("phi3_tiny")
    architecture = architecture_for(model)
    groups = _groups(model)
    assert groups["mha"] == {
        f"layers.{i}.self_attn.{p}_proj.weight" for i in range(2) for p in ("qkv", "o")
    }
    assert groups["ln1"] == {f"layers.{i}.input_layernorm.weight" for i in range(2)}
    assert groups["ln2"] == {f"layers.{i}.post_attention_layernorm.weight" for i in range(2)}
    assert groups["fc1"] == {f"layers.{i}.mlp.gate_up_proj.weight" for i in range(2)}
    assert groups["fc2"] == {f"layers.{i}.mlp.down_proj.weight" for i in range(2)}
    assert groups["emb"] == {"embed_tokens.weight"} and groups["head"] == {"norm.weight"}
    assert architecture.lora_targets(model) == [
        f"layers.{i}.self_attn.{p}_proj" for i in range(2) for p in ("o", "qkv")
    ]
    with pytest.raises(UnsupportedModel, match="fc1 mode 'up' needs separate gate and up"):
        measure(model, ids(2, 8, seed=1), ids(2, 8, seed=2), fc1="up")


def test_olmo2_ln1_and_ln2_are_the_norms_of_the_branch_outputs() -> None:
    """OLMo2 has no norm before a branch: LN1 is ``post_attention_layernorm`` (the attention
    branch's), LN2 ``post_feedforward_layernorm`` (the MLP's); ``q_norm``/``k_norm`` are MHA's;
    nothing is declared beside the components."""
    model = tiny("olmo2_tiny")
    architecture = architecture_for(model)
    assert architecture.name == "hf_olmo2"
    groups = _groups(model)
    assert groups["ln1"] == {f"layers.{i}.post_attention_layernorm.weight" for i in range(2)}
    assert groups["ln2"] == {f"layers.{i}.post_feedforward_layernorm.weight" for i in range(2)}
    assert groups["mha"] == {
        f"layers.{i}.self_attn.{p}.weight"
        for i in range(2)
        for p in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
    }
    assert groups["fc1"] == {
        f"layers.{i}.mlp.{p}_proj.weight" for i in range(2) for p in ("gate", "up")
    }
    assert groups["fc2"] == {f"layers.{i}.mlp.down_proj.weight" for i in range(2)}
    assert groups["emb"] == {"embed_tokens.weight"} and groups["head"] == {"norm.weight"}
    assert architecture.declared(model) == []
    assert architecture.windows(model) == [None, None]  # every layer causal, none slides


def test_the_contract_sees_olmo2s_norms_as_pre_norms() -> None:
    """Composed as a pre-norm layer (x + mha(ln1(x)), the default), OLMo2's mapped modules do
    not give its layer: the contract tells the conventions apart."""
    from vitplasticity.models.architectures.base import Architecture

    architecture, model, inputs = _broken("olmo2_tiny", compose_block=Architecture.compose_block)
    with pytest.raises(AssertionError):
        check_composition(architecture, model, inputs)


def test_an_olmo2_layer_with_a_norm_before_a_branch_is_refused() -> None:
    model = tiny("olmo2_tiny")
    model.layers[1].input_layernorm = torch.nn.Identity()
    with pytest.raises(UnsupportedModel, match=r"layer 1 .* norm before a branch"):
        architecture_for(model).blocks(model)


def test_gemma_post_norms_are_declared_with_the_component_they_normalise() -> None:
    model = tiny("gemma3_tiny")
    parameters = ParameterMap(architecture_for(model), model)
    owners = parameters.owners
    assert owners["layers.1.pre_feedforward_layernorm.weight"].group == "ln2"
    assert owners["layers.1.post_attention_layernorm.weight"].trained_by == "mha"
    assert owners["layers.1.post_feedforward_layernorm.weight"].trained_by == "fc2"
    assert owners["layers.1.post_feedforward_layernorm.weight"].block == 1
    assert "layers.0.post_attention_layernorm.weight" in parameters.trained_names("mha")
    assert "layers.0.post_feedforward_layernorm.weight" not in parameters.trained_names("mha")
    assert "layers.0.post_feedforward_layernorm.weight" in parameters.trained_names("fc2")
    assert parameters.group("layers.0.post_attention_layernorm.weight") == "mha"


def test_a_causal_lm_head_is_the_final_norm_and_an_untied_lm_head() -> None:
    untied = tiny("llama_causal_lm_tiny")
    assert not untied.config.tie_word_embeddings
    groups = _groups(untied)
    assert groups["head"] == {"model.norm.weight", "lm_head.weight"}
    assert groups["emb"] == {"model.embed_tokens.weight"}
    tied = transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(**HF_TEXT_TINY_CONFIG, sliding_window=4)
    )
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    groups = _groups(tied)
    assert groups["head"] == {"model.norm.weight"}  # the tied weight is the embedding's
    assert groups["emb"] == {"model.embed_tokens.weight"}


def test_lora_adapts_every_attention_projection() -> None:
    from vitplasticity.models.lora import apply_lora, check_adapters_used

    model = tiny("llama_causal_lm_tiny")
    architecture = architecture_for(model)
    assert architecture.lora_targets(model) == [
        f"model.layers.{i}.self_attn.{p}_proj" for i in range(2) for p in "qkvo"
    ]
    assert architecture.refusal("lora", model) is None
    model = apply_lora(model, rank=2, alpha=4.0)
    check_adapters_used(model, ids(2, 6, seed=0))
    trained = ParameterMap(architecture_for(model), model).trained_names("lora")
    assert {n for n in trained if "lora_" in n} == {
        f"model.layers.{i}.self_attn.{p}_proj.lora_{m}.default.weight"
        for i in range(2)
        for p in "qkvo"
        for m in "AB"
    }


@pytest.mark.parametrize(
    "case_id", ["llama_tiny", "gemma_tiny", "gemma2_tiny", "phi3_tiny", "olmo2_tiny"]
)
def test_stages_refused_by_name(case_id: str) -> None:
    model = tiny(case_id)
    architecture = architecture_for(model)
    assert architecture.refusal("plasticity", model) is None
    assert architecture.refusal("finetune", model) is None  # on text: finetune --text
    bounds = architecture.refusal("bounds", model)
    assert "RMSNorm does not centre" in bounds and "rotary positions" in bounds
    assert architecture.refusal("recommend", model) is None  # on text: recommend --text
    assert "rotary position embedding" in architecture.mha_bound_refusal(model)
    with pytest.raises(UndefinedStage, match="RMSNorm does not centre"):
        architecture.attention_weights(model.layers[0].self_attn)


def test_flash_or_flex_attention_and_bidirectional_gemma_are_refused() -> None:
    model = tiny("llama_tiny")
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(UnsupportedModel, match="attention_implementation 'flex_attention'"):
        architecture_for(model).blocks(model)
    config = transformers.Gemma3TextConfig(**HF_TEXT_TINY_CONFIG, use_bidirectional_attention=True)
    encoder = transformers.Gemma3TextModel(config)
    with pytest.raises(UnsupportedModel, match="attends bidirectionally"):
        architecture_for(encoder).blocks(encoder)


# ---------------------------------------------------------------------------------------------
# Classes refused by name: no LN1 / LN2 in the paper's sense (parallel blocks on one shared
# norm). GPT-NeoX and Falcon, parallel with a norm per branch: tests/models/test_hf_parallel.py

TINY = {"hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 3, "vocab_size": 64}

REFUSED_MODELS = {
    "GPTJModel": ("GPTJConfig", {"rotary_dim": 8}, "in parallel on one normed input"),
    "PhiModel": ("PhiConfig", {"intermediate_size": 96}, "in parallel on one normed input"),
}


@pytest.mark.parametrize("model_class", sorted(REFUSED_MODELS))
def test_parallel_models_are_refused_naming_class_and_reason(
    model_class: str,
) -> None:
    config_class, extra, reason = REFUSED_MODELS[model_class]
    config = getattr(transformers, config_class)(**TINY, **extra)
    model = getattr(transformers, model_class)(config)
    with pytest.raises(
        UnsupportedModel, match=rf"{model_class} \(.*\) is refused: .*{reason}"
    ) as e:
        architecture_for(model)
    assert "no LN1 and LN2 in the paper's sense" in str(e.value)


def test_an_unknown_decoder_names_the_known_families() -> None:
    config = transformers.GraniteConfig(**HF_TEXT_TINY_CONFIG)
    with pytest.raises(UnsupportedModel, match=r"GraniteModel .*known families: .*hf_llama"):
        architecture_for(transformers.GraniteModel(config))


def test_every_text_family_case_is_matched() -> None:
    for case_id, case in HF_TEXT_CASES.items():
        assert architecture_for(case.build()).name == case.family, case_id
