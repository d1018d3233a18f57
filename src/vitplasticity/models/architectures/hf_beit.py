"""transformers ``BeitModel`` (BEiT, BEiT v2 checkpoints) and ``Data2VecVisionModel`` (BEiT's
block in transformers' older module layout: :class:`HFData2VecVision`): ViT-like pre-norm
blocks with layer scale and optional relative position biases (docs/protocol.md, section 3.1).

A block is ``x + drop_path(lambda_1 * attention(layernorm_before(x), bias))`` then ``x +
drop_path(lambda_2 * mlp(layernorm_after(x)))``; LN1, MHA, LN2, FC1, FC2 are
``layernorm_before``, ``attention`` (q/k/v/o projections), ``layernorm_after``, ``mlp.fc1``,
``mlp.fc2``. As for timm's Beit (``timm_beit``): ``lambda_1`` is trained with MHA,
``lambda_2`` with FC2 (plain floats, nothing to train, when ``layer_scale_init_value`` is 0);
a block's relative position bias (``use_relative_position_bias``: the block's
``relative_position_bias`` table, added to its attention logits) and the model-wide one
(``use_shared_relative_position_bias``: ``shared_position_bias``, added to every block's) are
declared and trained with MHA. MHA is the attention with the bias its block adds: the
embedding protocol feeds each block's attention the embedding with that block's bias, and the
paper's MHA bound, stated for ``softmax(x A x^T)`` without a bias, is refused for a model that
has one. The embedding is ``embeddings`` (patches, cls and mask tokens, absolute positions where
the model has them); the head is the final ``layernorm`` (an identity with mean pooling), the
``pooler`` (mean pooling and its norm) and what a wrapper class adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    AttentionWeights,
    Declared,
    Embedded,
    Owned,
    UndefinedStage,
    check_fc1_mode,
)
from vitplasticity.models.architectures.hf_vision import HFVisionTower


@dataclass(frozen=True)
class BeitContext:
    """What every BEiT block gets beside the tokens: the image resolution (the blocks size
    their relative bias from it), the model-wide bias, and per block the whole bias its
    attention adds to its logits (the block's own plus the model-wide one; None: none)."""

    resolution: tuple[int, int]
    shared: torch.Tensor | None
    biases: tuple[torch.Tensor | None, ...]


def _sum(*terms: torch.Tensor | None) -> torch.Tensor | None:
    present = [term for term in terms if term is not None]
    return sum(present[1:], present[0]) if present else None


class HFBeit(HFVisionTower):
    """transformers ``BeitModel`` (and ``BeitForImageClassification``,
    ``BeitForMaskedImageModeling``)."""

    name = "hf_beit"
    title = "transformers BeitModel"
    towers = (("BeitModel", ""),)
    layer_classes = ("BeitLayer",)
    blocks_at = "layers"
    norm1, attention, norm2 = "layernorm_before", "attention", "layernorm_after"
    output_projection = "o_proj"
    head_parts = ("layernorm", "pooler")
    model_types = ("beit",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "BeitModel": ("BeitForImageClassification", "beit")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {"BeitModel": ("classifier.",)}

    def declared(self, model: nn.Module) -> list[Declared]:
        found = []
        for index, block in enumerate(self.block_list(model)):
            for label, trained_by, scale in (
                ("layer_scale_attn", "mha", block.lambda_1),
                ("layer_scale_mlp", "fc2", block.lambda_2),
            ):
                if isinstance(scale, nn.Parameter):
                    found.append(Declared(label, trained_by, Owned(parameters=(scale,)), index))
            if block.relative_position_bias is not None:
                owned = Owned((block.relative_position_bias,))
                found.append(Declared("relative_position_bias", "mha", owned, index))
        shared = self.tower(model).shared_position_bias
        if shared is not None:
            found.append(Declared("shared_relative_position_bias", "mha", Owned((shared,))))
        return found

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # BeitModel.forward up to its blocks: patches, cls token, absolute positions where the
        # model has them, dropout; the relative biases sized for the patch grid.
        tower = self.tower(model)
        tokens = tower.embeddings(inputs)  # (B, 1 + patches, d)
        height, width = inputs.shape[2:]
        window = (height // tower.config.patch_size, width // tower.config.patch_size)

        def bias(table: nn.Module | None) -> torch.Tensor | None:
            return None if table is None else table(window, dim_size=tokens.shape[1])

        shared = bias(tower.shared_position_bias)  # (1, heads, n, n) or None
        biases = tuple(
            _sum(shared, bias(block.relative_position_bias)) for block in self.block_list(model)
        )
        return Embedded(tokens, BeitContext((height, width), shared, biases))

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, attention_mask=embedded.context.biases[index])[0]

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        context: BeitContext = embedded.context
        return block(tokens, attention_mask=context.shared, resolution=context.resolution)

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.drop_path(block.lambda_1 * block.dropout(out))

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.drop_path(block.lambda_2 * block.dropout(out))

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        relative = self.tower(model).shared_position_bias is not None or any(
            block.relative_position_bias is not None for block in self.block_list(model)
        )
        if relative:
            return (
                f"{type(model).__name__} adds a learned relative position bias to the attention "
                "logits: the paper's MHA bound is stated for softmax(x A x^T) without it"
            )
        return None


class HFData2VecVision(HFVisionTower):
    """transformers ``Data2VecVisionModel`` (and ``Data2VecVisionForImageClassification``):
    BEiT's block in transformers' older module layout. LN1, MHA, LN2, FC1, FC2 are
    ``layernorm_before``, ``attention`` (``attention.query``/``key``/``value``, a block's
    relative position bias and ``output.dense``), ``layernorm_after``, ``intermediate.dense``,
    ``output.dense``. ``lambda_1`` is trained with MHA, ``lambda_2`` with FC2 (None, nothing
    to train, when ``layer_scale_init_value`` is 0); the model-wide relative position bias
    (``encoder.relative_position_bias``) is declared and trained with MHA. The blocks return
    a tuple, the hidden states first."""

    name = "hf_data2vec_vision"
    title = "transformers Data2VecVisionModel"
    towers = (("Data2VecVisionModel", ""),)
    layer_classes = ("Data2VecVisionLayer",)
    blocks_at = "encoder.layer"
    norm1, attention, norm2 = "layernorm_before", "attention", "layernorm_after"
    head_parts = ("layernorm", "pooler")
    model_types = ("data2vec-vision",)
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {
        "Data2VecVisionModel": ("Data2VecVisionForImageClassification", "data2vec_vision")
    }
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {
        "Data2VecVisionModel": ("classifier.",)
    }
    # As Data2VecVisionForImageClassification holds it: with the pooler its forward reads
    # (the bare class's default has none).
    tower_kwargs: ClassVar[dict[str, dict[str, Any]]] = {
        "Data2VecVisionModel": {"add_pooling_layer": True}
    }

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        check_fc1_mode(fc1)  # one linear stage: "up" is the stage
        return {
            "ln1": (block.layernorm_before,),
            "mha": (block.attention,),
            "ln2": (block.layernorm_after,),
            "fc1": (block.intermediate.dense,),
            "fc2": (block.output.dense,),
        }

    def declared(self, model: nn.Module) -> list[Declared]:
        found = []
        for index, block in enumerate(self.block_list(model)):
            for label, trained_by, scale in (
                ("layer_scale_attn", "mha", block.lambda_1),
                ("layer_scale_mlp", "fc2", block.lambda_2),
            ):
                if scale is not None:
                    found.append(Declared(label, trained_by, Owned(parameters=(scale,)), index))
        encoder = self.tower(model).encoder
        if encoder.has_relative_position_bias:
            owned = Owned((encoder.relative_position_bias,))
            found.append(Declared("shared_relative_position_bias", "mha", owned))
        return found

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # Data2VecVisionModel.forward up to its blocks; the model-wide bias as its encoder
        # computes it for every block.
        tower = self.tower(model)
        tokens, _ = tower.embeddings(inputs)  # (B, 1 + patches, d), the patch grid
        height, width = inputs.shape[2:]
        shared = None
        if tower.encoder.has_relative_position_bias:
            window = (height // tower.config.patch_size, width // tower.config.patch_size)
            shared = tower.encoder.relative_position_bias(window, dim_size=tokens.shape[1])
        return Embedded(tokens, BeitContext((height, width), shared, ()))

    def _context(self, embedded: Embedded) -> dict[str, object]:
        context: BeitContext = embedded.context
        return {"relative_position_bias": context.shared, "resolution": context.resolution}

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, **self._context(embedded))[0]

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        return block(tokens, **self._context(embedded))[0]  # (hidden states, ...)

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return block.drop_path(out if block.lambda_1 is None else block.lambda_1 * out)

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        out = block.output.dropout(out)
        return block.drop_path(out if block.lambda_2 is None else block.lambda_2 * out)

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        (first,), (second,) = fc1, fc2
        return second(block.intermediate.intermediate_act_fn(first(x)))

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        """Q, K, V from ``attention.query``/``key``/``value`` and O from ``output.dense``.

        Raises:
            UndefinedStage: for an attention with its own relative position bias.
        """
        inner = attention.attention
        if inner.has_relative_position_bias:
            raise UndefinedStage(
                f"{type(attention).__name__} adds a learned relative position bias to the "
                "attention logits: the paper's MHA bound covers softmax(x A x^T) without it"
            )
        return AttentionWeights(
            inner.query.weight,
            inner.key.weight,
            inner.value.weight,
            attention.output.dense.weight,
            inner.num_attention_heads,
        )

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        relative = self.tower(model).encoder.has_relative_position_bias or any(
            block.attention.attention.has_relative_position_bias for block in self.block_list(model)
        )
        if relative:
            return (
                f"{type(model).__name__} adds a learned relative position bias to the attention "
                "logits: the paper's MHA bound is stated for softmax(x A x^T) without it"
            )
        return None
