"""timm ``Eva``: EVA-02, DINOv3 in every size (plain, SwiGLU and ``qkvb`` variants), and the
rope ViTs (``vit_*_rope_*``).

A block is ``x + gamma_1 * attn(norm1(x), rope)`` then ``x + gamma_2 * mlp(norm2(x))``
(``gamma_*`` absent without LayerScale). Positions enter through the rotary embedding that
``Eva._pos_embed`` returns beside the tokens (one for every block, or one per block for the
``mixed`` rope type) and that each block's attention applies to q and k: MHA is ``attn(x,
rope)``, the attention of x *at those positions*, without norm1, LayerScale or residual. The
MLP is plain (``fc1``), gated with split projections (SwiGLU ``fc1_g``/``fc1_x``: DINOv3 S+,
H+, 7B) or gated and packed (GluMlp ``fc1``: EVA-02). For a gated MLP, FC1 is its first linear
stage (gate and up together; docs/protocol.md); the fc1 mode ``up`` takes the up projection
alone, as the reference code's DINOv3 ablation did. ``gamma_1`` is trained with MHA and
``gamma_2`` with FC2, as timm ViT's LayerScale; the queries' and values' biases
(``attn.q_bias``, ``attn.v_bias``) are MHA's, and so are learned rotary frequencies (the
``mixed`` rope type's ``rope.freqs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitplasticity.models.architectures.base import Declared, Embedded, Owned
from vitplasticity.models.architectures.timm_common import TimmGammaFamily


@dataclass(frozen=True)
class Rope:
    """The rotary embedding a forward pass hands its blocks: one tensor for every block, or
    (``per_block``) one per block along the first axis."""

    embedding: torch.Tensor | None
    per_block: bool

    def of_block(self, index: int) -> torch.Tensor | None:
        """What block ``index`` receives."""
        if self.embedding is None or not self.per_block:
            return self.embedding
        return self.embedding[index]


class TimmEva(TimmGammaFamily):
    """timm ``Eva`` with pre-norm ``EvaBlock``s and rotary (or absolute) positions."""

    name = "timm_eva"
    title = "timm Eva (EVA-02, DINOv3, rope ViT)"
    model_class = ("timm.models.eva", "Eva")
    block_class = ("timm.models.eva", "EvaBlock")
    block_description = (
        "a pre-norm EvaBlock (a post-norm block has no LN1/LN2 in the paper's sense)"
    )

    def declared(self, model: nn.Module) -> list[Declared]:
        found = super().declared(model)
        rope = getattr(model, "rope", None)
        if isinstance(rope, nn.Module) and any(True for _ in rope.parameters()):
            # Learned rotary frequencies (rope type "mixed"): terms of every block's attention
            # logits, as BEiT's shared relative position bias.
            found.append(Declared("rotary_frequencies", "mha", Owned((rope,))))
        return found

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # Patch tokens, then cls and register tokens prepended and the absolute position
        # embedding added where the model has one (DINOv3 has none); the rotary embedding of
        # the patch grid comes back beside them. norm_pre is an identity in DINOv3.
        tokens, rope = model._pos_embed(model.patch_embed(inputs))
        per_block = bool(getattr(model, "rope_mixed", False)) and rope is not None
        return Embedded(model.norm_pre(tokens), Rope(rope, per_block))

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, rope=embedded.context.of_block(index))

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        return block(tokens, rope=embedded.context.of_block(index))

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        if getattr(model, "rope", None) is not None:
            return (
                f"{type(model).__name__} rotates queries and keys by their positions (rotary "
                "position embedding): the paper's MHA bound is stated for softmax(x A x^T) "
                "without rotary positions"
            )
        return None
