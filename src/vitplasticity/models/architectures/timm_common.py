"""What timm's transformer families share: their MLPs (plain, gated with split or packed
projections), their attention's per-head projections, and the top-level parts timm names
alike (``patch_embed``, ``cls_token``, ``norm``, ``head``...)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    Architecture,
    AttentionWeights,
    Declared,
    Owned,
    UndefinedStage,
    UnsupportedModel,
    check_fc1_mode,
)

EMBEDDING_MODULES: tuple[str, ...] = ("patch_embed", "norm_pre")
"""Top-level modules of the ``emb`` configuration where a timm model has them."""
EMBEDDING_TOKENS: tuple[str, ...] = ("cls_token", "reg_token", "pos_embed", "dist_token")
"""Top-level parameters of the ``emb`` configuration (extra tokens and positions)."""
HEAD_MODULES: tuple[str, ...] = ("norm", "fc_norm", "attn_pool", "head", "head_dist")
"""The final norm, pooling and classifier: trained by every configuration."""


def _present_modules(model: nn.Module, names: tuple[str, ...]) -> tuple[nn.Module, ...]:
    return tuple(
        module for name in names if isinstance(module := getattr(model, name, None), nn.Module)
    )


def timm_embedding(model: nn.Module) -> Owned:
    """patch_embed (and norm_pre where it has parameters, CLIP's ln_pre), cls/register/
    distillation tokens and the absolute position embedding."""
    tokens = tuple(
        p for name in EMBEDDING_TOKENS if isinstance(p := getattr(model, name, None), nn.Parameter)
    )
    return Owned(_present_modules(model, EMBEDDING_MODULES), tokens)


def timm_head(model: nn.Module) -> Owned:
    """The final norm(s), attention pooling (SigLIP's MAP head) and the classifier."""
    return Owned(_present_modules(model, HEAD_MODULES))


def is_gated_split(mlp: nn.Module) -> bool:
    """timm ``SwiGLU``: separate gate ``fc1_g`` and up ``fc1_x`` projections."""
    return isinstance(getattr(mlp, "fc1_g", None), nn.Linear) and isinstance(
        getattr(mlp, "fc1_x", None), nn.Linear
    )


def is_gated_packed(mlp: nn.Module) -> bool:
    """timm ``GluMlp`` (SwiGLUPacked): gate and up projections packed in one ``fc1``."""
    return type(mlp).__name__ == "GluMlp"


def mlp_fc1(mlp: nn.Module, mode: str) -> tuple[nn.Module, ...]:
    """FC1 of a timm MLP: its first linear stage (``stage``), or the up projection alone
    (``up``; a gated MLP with split projections only).

    Raises:
        UnsupportedModel: for an MLP that is neither plain nor gated, or ``up`` on a packed
            gated MLP (its up projection is half of one Linear, not a module).
    """
    check_fc1_mode(mode)
    if is_gated_split(mlp):
        return (mlp.fc1_g, mlp.fc1_x) if mode == "stage" else (mlp.fc1_x,)
    fc1 = getattr(mlp, "fc1", None)
    if not isinstance(fc1, nn.Linear) or not isinstance(getattr(mlp, "fc2", None), nn.Linear):
        raise UnsupportedModel(
            f"{type(mlp).__name__} MLP: expected Linear fc1 (or fc1_g + fc1_x) and fc2"
        )
    if mode == "up" and is_gated_packed(mlp):
        raise UnsupportedModel(
            "fc1 mode 'up' needs separate gate and up projections; this GluMlp packs both in "
            "one Linear (use fc1 mode 'stage')"
        )
    return (fc1,)


def mlp_from_parts(
    mlp: nn.Module, fc1: tuple[nn.Module, ...], fc2: nn.Module, x: torch.Tensor
) -> torch.Tensor:
    """The MLP's forward pass from its mapped fc1 (stage) and fc2, and its own activation,
    dropout and inner norm: what timm's Mlp, GluMlp and SwiGLU compute."""
    if is_gated_split(mlp):
        gate, up = fc1
        hidden = mlp.act(gate(x)) * up(x)
    elif is_gated_packed(mlp):
        (linear,) = fc1
        x1, x2 = linear(x).chunk(2, dim=-1)
        hidden = x1 * mlp.act(x2) if mlp.gate_last else mlp.act(x1) * x2
    else:
        (linear,) = fc1
        hidden = mlp.act(linear(x))
    return mlp.drop2(fc2(mlp.norm(mlp.drop1(hidden))))


def mlp_norm_declared(block: nn.Module, index: int) -> list[Declared]:
    """A norm inside the MLP between fc1 and fc2 (EVA-02's scale_mlp): trained with FC2,
    whose input it normalises."""
    norm = getattr(block.mlp, "norm", None)
    if norm is None or not any(True for _ in norm.parameters()):
        return []
    return [Declared("mlp_norm", "fc2", Owned((norm,)), index)]


def fused_attention_weights(attention: nn.Module) -> AttentionWeights:
    """Q, K, V from a fused ``qkv`` Linear (q, k, v stacked along rows) or from separate
    ``q_proj``/``k_proj``/``v_proj``, and O from ``proj``.

    Raises:
        UndefinedStage: when the attention normalises q and k, normalises its output before
            ``proj`` or gates it: the paper's bound is stated for softmax(x A x^T) V alone.
    """
    for name in ("q_norm", "k_norm", "norm"):
        module = getattr(attention, name, None)
        if module is not None and not isinstance(module, nn.Identity):
            raise UndefinedStage(
                f"{type(attention).__name__}.{name} is {type(module).__name__}: the paper's MHA "
                "bound is stated for attention without normalised queries, keys or outputs"
            )
    if getattr(attention, "gate", None) is not None:
        raise UndefinedStage(
            f"{type(attention).__name__} gates its output: the paper's MHA bound does not cover it"
        )
    if isinstance(getattr(attention, "qkv", None), nn.Linear):
        qkv = attention.qkv.weight
        query, key, value = qkv.split(qkv.shape[0] // 3)
    else:
        query, key, value = (
            attention.q_proj.weight,
            attention.k_proj.weight,
            attention.v_proj.weight,
        )
    return AttentionWeights(query, key, value, attention.proj.weight, attention.num_heads)


def call_qkv_for_lora(blocks: Sequence[nn.Module]) -> None:
    """timm's Eva and Beit attention with separate q/v biases computes ``F.linear(x,
    qkv.weight, cat(q_bias, k_bias, v_bias))``, reading qkv's weight itself: a LoRA wrapper
    around ``qkv`` would never be called. ``qkv_bias_separate`` makes it call ``qkv(x)`` and
    add the biases after (the same map; rounding may differ in the last bit), so the adapter
    is on the forward path."""
    for block in blocks:
        attention = block.attn
        if getattr(attention, "q_bias", None) is not None and hasattr(
            attention, "qkv_bias_separate"
        ):
            attention.qkv_bias_separate = True


class TimmPreNormFamily(Architecture):
    """What timm's pre-norm families (VisionTransformer, Eva, Beit) share: blocks
    ``blocks.N`` of one class computing ``x + s1(attn(norm1(x)))`` then ``x +
    s2(mlp(norm2(x)))``, s1 and s2 the family's LayerScale (or none: its attention_branch and
    mlp_branch). LN1 is ``norm1``, MHA
    ``attn`` (all of it), LN2 ``norm2``, FC1 the MLP's first linear stage, FC2 ``mlp.fc2``; the
    embedding and head are the top-level parts timm names alike."""

    model_class: tuple[str, str] = ("", "")
    """(module, class) of the family's models."""
    block_class: tuple[str, str] = ("", "")
    """(module, class) of its blocks: any other block is refused."""
    block_description: str = ""
    """What such a block is, for the refusal of another one."""

    @staticmethod
    def _load(where: tuple[str, str]) -> type:
        module, name = where
        return getattr(importlib.import_module(module), name)

    def matches(self, model: nn.Module) -> bool:
        return isinstance(model, self._load(self.model_class))

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(getattr(model, "blocks", []))

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        if type(block) is not self._load(self.block_class):
            raise UnsupportedModel(
                f"block {index} of {type(model).__name__} is a {type(block).__name__}, not "
                f"{self.block_description}"
            )
        super().check_block(block, index, model)

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        return {
            "ln1": (block.norm1,),
            "mha": (block.attn,),
            "ln2": (block.norm2,),
            "fc1": mlp_fc1(block.mlp, fc1),
            "fc2": (block.mlp.fc2,),
        }

    def embedding(self, model: nn.Module) -> Owned:
        return timm_embedding(model)

    def head(self, model: nn.Module) -> Owned:
        return timm_head(model)

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        (linear,) = fc2
        return mlp_from_parts(block.mlp, fc1, linear, x)

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        return fused_attention_weights(attention)


class TimmGammaFamily(TimmPreNormFamily):
    """timm's Eva and Beit: LayerScale as the block's own parameters ``gamma_1``/``gamma_2``
    (absent without LayerScale), q and v biases beside a bias-free ``qkv``."""

    def declared(self, model: nn.Module) -> list[Declared]:
        found = []
        for index, block in enumerate(self.block_list(model)):
            for attribute, label, trained_by in (
                ("gamma_1", "layer_scale_attn", "mha"),
                ("gamma_2", "layer_scale_mlp", "fc2"),
            ):
                gamma = getattr(block, attribute, None)
                if isinstance(gamma, nn.Parameter):
                    found.append(Declared(label, trained_by, Owned(parameters=(gamma,)), index))
            found += mlp_norm_declared(block, index)
        return found

    def attention_branch(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x if block.gamma_1 is None else block.gamma_1 * x

    def mlp_branch(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x if block.gamma_2 is None else block.gamma_2 * x

    def prepare_lora(self, model: nn.Module) -> None:
        call_qkv_for_lora(self.block_list(model))
