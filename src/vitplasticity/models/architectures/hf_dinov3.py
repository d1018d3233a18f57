"""transformers ``DINOv3ViTModel`` (docs/protocol.md, section 3.1), and the classification
class transformers lacks for it (:class:`DINOv3ViTClassifier`).

Its blocks are DINOv2's layer-scaled pre-norm blocks (``model.layer``; ``norm1``,
``attention``, ``norm2``; ``mlp.up_proj``, gated: ``mlp.gate_proj`` + ``mlp.up_proj``;
``mlp.down_proj``: :mod:`vitplasticity.models.architectures.hf_vision`), its positions rotary:
its embedding hands every block the (cos, sin) of the patch grid.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import Embedded
from vitplasticity.models.architectures.hf_vision import LayerScaled


class DINOv3ViTClassifier(nn.Module):
    """A ``DINOv3ViTModel`` with a linear classifier (transformers 5 has no
    DINOv3ViTForImageClassification): the smallest wrapper that pools as
    ``Dinov2ForImageClassification`` does.

    Pooling: the concatenation of the cls token and the mean of the patch tokens (the register
    tokens left out) of the tower's ``last_hidden_state`` (after its final ``norm``), so the
    classifier takes 2 x hidden_size features.
    """

    def __init__(self, dinov3: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.dinov3 = dinov3
        width = 2 * dinov3.config.hidden_size
        self.classifier = nn.Linear(width, num_classes, device="meta")  # drawn by the builder

    def forward(self, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        """The classifier's logits of ``pixel_values`` (B, 3, H, W), in an
        ``ImageClassifierOutput`` as transformers' classification classes return them."""
        from transformers.modeling_outputs import ImageClassifierOutput

        outputs = self.dinov3(pixel_values, **kwargs)
        tokens = outputs.last_hidden_state  # (B, 1 + registers + patches, d)
        patches = tokens[:, 1 + self.dinov3.config.num_register_tokens :]
        logits = self.classifier(torch.cat([tokens[:, 0], patches.mean(dim=1)], dim=1))
        return ImageClassifierOutput(
            logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class HFDinov3(LayerScaled):
    """transformers ``DINOv3ViTModel`` (and :class:`DINOv3ViTClassifier`,
    its classifier: cls token and mean patch token, as DINOv2's): rotary positions, register
    tokens, plain or gated MLP."""

    name = "hf_dinov3"
    title = "transformers DINOv3ViTModel"
    towers = (("DINOv3ViTModel", ""), ("DINOv3ViTClassifier", "dinov3"))
    layer_classes = ("DINOv3ViTLayer",)
    blocks_at = "model.layer"
    head_parts = ("norm",)
    model_types = ("dinov3_vit",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "DINOv3ViTModel": (DINOv3ViTClassifier, "dinov3")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {"DINOv3ViTModel": ("classifier.",)}

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """cls, register and patch tokens (no absolute positions), and the (cos, sin) of the
        patch grid that every block's attention rotates queries and keys by."""
        tower = self.tower(model)
        pixels = inputs.to(tower.embeddings.patch_embeddings.weight.dtype)
        return Embedded(tower.embeddings(pixels), tower.rope_embeddings(pixels))

    def context_kwargs(self, embedded: Embedded) -> dict[str, Any]:
        return {"position_embeddings": embedded.context}

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        return (
            f"{type(model).__name__} rotates queries and keys by their positions (rotary "
            "position embedding): the paper's MHA bound is stated for softmax(x A x^T) without "
            "rotary positions"
        )
