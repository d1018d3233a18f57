"""transformers vision towers: ViT, DeiT, DINOv2 (with or without registers), DINOv3, and the CLIP and
SigLIP vision towers (docs/protocol.md, section 3.1), with the classes that put a projection or
a classifier on top of them.

Every block is pre-norm, ``x + branch(attention(ln1(x)))`` then ``x + branch(mlp(ln2(x)))``;
the module names are transformers 5's (older releases named ViT's and DINOv2's differently),
per family: blocks; LN1, MHA, LN2; FC1 (the first linear stage); FC2.

- ViT, DeiT: ``layers``; ``layernorm_before``, ``attention``, ``layernorm_after``;
  ``mlp.fc1``; ``mlp.fc2``.
- DINOv2: ``encoder.layer``; ``norm1``, ``attention``, ``norm2``; ``mlp.fc1`` (SwiGLU:
  ``mlp.gate_proj`` + ``mlp.up_proj``); ``mlp.fc2`` (SwiGLU: ``mlp.down_proj``).
- DINOv3: ``model.layer``; ``norm1``, ``attention``, ``norm2``; ``mlp.up_proj`` (gated:
  ``mlp.gate_proj`` + ``mlp.up_proj``); ``mlp.down_proj``.
- CLIP, SigLIP: ``encoder.layers``; ``layer_norm1``, ``self_attn``, ``layer_norm2``;
  ``mlp.fc1``; ``mlp.fc2``.

MHA is the whole attention module (q/k/v/o projections). A gated MLP's FC1 is gate + up (fc1
mode ``up``: the up projection alone). The branch around MHA and the MLP is ViT's dropout,
DINOv2's and DINOv3's layer scale (``layer_scale1`` trained with MHA, ``layer_scale2`` with
FC2, as timm's LayerScale) and drop path, nothing for CLIP and SigLIP. The embedding is the
``embeddings`` module (patch embedding, cls/distillation/register/mask tokens, position
embedding) and CLIP's ``pre_layrnorm``; the head is the final norm, ViT's pooler, SigLIP's
attention pooling head and what a wrapper class adds (``classifier``, ``visual_projection``:
:func:`~vitplasticity.models.architectures.base.wrapper_head`). A wrapper class holds the tower
under its ``base_model_prefix`` (``ViTForImageClassification.vit``), or where the family
names it (CLIP's and SigLIP's classification classes hold ``vision_model``, their prefix names
the dual encoder); parameter names keep that prefix. DINOv3's positions
are rotary: its embedding hands every block the (cos, sin) of the patch grid.

Finetuning and recommend take a tower in its classification class, whose forward pass pools
the tower's output its own way (ViTForImageClassification, Dinov2ForImageClassification, ...,
and :class:`~vitplasticity.models.architectures.hf_dinov3.DINOv3ViTClassifier` for DINOv3, which
transformers lacks):
:meth:`HFVisionTower.logits` is ``model(pixel_values=inputs).logits``.

Matched by class name (transformers is optional and not imported to answer "no").
transformers attention modules return (output, weights) and CLIP's and SigLIP's blocks pass
them the tokens by keyword: :meth:`HFVisionTower.hook_input` and ``hook_output`` say where.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    Architecture,
    AttentionWeights,
    Declared,
    Embedded,
    Owned,
    UndefinedStage,
    UnsupportedModel,
    base_model_of,
    check_fc1_mode,
    has_submodule,
    wrapper_head,
)

MLP_LAYOUTS: tuple[tuple[str, ...], ...] = (
    ("gate_proj", "up_proj", "down_proj"),  # gated: DINOv2 SwiGLU, DINOv3 S+/H+/7B
    ("fc1", "fc2"),  # ViT, DINOv2, CLIP, SigLIP
    ("up_proj", "down_proj"),  # DINOv3 plain
)
"""The MLPs' linears, in order: FC1's (the first linear stage) then FC2. Gated first: it also
has ``up_proj`` and ``down_proj``."""

NO_CLASSIFIER = (
    "{model} has no classification head: finetuning and recommend take a vision tower in its "
    "classification class (models.build_model with num_classes > 0, vitplasticity.models.build)"
)
"""Why finetune and recommend refuse a bare tower (or one with a projection, CLIP's)."""


def mlp_layout(mlp: nn.Module) -> tuple[str, ...]:
    """The names of ``mlp``'s linears: FC1's then FC2 (see :data:`MLP_LAYOUTS`).

    Raises:
        UnsupportedModel: naming the MLP class when it has none of the layouts.
    """
    for layout in MLP_LAYOUTS:
        if all(isinstance(getattr(mlp, name, None), nn.Linear) for name in layout):
            return layout
    expected = "; ".join(" + ".join(layout) for layout in MLP_LAYOUTS)
    raise UnsupportedModel(f"{type(mlp).__name__} MLP: expected Linear {expected}")


def mlp_fc1(mlp: nn.Module, mode: str) -> tuple[nn.Module, ...]:
    """FC1: the first linear stage (``stage``; gate and up for a gated MLP), or the up
    projection alone (``up``; the same as the stage for a plain MLP)."""
    check_fc1_mode(mode)
    first = mlp_layout(mlp)[:-1]
    return tuple(getattr(mlp, name) for name in (first if mode == "stage" else first[-1:]))


def mlp_from_parts(
    mlp: nn.Module, fc1: tuple[nn.Module, ...], fc2: nn.Module, x: torch.Tensor
) -> torch.Tensor:
    """What the MLP computes, from its mapped FC1 stage and FC2 and its own activation:
    ``fc2(act(gate(x)) * up(x))`` gated, ``fc2(act(fc1(x)))`` plain."""
    act = mlp.act_fn if hasattr(mlp, "act_fn") else mlp.activation_fn
    if len(fc1) == 2:
        gate, up = fc1
        return fc2(act(gate(x)) * up(x))
    (linear,) = fc1
    return fc2(act(linear(x)))


def _present(owner: nn.Module, names: Sequence[str]) -> tuple[nn.Module, ...]:
    return tuple(
        module for name in names if isinstance(module := getattr(owner, name, None), nn.Module)
    )


class HFVisionTower(Architecture):
    """What the transformers vision families share; each subclass names its modules."""

    towers: tuple[tuple[str, str], ...] = ()
    """(model class name, where the tower is in it: "" the model itself). A class that holds a
    tower under its ``base_model_prefix`` needs no entry."""
    layer_classes: tuple[str, ...] = ()
    """The block classes (a subclass of one is not the same block)."""
    blocks_at: str = ""
    """The blocks' ModuleList in the tower."""
    norm1: str = ""
    attention: str = ""
    norm2: str = ""
    output_projection: str = ""
    """The attention's output projection (``o_proj`` or ``out_proj``)."""
    embedding_parts: tuple[str, ...] = ("embeddings",)
    """The tower's modules of the ``emb`` configuration."""
    head_parts: tuple[str, ...] = ()
    """The tower's final norm and pooling, where present."""

    # --- what it is ---------------------------------------------------------------------------

    def _tower_at(self, model: nn.Module) -> str | None:
        """Where the tower is in ``model`` ("" itself; None: not of the family)."""
        towers = dict(self.towers)
        for cls in type(model).__mro__:
            if cls.__name__ in towers:
                return towers[cls.__name__]
        base = base_model_of(model)
        if base is not None and self._tower_at(base) == "":
            return model.base_model_prefix
        return None

    def matches(self, model: nn.Module) -> bool:
        return self._tower_at(model) is not None

    def tower(self, model: nn.Module) -> nn.Module:
        """The vision tower: the model itself, or the one a wrapper class holds.

        Raises:
            UnsupportedModel: for a model of another family, or a wrapper without its tower.
        """
        path = self._tower_at(model)
        if path is None:
            raise UnsupportedModel(f"{type(model).__name__} is not a {self.title}")
        try:
            return model.get_submodule(path)
        except AttributeError as error:
            raise UnsupportedModel(
                f"{type(model).__name__} has no {path!r}: not a {self.title}"
            ) from error

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        try:
            return list(self.tower(model).get_submodule(self.blocks_at))
        except AttributeError:
            return []

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming the parts of the family's tower the model's
        tower lacks."""
        tower = self.tower(model)
        missing = [
            name
            for name in (self.blocks_at, *self.embedding_parts)
            if not has_submodule(tower, name)
        ]
        if missing:
            raise UnsupportedModel(
                f"{type(model).__name__} is not a {self.title}: its tower lacks {missing}"
            )

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        if type(block).__name__ not in self.layer_classes:
            raise UnsupportedModel(
                f"block {index} of {type(model).__name__} is a {type(block).__name__}, not a "
                f"{' or '.join(self.layer_classes)}"
            )
        super().check_block(block, index, model)

    # --- which parameters are whose -----------------------------------------------------------

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        mlp = block.mlp
        return {
            "ln1": (getattr(block, self.norm1),),
            "mha": (getattr(block, self.attention),),
            "ln2": (getattr(block, self.norm2),),
            "fc1": mlp_fc1(mlp, fc1),
            "fc2": (getattr(mlp, mlp_layout(mlp)[-1]),),
        }

    def embedding(self, model: nn.Module) -> Owned:
        return Owned(_present(self.tower(model), self.embedding_parts))

    def head(self, model: nn.Module) -> Owned:
        tower = self.tower(model)
        return Owned(_present(tower, self.head_parts) + wrapper_head(model, tower))

    # --- how it runs --------------------------------------------------------------------------

    def context_kwargs(self, embedded: Embedded) -> dict[str, Any]:
        """What the model's forward passes every block and its attention beside the tokens
        (no attention mask: every image token attends to every other)."""
        return {"attention_mask": None}

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, **self.context_kwargs(embedded))[0]  # (output, weights)

    def hook_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]  # CLIP, SigLIP: by keyword

    def hook_output(self, output: Any) -> torch.Tensor:
        return output[0] if isinstance(output, tuple) else output  # attention: (output, weights)

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        return block(tokens, **self.context_kwargs(embedded))

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        (linear,) = fc2
        return mlp_from_parts(block.mlp, fc1, linear, x)

    # --- other stages -------------------------------------------------------------------------

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        """Q, K, V from ``q_proj``/``k_proj``/``v_proj`` (heads along rows) and O from the
        output projection.

        Raises:
            UndefinedStage: when the attention holds parameters beside the four projections
                (the paper's bound is stated for softmax(x A x^T) V alone).
        """
        projections = ("q_proj", "k_proj", "v_proj", self.output_projection)
        others = [
            name
            for name, child in attention.named_children()
            if name not in projections and any(True for _ in child.parameters())
        ]
        if others or any(True for _ in attention.parameters(recurse=False)):
            raise UndefinedStage(
                f"{type(attention).__name__} has parameters beside {', '.join(projections)} "
                f"({', '.join(others) or 'its own'}): the paper's MHA bound covers those four only"
            )
        heads = getattr(attention, "num_heads", None) or attention.num_attention_heads
        query, key, value, output = (getattr(attention, name).weight for name in projections)
        return AttentionWeights(query, key, value, output, heads)

    def has_classifier(self, model: nn.Module) -> bool:
        """Whether ``model`` is a classification class around the tower (a ``classifier``)."""
        return self.tower(model) is not model and isinstance(
            getattr(model, "classifier", None), nn.Module
        )

    def logits(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """The classification class's logits: its forward pass returns an output object.

        Raises:
            UnsupportedModel: for a model without a classification head.
        """
        if not self.has_classifier(model):
            raise UnsupportedModel(NO_CLASSIFIER.format(model=type(model).__name__))
        return model(pixel_values=inputs).logits

    def classifier(self, model: nn.Module) -> nn.Module:
        if not self.has_classifier(model):
            raise UnsupportedModel(NO_CLASSIFIER.format(model=type(model).__name__))
        return model.classifier

    def refusal(self, stage: str, model: nn.Module) -> str | None:
        if stage in ("finetune", "recommend") and not self.has_classifier(model):
            return NO_CLASSIFIER.format(model=type(model).__name__)
        return None


class LayerScaled(HFVisionTower):
    """DINOv2 and DINOv3 blocks: ``drop_path(layer_scale(out))`` on both branches."""

    norm1 = "norm1"
    attention = "attention"
    norm2 = "norm2"
    output_projection = "o_proj"

    def declared(self, model: nn.Module) -> list[Declared]:
        found = []
        for index, block in enumerate(self.block_list(model)):
            found += [
                Declared("layer_scale_attn", "mha", Owned((block.layer_scale1,)), index),
                Declared("layer_scale_mlp", "fc2", Owned((block.layer_scale2,)), index),
            ]
        return found

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.drop_path(block.layer_scale1(out))

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.drop_path(block.layer_scale2(out))


class HFViT(HFVisionTower):
    """transformers ``ViTModel`` (and ``ViTForImageClassification``)."""

    name = "hf_vit"
    title = "transformers ViTModel"
    towers = (("ViTModel", ""),)
    layer_classes = ("ViTLayer",)
    blocks_at = "layers"
    norm1, attention, norm2 = "layernorm_before", "attention", "layernorm_after"
    output_projection = "o_proj"
    head_parts = ("layernorm", "pooler")
    model_types = ("vit",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "ViTModel": ("ViTForImageClassification", "vit")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {
        "ViTModel": ("classifier.", "pooler.")
    }
    # As ViTForImageClassification holds it: no pooler.
    tower_kwargs: ClassVar[dict[str, dict[str, Any]]] = {"ViTModel": {"add_pooling_layer": False}}

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # ViTModel.forward casts the pixels to the patch projection's dtype; its embeddings
        # do not. Patches, cls token, position embedding, dropout.
        embeddings = self.tower(model).embeddings
        weight = embeddings.patch_embeddings.projection.weight
        return Embedded(embeddings(inputs.to(weight.dtype)))  # (B, 1 + patches, d)

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.dropout(out)

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.dropout(out)


class HFDeiT(HFViT):
    """transformers ``DeiTModel`` (and ``DeiTForImageClassification``,
    ``DeiTForImageClassificationWithTeacher``, ``DeiTForMaskedImageModeling``): ViT's blocks and
    module names; its embedding adds the distillation token after the cls token.

    ``DeiTForImageClassificationWithTeacher`` averages the logits of two heads, one on the cls
    token and one on the distillation token: it is measured and selected (both heads are the
    head), but finetuning and recommend, which train one classifier, take
    ``DeiTForImageClassification`` (what finetuning builds around a DeiT tower)."""

    name = "hf_deit"
    title = "transformers DeiTModel"
    towers = (("DeiTModel", ""),)
    layer_classes = ("DeiTLayer",)
    model_types = ("deit",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "DeiTModel": ("DeiTForImageClassification", "deit")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {
        "DeiTModel": ("classifier.", "cls_classifier.", "distillation_classifier.", "pooler.")
    }
    tower_kwargs: ClassVar[dict[str, dict[str, Any]]] = {"DeiTModel": {"add_pooling_layer": False}}

    def refusal(self, stage: str, model: nn.Module) -> str | None:
        if stage in ("finetune", "recommend") and type(model).__name__ == (
            "DeiTForImageClassificationWithTeacher"
        ):
            return (
                "DeiTForImageClassificationWithTeacher averages two heads (cls and distillation "
                "tokens): finetuning and recommend train one classifier, on "
                "DeiTForImageClassification"
            )
        return super().refusal(stage, model)


class HFDinov2(LayerScaled):
    """transformers ``Dinov2Model`` and ``Dinov2WithRegistersModel`` (plain or SwiGLU MLP)."""

    name = "hf_dinov2"
    title = "transformers Dinov2Model"
    towers = (("Dinov2Model", ""), ("Dinov2WithRegistersModel", ""))
    layer_classes = ("Dinov2Layer", "Dinov2WithRegistersLayer")
    blocks_at = "encoder.layer"
    head_parts = ("layernorm",)
    model_types = ("dinov2", "dinov2_with_registers")
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "Dinov2Model": ("Dinov2ForImageClassification", "dinov2"),
        "Dinov2WithRegistersModel": (
            "Dinov2WithRegistersForImageClassification",
            "dinov2_with_registers",
        ),
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {
        "Dinov2Model": ("classifier.",),
        "Dinov2WithRegistersModel": ("classifier.",),
    }

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # Patches, cls (and register) tokens, position embedding, dropout.
        return Embedded(self.tower(model).embeddings(inputs))


class HFClipVision(HFVisionTower):
    """transformers ``CLIPVisionModel`` (and ``CLIPVisionModelWithProjection``,
    ``CLIPForImageClassification``): the pre-norm ``pre_layrnorm`` belongs to the embedding."""

    name = "hf_clip_vision"
    title = "transformers CLIPVisionModel"
    towers = (("CLIPVisionModel", ""), ("CLIPForImageClassification", "vision_model"))
    layer_classes = ("CLIPEncoderLayer",)
    blocks_at = "encoder.layers"
    norm1, attention, norm2 = "layer_norm1", "self_attn", "layer_norm2"
    output_projection = "out_proj"
    embedding_parts = ("embeddings", "pre_layrnorm")
    head_parts = ("post_layernorm",)
    model_types = ("clip", "clip_vision_model")
    default_classes: ClassVar[dict[str, str]] = {"clip": "CLIPVisionModel"}
    dual_encoders: ClassVar[dict[str, str]] = {"clip_vision_model": "clip"}
    other_tower_keys: ClassVar[dict[str, tuple[str, ...]]] = {
        "clip": ("text_model.", "text_projection.", "visual_projection.", "logit_scale")
    }
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "CLIPVisionModel": ("CLIPForImageClassification", "vision_model")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {"CLIPVisionModel": ("classifier.",)}

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        tower = self.tower(model)
        return Embedded(tower.pre_layrnorm(tower.embeddings(inputs)))


class HFSiglipVision(HFVisionTower):
    """transformers ``SiglipVisionModel`` (and ``SiglipForImageClassification``): patches and
    positions only (no cls token); the attention pooling ``head`` is in the head."""

    name = "hf_siglip_vision"
    title = "transformers SiglipVisionModel"
    towers = (("SiglipVisionModel", ""), ("SiglipForImageClassification", "vision_model"))
    layer_classes = ("SiglipEncoderLayer",)
    blocks_at = "encoder.layers"
    norm1, attention, norm2 = "layer_norm1", "self_attn", "layer_norm2"
    output_projection = "out_proj"
    head_parts = ("post_layernorm", "head")
    model_types = ("siglip", "siglip_vision_model")
    default_classes: ClassVar[dict[str, str]] = {"siglip": "SiglipVisionModel"}
    dual_encoders: ClassVar[dict[str, str]] = {"siglip_vision_model": "siglip"}
    other_tower_keys: ClassVar[dict[str, tuple[str, ...]]] = {
        "siglip": ("text_model.", "logit_scale", "logit_bias")
    }
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "SiglipVisionModel": ("SiglipForImageClassification", "vision_model")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {"SiglipVisionModel": ("classifier.",)}

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        return Embedded(self.tower(model).embeddings(inputs))
