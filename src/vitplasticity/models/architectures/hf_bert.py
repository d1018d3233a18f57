"""transformers ``BertModel`` and ``RobertaModel``: post-norm text encoders (and their task
classes, ``XForMaskedLM``, ``XForSequenceClassification``...), one family: RoBERTa's layers are
BERT's (docs/architectures.md, "Post-norm encoders").

A layer normalises *after* each residual sum, where the paper's block normalises before each
branch. The convention: LN1 is the norm after the attention residual, LN2 the norm after the
MLP residual,

    x1 = LN1(x + MHA(x))                  # attention.output.LayerNorm
    x2 = LN2(x1 + FC2(act(FC1(x1))))      # output.LayerNorm

MHA is ``attention.self`` (``query``, ``key``, ``value``) followed by ``attention.output.dense``:
two modules run one after the other, one part (the output projection of the concatenated heads,
as in every other family's MHA). FC1 is ``intermediate.dense``, FC2 ``output.dense``.

What each component takes is what it receives in the block: MHA and FC1 take the tokens the
block's branch starts from (x, x1), LN1 and LN2 the residual sums. The in-situ protocol reads
exactly these (MHA from ``attention.self``'s input to ``attention.output.dense``'s output:
:meth:`HFBert.in_situ_parts`); the embedding protocol feeds the embedding output e to every
component as for every family: LN1(e), MHA(e), LN2(e), FC1(e), FC2([e, 0, ..., 0]).

The embedding output is the model's ``embeddings(ids)``: word + position + token type (0)
embeddings, their LayerNorm, dropout (RoBERTa numbers positions from ``pad_token_id + 1`` and
gives pad tokens the padding position, as its own forward does). The ``emb`` configuration
trains the whole ``embeddings`` module, its LayerNorm included; the head is the pooler (when
the model has one) and what a task class adds beside the bare model (the classifier, an MLM
head's transform and output bias; its decoder weight is the tied word embedding, ``emb``'s).
Inputs are token ids (N, L), attended bidirectionally without a mask. Matched by class name:
transformers is optional and not imported to answer "no". DeBERTa-v2's layer is this one with
another attention: :mod:`~vitplasticity.models.architectures.hf_deberta_v2` subclasses this
family.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures.base import (
    AttentionWeights,
    Embedded,
    Owned,
    Parts,
    UnsupportedModel,
    check_fc1_mode,
    padded_linear,
    wrapper_head,
)
from vitplasticity.models.architectures.hf_text_common import HFText, check_fc2_width, is_linear
from vitplasticity.models.refusals import (
    BERT_CHUNKS_REASON,
    BERT_DECODER_REASON,
    ENCODER_REFUSALS,
)

BARE_CLASSES: tuple[str, ...] = ("BertModel", "RobertaModel")
"""The bare encoder classes of the family."""

LAYER_LINEARS: tuple[str, ...] = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
LAYER_NORMS: tuple[str, ...] = ("attention.output.LayerNorm", "output.LayerNorm")


def _tied_to(module: nn.Module, base: nn.Module) -> bool:
    inside = {id(p) for p in base.parameters()}
    return any(id(p) in inside for p in module.parameters())


def _own_parts(module: nn.Module, base: nn.Module) -> tuple[list[nn.Module], list[nn.Parameter]]:
    """The submodules of ``module`` holding no parameter of ``base`` (as large as they can
    be), and the parameters held directly by the modules that do: an MLM head whose decoder
    weight is the word embedding gives its transform (a module) and its output bias (held
    directly). The tied weight is left to ``base``."""
    if not _tied_to(module, base):
        return [module], []
    inside = {id(p) for p in base.parameters()}
    modules: list[nn.Module] = []
    parameters = [p for p in module.parameters(recurse=False) if id(p) not in inside]
    for child in module.children():
        found, held = _own_parts(child, base)
        modules += found
        parameters += [p for p in held if all(p is not q for q in parameters)]
    return modules, parameters


class HFBert(HFText):
    """transformers BertModel / RobertaModel: post-norm encoder layers, absolute positions."""

    name = "hf_bert"
    title = "transformers BertModel / RobertaModel"
    model_types = ("bert", "roberta")
    text_task = "masked"  # an encoder attends both ways: it has no next-token loss
    bare_classes = BARE_CLASSES  # a subclass's own: DeBERTa-v2's
    embedding_names = ("embeddings",)
    text_refusals = ENCODER_REFUSALS
    layer_linears: tuple[str, ...] = LAYER_LINEARS
    """The linear layers every encoder layer has."""
    # Many encoder checkpoints (those saved from a ...ForMaskedLM, sentence-transformers') hold
    # no pooler; no stage reads the bare model's pooled output.
    unused_modules: ClassVar[dict[str, str]] = {"BertModel": "pooler", "RobertaModel": "pooler"}

    # --- what it is ---------------------------------------------------------------------------

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(self.bare(model).encoder.layer)

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming a setting of the encoder that makes it no
        bidirectional encoder of once-run components."""
        config, name = self.bare(model).config, type(model).__name__
        if config.is_decoder:
            raise UnsupportedModel(f"{name} is {BERT_DECODER_REASON}")
        if config.chunk_size_feed_forward:
            raise UnsupportedModel(
                f"{name} runs its MLP in chunks (chunk_size_feed_forward="
                f"{config.chunk_size_feed_forward}): {BERT_CHUNKS_REASON}"
            )

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        layer = f"layer {index} ({type(block).__name__}) of {type(model).__name__}"
        modules = dict(block.named_modules())
        missing = [n for n in (*self.layer_linears, *LAYER_NORMS) if n not in modules]
        if missing or hasattr(block, "crossattention"):
            raise UnsupportedModel(
                f"{layer} is not a {self.title} encoder layer: "
                + (f"it lacks {missing}" if missing else "it has cross-attention")
            )
        wrong = [n for n in self.layer_linears if not is_linear(modules[n])]
        wrong += [n for n in LAYER_NORMS if not isinstance(modules[n], nn.LayerNorm)]
        if wrong:
            raise UnsupportedModel(f"{layer}: expected Linear and LayerNorm modules, got {wrong}")
        width = block.output.LayerNorm.normalized_shape[0]
        check_fc2_width(layer, "output.dense", block.output.dense.in_features, width)
        super().check_block(block, index, model)

    # --- which parameters are whose -----------------------------------------------------------

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        # A plain MLP: its first linear stage is the up projection, in either fc1 mode.
        check_fc1_mode(fc1)
        return {
            "ln1": (block.attention.output.LayerNorm,),
            "mha": (block.attention.self, block.attention.output.dense),
            "ln2": (block.output.LayerNorm,),
            "fc1": (block.intermediate.dense,),
            "fc2": (block.output.dense,),
        }

    def in_situ_parts(
        self, block: nn.Module, fc1: str = "stage"
    ) -> dict[str, tuple[tuple[nn.Module, nn.Module], ...]]:
        """MHA is one part, from ``attention.self``'s input (the layer's input x) to
        ``attention.output.dense``'s output; every other component is its one module."""
        parts = super().in_situ_parts(block, fc1)
        return {**parts, "mha": ((block.attention.self, block.attention.output.dense),)}

    def head(self, model: nn.Module) -> Owned:
        """The pooler (when there is one), and what a task class adds beside the bare model,
        a parameter it ties to the bare model's (the MLM decoder's word embedding) left out."""
        encoder = self.bare(model)
        pooler = getattr(encoder, "pooler", None)  # DeBERTa-v2's bare model has none
        modules: list[nn.Module] = [] if pooler is None else [pooler]
        parameters: list[nn.Parameter] = []
        for child in wrapper_head(model, encoder):
            found, held = _own_parts(child, encoder)
            modules += found
            parameters += held
        return Owned(tuple(modules), tuple(parameters))

    # --- how it runs --------------------------------------------------------------------------

    def max_length(self, model: nn.Module) -> int:
        """The longest sequence the position embedding numbers (RoBERTa's start after the
        padding position)."""
        embeddings = self.bare(model).embeddings
        count = embeddings.position_embeddings.num_embeddings
        padding = getattr(embeddings, "padding_idx", None)
        return count if padding is None else count - padding - 1

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """``embeddings(ids)``, as the model's own forward computes it.

        Raises:
            ValueError: for sequences longer than the model's positions.
        """
        limit = self.max_length(model)
        if inputs.shape[1] > limit:
            raise ValueError(
                f"sequences of {inputs.shape[1]} tokens exceed the model's {limit} positions"
            )
        # No mask (bidirectional), nothing else beside the tokens: HFText's layer_inputs.
        return Embedded(self.bare(model).embeddings(input_ids=inputs))  # (B, L, d)

    def _mha(
        self,
        modules: tuple[nn.Module, ...],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        attention, dense = modules
        return dense(self.attend(attention, tokens, embedded, index))  # (B, L, d)

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        (dense_in,), (dense_out,) = fc1, fc2
        return dense_out(block.intermediate.intermediate_act_fn(dense_in(x)))

    def compose_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        """The post-norm layer from its mapped components: ``x1 = ln1(x + mha(x))``, then
        ``ln2(x1 + fc2(act(fc1(x1))))`` (dropout between, an identity in eval)."""
        (ln1,), mha, (ln2,), fc1, fc2 = (components[c] for c in COMPONENTS)
        x1 = ln1(tokens + block.attention.output.dropout(self._mha(mha, tokens, embedded, index)))
        return ln2(x1 + block.output.dropout(self.mlp(block, fc1, fc2, x1)))

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded, fc1: str = "stage"
    ) -> tuple[Parts, ...]:
        """LN1(e), MHA(e), LN2(e), FC1(e), FC2([e, 0, ..., 0]) of the embedding output e: each
        norm on e alone (no residual sum), MHA its attention and output projection."""
        tokens = embedded.tokens
        parts = self.components(block, fc1)
        (ln1,), mha, (ln2,), (dense_in,), (dense_out,) = (parts[c] for c in COMPONENTS)
        return (
            (ln1(tokens),),
            (self._mha(mha, tokens, embedded, index),),
            (ln2(tokens),),
            (dense_in(tokens),),
            (padded_linear(dense_out, tokens),),
        )

    # --- other stages -------------------------------------------------------------------------

    def mha_weights(self, modules: tuple[nn.Module, ...]) -> AttentionWeights:
        """Q, K, V from ``attention.self``, O from ``attention.output.dense``."""
        attention, dense = modules
        return AttentionWeights(
            attention.query.weight,
            attention.key.weight,
            attention.value.weight,
            dense.weight,
            attention.num_attention_heads,
        )

    def lora_linears(self, block: nn.Module) -> Sequence[nn.Module]:
        """``query``, ``key``, ``value`` and ``attention.output.dense``."""
        attention = block.attention
        return (
            attention.self.query,
            attention.self.key,
            attention.self.value,
            attention.output.dense,
        )
