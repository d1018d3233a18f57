"""A transformers vision tower inside its classification class, with a new head.

Finetuning (``num_classes > 0``) puts the vision tower into its model's own classification
class, so that the pooling of the tower's output is the model's own (docs/protocol.md,
section 5), with a new head drawn from the caller's RNG (timm's ViT head init, as on the timm
path: truncated normal, std 0.02, zero bias). Each family's architecture declares its towers'
classes (``classifiers``):

| tower | classification class | pooled features |
|---|---|---|
| ViTModel | ViTForImageClassification | cls token, after the final layernorm |
| DeiTModel | DeiTForImageClassification | cls token, after the final layernorm (the distillation token unused) |
| BeitModel, Data2VecVisionModel | their ...ForImageClassification | mean of the patch tokens, after the pooler's layernorm (with mean pooling, the default; else the cls token after the final layernorm) |
| Dinov2Model, Dinov2WithRegistersModel | their ...ForImageClassification | [cls, mean of the patch tokens] (registers left out), after the final layernorm |
| ViTMAEModel | :class:`~vitplasticity.models.architectures.hf_vitmae.ViTMAEClassifier` (ours: transformers has none) | mean of the patch tokens after the final layernorm, every patch (none masked) |
| DINOv3ViTModel | :class:`~vitplasticity.models.architectures.hf_dinov3.DINOv3ViTClassifier` (ours: transformers has none) | as DINOv2's |
| CLIPVisionModel | CLIPForImageClassification | mean of the patch tokens of the encoder output (``post_layernorm`` unused: it gets no gradient) |
| SiglipVisionModel | SiglipForImageClassification | mean of all tokens after ``post_layernorm`` (the attention-pooling ``head`` unused: no gradient) |
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from vitplasticity.models.architectures import UnsupportedModel, declared

SHOWN_KEYS = 5
"""How many missing, unexpected or left-over weight names an error quotes."""


def with_classifier(transformers: Any, tower: nn.Module, num_classes: int) -> nn.Module:
    """``tower`` inside its classification class (its architecture's ``classifiers``) with a new
    ``num_classes``-way classifier drawn from the caller's RNG.

    The class is built on the meta device (no second backbone in memory, no draw from the
    RNG), then holds ``tower`` itself where it holds its own: its forward pass is the class's,
    its backbone the tower's weights. A tower already in its classification class (a
    checkpoint saved from one) is taken out of it first: its old classifier is replaced.

    Raises:
        ValueError: naming the class when it is not a known vision tower.
        UnsupportedModel: when the class holds parts beside the tower and the classifier.
    """
    classifiers = declared("classifiers")
    held = {
        classifier: attribute
        for classifier, attribute in classifiers.values()
        if isinstance(classifier, str)
    }
    if type(tower).__name__ in held:
        tower = getattr(tower, held[type(tower).__name__])
    name = type(tower).__name__
    if name not in classifiers:
        raise ValueError(
            f"{name} has no classification class here (num_classes {num_classes}): finetuning "
            f"takes a vision tower, one of {', '.join(sorted(classifiers))} (a text model "
            "finetunes on text: an experiment of text datasets, `vitplasticity finetune --text`)"
        )
    classifier, attribute = classifiers[name]
    if isinstance(classifier, type):  # our own wrapper, where transformers has none
        model: nn.Module = classifier(tower, num_classes)
    else:
        model_class = getattr(transformers, classifier)
        if model_class.config_class is type(tower.config):
            config = copy.deepcopy(tower.config)
            config.num_labels = num_classes
        else:  # CLIP, SigLIP: the dual encoder's config, around the tower's
            config = _dual_encoder_config(transformers, model_class, tower, num_classes)
        with torch.device("meta"):
            model = model_class(config)
        setattr(model, attribute, tower)
    model.classifier = new_head(model.classifier, tower)
    # By identity, not by device: a streamed tower's own tensors are on the meta device too.
    held = {
        id(t) for part in (tower, model.classifier) for t in (*part.parameters(), *part.buffers())
    }
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if id(t) not in held]
    if left:
        raise UnsupportedModel(
            f"{type(model).__name__} holds {shown_keys(left)} beside its {attribute} and classifier: "
            "not built here"
        )
    return model


def _dual_encoder_config(
    transformers: Any, model_class: type, tower: nn.Module, num_classes: int
) -> Any:
    """The dual encoder's config that ``model_class`` takes, around the tower's config.

    Its text config is the default one and is never built; SigLIP's default text config makes
    transformers warn about its token ids, which says nothing about this model: that warning
    is not shown.
    """
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return model_class.config_class(
            vision_config=tower.config.to_dict(),  # a copy: the tower's config stays its own
            num_labels=num_classes,
            attn_implementation=tower.config._attn_implementation,
        )
    finally:
        transformers.logging.set_verbosity(verbosity)


def new_head(template: nn.Module, tower: nn.Module) -> nn.Linear:
    """A new linear classifier of ``template``'s shape on the tower's device and dtype, drawn
    from the caller's RNG: truncated normal (std 0.02) weight, zero bias (timm's ViT head init,
    as the timm path draws it)."""
    if not isinstance(template, nn.Linear):
        raise UnsupportedModel(f"classifier {type(template).__name__}: expected a Linear")
    reference = next(tower.parameters())
    # Built on the meta device: nn.Linear's own init would draw from the RNG first.
    head = nn.Linear(template.in_features, template.out_features, device="meta")
    head = head.to_empty(device=reference.device).to(reference.dtype)
    with torch.no_grad():
        nn.init.trunc_normal_(head.weight, std=0.02)
        nn.init.zeros_(head.bias)
    return head


def shown_keys(keys: list[str]) -> str:
    """The first :data:`SHOWN_KEYS` of ``keys``, for an error message."""
    return ", ".join(keys[:SHOWN_KEYS]) + (" ..." if len(keys) > SHOWN_KEYS else "")
