"""transformers ``ViTMAEModel``, the MAE encoder (docs/protocol.md, section 3.1), and the
classification class transformers lacks for it (:class:`ViTMAEClassifier`).

Its blocks are ViT's (``layers``; ``layernorm_before``, ``attention``, ``layernorm_after``;
``mlp.fc1``; ``mlp.fc2``: :mod:`vitplasticity.models.architectures.hf_vision`). What differs
is its forward pass: ``ViTMAEEmbeddings`` drops ``mask_ratio`` of the patches at random and
shuffles the rest (MAE's pre-training input corruption), drawing from the RNG on every call.
Every stage here takes the encoder on every patch, in order, whatever ``mask_ratio`` says:
cls token then patches, each with its position, as ``ViTMAEModel``'s forward feeds its blocks
with ``mask_ratio`` 0 and ``noise`` that keeps the order (tests/models/test_hf_vit_like.py
checks exactly that). Plasticity in both protocols, the bounds and LoRA take ``ViTMAEModel``
and ``ViTMAEForPreTraining`` (its decoder is the head); finetune and recommend take
:class:`ViTMAEClassifier`, which finetuning builds around the encoder. The position table is
fixed sine-cosine in MAE (``requires_grad`` False at init); it is the embedding's, and the
``emb`` configuration trains it as any other family's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import Embedded
from vitplasticity.models.architectures.hf_vision import HFViT


def every_patch(encoder: nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """The tokens (B, 1 + patches, d) ``encoder`` (a ``ViTMAEModel``) feeds its first block
    with no patch masked and none moved: cls token and patches, each with its position.

    Raises:
        ValueError: for images of another size than the position table's.
    """
    embeddings = encoder.embeddings
    positions = embeddings.position_embeddings  # (1, 1 + patches, d)
    patches = embeddings.patch_embeddings(pixel_values)  # (B, patches, d)
    if patches.shape[1] + 1 != positions.shape[1]:
        raise ValueError(
            f"{tuple(pixel_values.shape[2:])} images make {patches.shape[1]} patches; "
            f"{type(encoder).__name__} has positions for {positions.shape[1] - 1}"
        )
    cls = (embeddings.cls_token + positions[:, :1]).expand(len(patches), -1, -1)
    return torch.cat([cls, patches + positions[:, 1:]], dim=1)


class ViTMAEClassifier(nn.Module):
    """A ``ViTMAEModel`` with a linear classifier (transformers has no
    ViTMAEForImageClassification), on every patch, none masked: the mean of the patch tokens
    after the encoder's final ``layernorm`` (MAE's finetuning pools the patches' mean)."""

    def __init__(self, vit: nn.Module, num_classes: int) -> None:
        super().__init__()
        self.vit = vit
        width = vit.config.hidden_size
        self.classifier = nn.Linear(width, num_classes, device="meta")  # drawn by the builder

    def forward(self, pixel_values: torch.Tensor, **kwargs: Any) -> Any:
        """The classifier's logits of ``pixel_values`` (B, 3, H, W), in an
        ``ImageClassifierOutput`` as transformers' classification classes return them."""
        from transformers.modeling_outputs import ImageClassifierOutput

        weight = self.vit.embeddings.patch_embeddings.projection.weight
        tokens = every_patch(self.vit, pixel_values.to(weight.dtype))
        for layer in self.vit.layers:
            tokens = layer(tokens, None)
        tokens = self.vit.layernorm(tokens)  # (B, 1 + patches, d)
        return ImageClassifierOutput(logits=self.classifier(tokens[:, 1:].mean(dim=1)))


class HFViTMAE(HFViT):
    """transformers ``ViTMAEModel`` (and ``ViTMAEForPreTraining``, :class:`ViTMAEClassifier`):
    ViT's blocks, on every patch in order."""

    name = "hf_vit_mae"
    title = "transformers ViTMAEModel"
    towers = (("ViTMAEModel", ""), ("ViTMAEClassifier", "vit"))
    layer_classes = ("ViTMAELayer",)
    head_parts = ("layernorm",)
    model_types = ("vit_mae",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "ViTMAEModel": (ViTMAEClassifier, "vit")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {"ViTMAEModel": ("classifier.",)}
    tower_kwargs: ClassVar[dict[str, dict[str, Any]]] = {}

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        tower = self.tower(model)
        weight = tower.embeddings.patch_embeddings.projection.weight
        return Embedded(every_patch(tower, inputs.to(weight.dtype)))
