"""transformers ``MixtralModel`` and ``Qwen2MoeModel`` (and their task classes,
``XForCausalLM``, ``XForSequenceClassification``...): decoders whose MLP is a sparse mixture of
experts (docs/protocol.md, section 3.1).

A layer is Llama's, ``x + self_attn(input_layernorm(x))`` then ``x + moe(v)`` with ``v =
post_attention_layernorm(x)``, where the MoE routes each token to its top-k experts
(``mlp.gate``: softmax over the router logits, top k, Mixtral renormalises the k weights, Qwen2-MoE
when ``norm_topk_prob``) and sums ``w_e down_e(act(gate_e(v)) * up_e(v))`` over them; Qwen2-MoE
adds an always-on shared expert, ``sigmoid(shared_expert_gate(v)) * shared_expert(v)``.
transformers stores every expert's weights fused as two 3-D parameters, ``experts.gate_up_proj``
(E, 2I, d: gate rows then up rows) and ``experts.down_proj`` (E, d, I).

LN1 is ``input_layernorm``, MHA ``self_attn``, LN2 ``post_attention_layernorm``. FC1 is every
expert's gate/up matrices (``experts.gate_up_proj``, and the shared expert's ``gate_proj`` and
``up_proj``), FC2 every expert's down matrices (``experts.down_proj``, and the shared expert's
``down_proj``). Neither is a module of the model, so both are views
(:class:`RoutedFC1`, :class:`RoutedFC2`) holding those parameters and applying the routed
computation:

- FC1 of a token v is the concatenation, expert by expert (then the shared expert), of
  ``gate_up_e(v)`` for the experts the router picks for v and zeros for the others: the MLP's
  first linear stage, without its activation, as the token runs it.
- FC2 takes the concatenation of the routing-weighted expert hiddens ``w_e (act(gate_e) * up_e)``
  (zeros for experts not picked; the shared expert's hidden times its sigmoid gate), and is one
  linear map of it, ``[down_1 | ... | down_E | down_shared]``: the MoE's output. The weights
  commute with the linear ``down_e``: the model applies them after it, the view before, which is
  the same output and makes FC2 one fixed linear map of its input.

The router (``mlp.gate``, and Qwen2-MoE's ``shared_expert_gate``) is its own declared part
``router``, trained by ``full`` only: it is neither the paper's FC1 (it feeds no expert's
hidden units) nor FC2, and a single-component configuration that silently trained it would
change which experts run. In the embedding protocol FC1 routes the embedding output by the same
router (FC1 is fed x, so it picks x's experts), and FC2 is fed x zero-padded to its input
width: x fills the concatenated expert hiddens from expert 0 on (it spans several experts when
one is narrower than the token, which a top-k MoE also feeds FC2). The in-situ protocol runs each
layer through its mapped pieces (:meth:`HFMoE.in_situ_block`), so the views' hooks see what
reaches FC1 and FC2; the contract checks that this composition is the layer's own forward.

recommend ranks them as any decoder (its criteria of views: the weight statistic of FC1 is
that of the map with every expert picked, :meth:`RoutedFC1.as_linear`; Spectrum SNR and kappa
score each expert's matrix; NFN, of linear layers the forward pass calls, is n/a for FC1 and
FC2) and exports the fused experts as PEFT ``target_parameters``
(:mod:`vitplasticity.recommend.export`). Refused: ``plasticity.fc1: up`` (up is half of each
expert's fused ``gate_up_proj``), the bounds (RMSNorm, rotary positions). A Qwen2-MoE with
dense layers (``mlp_only_layers``,
``decoder_sparse_step`` > 1) is refused. Context: :mod:`~vitplasticity.models.architectures.hf_decoder`.
"""

from __future__ import annotations

import weakref
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.models.architectures.base import (
    Declared,
    Embedded,
    Owned,
    Parts,
    UnsupportedModel,
    check_fc1_mode,
    padded_linear,
)
from vitplasticity.models.architectures.hf_decoder import HFDecoder, Variant


def _shared_linears(moe: nn.Module, names: tuple[str, ...]) -> list[nn.Module]:
    shared = getattr(moe, "shared_expert", None)
    return [] if shared is None else [getattr(shared, name) for name in names]


def route(moe: nn.Module, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which experts the MoE's own router picks for each token of ``v`` (..., d), and their
    weights: (T, E) boolean and (T, E) in ``v``'s dtype (zero where not picked)."""
    flat = v.reshape(-1, v.shape[-1])
    _, weights, indices = moe.gate(flat)  # (logits, top-k weights, top-k indices)
    experts = moe.experts.num_experts
    picked = torch.zeros(len(flat), experts, dtype=torch.bool, device=v.device)
    picked.scatter_(1, indices, True)
    dense = torch.zeros(len(flat), experts, dtype=v.dtype, device=v.device)
    return picked, dense.scatter(1, indices, weights.to(v.dtype))


class _View(nn.Module):
    """A component that no module of the model is: it holds the model's own parameters (the
    same ``nn.Parameter`` objects, so ownership and training are by identity) but not the
    modules around them, and is never attached to the model."""

    def __init__(self, moe: nn.Module) -> None:
        super().__init__()
        # A weak reference, not a submodule: the MoE's other parameters are not the view's,
        # and a view kept by the architecture must not keep a model alive.
        self._moe = weakref.ref(moe)
        self.refresh()

    @property
    def moe(self) -> nn.Module:
        moe = self._moe()
        if moe is None:
            raise RuntimeError("the MoE this view reads is gone")
        return moe

    def held(self) -> dict[str, nn.Parameter | None]:
        raise NotImplementedError

    def refresh(self) -> None:
        """Hold the MoE's current parameters (one replaced since is held again)."""
        self._parameters.clear()
        for name, parameter in self.held().items():
            if parameter is not None:
                self.register_parameter(name, parameter)


class RoutedFC1(_View):
    """FC1 of a sparse MoE: per token, ``gate_up_e(v)`` of each expert its router picks (zeros
    for the others), expert by expert, then the shared expert's ``[gate(v) | up(v)]``."""

    def held(self) -> dict[str, nn.Parameter | None]:
        gate, up = _shared_linears(self.moe, ("gate_proj", "up_proj"))[:2] or (None, None)
        return {
            "gate_up_proj": self.moe.experts.gate_up_proj,
            "shared_gate_proj": None if gate is None else gate.weight,
            "shared_gate_bias": None if gate is None else gate.bias,
            "shared_up_proj": None if up is None else up.weight,
            "shared_up_bias": None if up is None else up.bias,
        }

    def as_linear(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The map with every expert picked, as one (E * 2I [+ 2 I_shared], d) matrix, and its
        bias (zeros for the routed experts, which have none; None when the shared expert has
        none either). Routing keeps some of its rows and zeros the others, so
        ``||FC1(v)|| <= ||W||_2 ||v||`` for every token: its largest singular value is FC1's
        weight factor (:func:`vitplasticity.recommend.criteria.weight_statistics`)."""
        fused = self.moe.experts.gate_up_proj  # (E, 2I, d)
        shared = _shared_linears(self.moe, ("gate_proj", "up_proj"))
        weight = torch.cat([fused.flatten(0, 1), *(linear.weight for linear in shared)])
        if all(linear.bias is None for linear in shared):
            return weight, None
        biases = [fused.new_zeros(fused.shape[0] * fused.shape[1])]
        biases += [
            linear.weight.new_zeros(len(linear.weight)) if linear.bias is None else linear.bias
            for linear in shared
        ]
        return weight, torch.cat(biases)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., E * 2I [+ 2 I_shared]), the experts picked by the MoE's router."""
        picked, _ = route(self.moe, v)
        flat = v.reshape(-1, v.shape[-1])
        weight = self.moe.experts.gate_up_proj  # (E, 2I, d)
        out = flat.new_zeros(len(flat), weight.shape[0], weight.shape[1])
        for expert in range(weight.shape[0]):
            tokens = picked[:, expert].nonzero().squeeze(-1)
            if len(tokens):  # the experts a token is not routed to never run on it
                out[tokens, expert] = F.linear(flat[tokens], weight[expert])
        parts = [out.flatten(1)]
        for linear in _shared_linears(self.moe, ("gate_proj", "up_proj")):
            parts.append(F.linear(flat, linear.weight, linear.bias))
        return torch.cat(parts, dim=-1).reshape(*v.shape[:-1], -1)


class RoutedFC2(_View):
    """FC2 of a sparse MoE: the one linear map ``[down_1 | ... | down_E | down_shared]`` of the
    concatenated routing-weighted expert hiddens."""

    def held(self) -> dict[str, nn.Parameter | None]:
        (down,) = _shared_linears(self.moe, ("down_proj",)) or (None,)
        return {
            "down_proj": self.moe.experts.down_proj,
            "shared_down_proj": None if down is None else down.weight,
            "shared_down_bias": None if down is None else down.bias,
        }

    def as_linear(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The map as one (d, E * I [+ I_shared]) matrix, and its bias (the shared expert's)."""
        down = self.moe.experts.down_proj  # (E, d, I)
        blocks = [down.permute(1, 0, 2).flatten(1)]
        bias = None
        for linear in _shared_linears(self.moe, ("down_proj",)):
            blocks.append(linear.weight)
            bias = linear.bias
        return torch.cat(blocks, dim=1), bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., E * I [+ I_shared]) -> (..., d). Each expert runs on the tokens whose block of
        ``hidden`` is not zero (a zero block adds nothing), as the model runs the picked ones."""
        down = self.moe.experts.down_proj  # (E, d, I)
        experts, width, inner = down.shape
        flat = hidden.reshape(-1, hidden.shape[-1])
        routed = flat[:, : experts * inner].reshape(len(flat), experts, inner)
        out = flat.new_zeros(len(flat), width)
        for expert in range(experts):
            tokens = routed[:, expert].ne(0).any(-1).nonzero().squeeze(-1)
            if len(tokens):
                out.index_add_(0, tokens, F.linear(routed[tokens, expert], down[expert]))
        for linear in _shared_linears(self.moe, ("down_proj",)):
            out = out + F.linear(flat[:, experts * inner :], linear.weight, linear.bias)
        return out.reshape(*hidden.shape[:-1], width)


class HFMoE(HFDecoder):
    """transformers Mixtral and Qwen2-MoE: Llama's layer with a sparse mixture-of-experts MLP,
    its experts fused in 3-D parameters; FC1 and FC2 are routed views of them."""

    name = "hf_moe"
    title = "transformers MixtralModel / Qwen2MoeModel"
    model_types = ("mixtral", "qwen2_moe")
    variants: ClassVar[dict[str, Variant]] = {
        "MixtralModel": Variant(windows="config"),
        "Qwen2MoeModel": Variant(windows="layer_types"),
    }
    ln2_name = "post_attention_layernorm"
    activation = "act_fn"

    def __init__(self) -> None:
        # One pair of views per MoE, so that the module a hook is put on is the one the layer
        # runs; weak keys: a model's views go with it.
        self._views: weakref.WeakKeyDictionary[nn.Module, tuple[RoutedFC1, RoutedFC2]] = (
            weakref.WeakKeyDictionary()
        )

    def views(self, block: nn.Module) -> tuple[RoutedFC1, RoutedFC2]:
        """The layer's FC1 and FC2 views, holding its MoE's current parameters."""
        moe = block.mlp
        found = self._views.get(moe)
        if found is None:
            found = self._views[moe] = (RoutedFC1(moe), RoutedFC2(moe))
        for view in found:
            view.refresh()
        return found

    # --- what it is ---------------------------------------------------------------------------

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        layer = f"layer {index} ({type(block).__name__}) of {type(model).__name__}"
        wanted = [
            "input_layernorm",
            self.ln2_name,
            "self_attn",
            *(f"self_attn.{name}" for name in self.attention_linears),
            "mlp.gate",
            "mlp.experts",
        ]
        modules = dict(block.named_modules())
        missing = [name for name in wanted if name not in modules]
        if missing:
            dense = "mlp.experts" in missing and "mlp.down_proj" in modules
            why = " (a dense MLP layer: mlp_only_layers or decoder_sparse_step)" if dense else ""
            raise UnsupportedModel(f"{layer} is not a {self.title} layer: it lacks {missing}{why}")
        experts = block.mlp.experts
        shapes = {
            "gate_up_proj": getattr(getattr(experts, "gate_up_proj", None), "ndim", None),
            "down_proj": getattr(getattr(experts, "down_proj", None), "ndim", None),
        }
        if shapes != {"gate_up_proj": 3, "down_proj": 3} or not hasattr(experts, "act_fn"):
            raise UnsupportedModel(
                f"{layer}: expected mlp.experts with 3-D gate_up_proj and down_proj and an "
                f"act_fn, found {shapes}"
            )
        expected = {"gate", "experts"} | (
            {"shared_expert", "shared_expert_gate"}
            if hasattr(block.mlp, "shared_expert")
            else set()
        )
        extra = {name for name, _ in block.mlp.named_children()} - expected
        if extra or set(dict(experts.named_parameters())) != {"gate_up_proj", "down_proj"}:
            raise UnsupportedModel(
                f"{layer}: its MoE holds {sorted(extra) or dict(experts.named_parameters())} "
                "beyond the router, the experts and a shared expert"
            )
        super(HFDecoder, self).check_block(block, index, model)

    # --- which parameters are whose -----------------------------------------------------------

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        if check_fc1_mode(fc1) == "up":
            raise UnsupportedModel(
                f"fc1 mode 'up' needs separate gate and up projections; {self.title} packs both "
                "in each expert's experts.gate_up_proj"
            )
        fc1_view, fc2_view = self.views(block)
        return {
            "ln1": (block.input_layernorm,),
            "mha": (block.self_attn,),
            "ln2": (block.post_attention_layernorm,),
            "fc1": (fc1_view,),
            "fc2": (fc2_view,),
        }

    def declared(self, model: nn.Module) -> list[Declared]:
        """Each layer's router (``mlp.gate``; Qwen2-MoE's ``shared_expert_gate`` too), trained
        by ``full`` alone: it is neither FC1 nor FC2 (it feeds no expert's hidden units)."""
        found = []
        for index, block in enumerate(self.block_list(model)):
            routers = [block.mlp.gate]
            if hasattr(block.mlp, "shared_expert_gate"):
                routers.append(block.mlp.shared_expert_gate)
            found.append(Declared("router", "full", Owned(tuple(routers)), block=index))
        return found

    # --- how it runs --------------------------------------------------------------------------

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        v: torch.Tensor,
    ) -> torch.Tensor:
        """The MoE from its mapped stages: the router picks and weighs each token's experts,
        FC1 gives their ``[gate | up]``, ``act(gate) * up`` times the routing weight is FC2's
        input (the shared expert's hidden times its sigmoid gate after them)."""
        moe = block.mlp
        _, weights = route(moe, v)  # FC1 routes v by the same router, to the same experts
        (first,), (second,) = fc1, fc2
        stage = first(v)
        experts, inner = moe.experts.num_experts, moe.experts.down_proj.shape[-1]
        flat = stage.reshape(len(weights), -1)
        routed = flat[:, : experts * 2 * inner].reshape(len(flat), experts, 2, inner)
        hidden = [(moe.experts.act_fn(routed[:, :, 0]) * routed[:, :, 1] * weights[..., None])]
        if hasattr(moe, "shared_expert"):
            gate, up = flat[:, experts * 2 * inner :].chunk(2, dim=-1)
            scale = torch.sigmoid(moe.shared_expert_gate(v.reshape(len(flat), -1)))
            hidden.append((moe.shared_expert.act_fn(gate) * up * scale)[:, None])
        joined = torch.cat([h.flatten(1) for h in hidden], dim=-1)
        return second(joined.reshape(*v.shape[:-1], -1))

    def in_situ_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        """The layer through its mapped pieces (norms, attention, router, the FC1 and FC2
        views), so that the in-situ hooks on the views see what reaches FC1 and FC2; the
        contract checks this composition against the layer's own forward
        (:meth:`run_block`)."""
        return self.compose_block(block, self.components(block), tokens, embedded, index)

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded, fc1: str = "stage"
    ) -> tuple[Parts, ...]:
        """As a decoder's, FC1 routing x by the layer's router, FC2 fed x zero-padded to its
        input width (the concatenated expert hiddens, from expert 0 on)."""
        tokens = embedded.tokens
        parts = self.components(block, fc1)
        (ln1,), (mha,), (ln2,), (fc1_view,), (fc2_view,) = (parts[c] for c in parts)
        return (
            (ln1(tokens),),
            (self.attend(mha, tokens, embedded, index),),
            (ln2(tokens),),
            (fc1_view(tokens),),
            (padded_linear(fc2_view, tokens),),
        )
