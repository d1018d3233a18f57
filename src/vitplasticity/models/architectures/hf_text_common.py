"""What the transformers text families share (:mod:`.hf_bert` and DeBERTa-v2, :mod:`.hf_gpt2`,
:mod:`.hf_decoder` and its decoders, :mod:`.hf_parallel`): a bare model (``BertModel``,
``GPT2Model``, ``LlamaModel``...) found in ``model`` or under a task class's
``base_model_prefix``, token-id inputs, layers and attention that take what the embedding's
context gives them as keyword arguments and return ``(output, weights)``, and refusals by stage
that say the model is a text model.

A family subclasses :class:`HFText` and keeps only what differs: its bare classes and parts,
what a layer and its attention receive (:meth:`HFText.layer_inputs`,
:meth:`HFText.attention_inputs`), its components, and how its block runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    Architecture,
    Embedded,
    Owned,
    UnsupportedModel,
    bare_model_of,
    wrapper_head,
)


def is_linear(module: nn.Module) -> bool:
    """A Linear (Falcon's ``FalconLinear`` is one), or peft's LoRA layer around one (its
    ``base_layer``)."""
    return isinstance(module, nn.Linear) or isinstance(
        getattr(module, "base_layer", None), nn.Linear
    )


def additive_mask(length: int, window: int | None, tokens: torch.Tensor) -> torch.Tensor:
    """Additive mask (1, 1, L, L): 0 where query i may see key j (j <= i, and i - j < window
    for a sliding window, as transformers' ``sliding_window_overlay``), the dtype's min
    elsewhere.

    Passed explicitly so that every attention implementation (eager adds it, SDPA takes it)
    is causal; without a mask the eager one would attend to the future.
    """
    query = torch.arange(length, device=tokens.device)[:, None]
    key = torch.arange(length, device=tokens.device)[None, :]
    blocked = key > query
    if window is not None:
        blocked |= key <= query - window
    mask = torch.zeros(length, length, dtype=tokens.dtype, device=tokens.device)
    return mask.masked_fill(blocked, torch.finfo(tokens.dtype).min)[None, None]


def check_fc2_width(layer: str, fc2: str, in_features: int, width: int) -> None:
    """Raise :class:`UnsupportedModel` when FC2 (``fc2``, of ``layer``) takes fewer features
    than a token has: the embedding protocol's zero-padded FC2 input is then undefined."""
    if in_features < width:
        raise UnsupportedModel(
            f"{layer}: {fc2} takes {in_features} features, fewer than the {width} of a token: "
            "the zero-padded FC2 input is undefined"
        )


class HFText(Architecture):
    """A transformers text model: a bare model of :attr:`bare_classes` (or a task class around
    one), its layers under :attr:`layers_name`, the head its final norm and what a task class
    adds."""

    inputs = "tokens"
    bare_classes: tuple[str, ...] = ()
    """The bare model's class names (matched in each class's MRO)."""
    model_parts: tuple[str, ...] = ()
    """What the bare model holds beside its embedding, layers and final norm (rotary positions,
    the embedding's dropout)."""
    embedding_names: tuple[str, ...] = ()
    """The bare model's modules that are the ``emb`` configuration."""
    layers_name: str = ""
    """The bare model's list of layers."""
    final_norm_name: str = ""
    """The bare model's norm after the last layer (the head's, with a task class's additions)."""
    text_refusals: ClassVar[dict[str, str]] = {}
    """The stages the family refuses, and why (none: every stage is defined)."""

    # --- what it is ---------------------------------------------------------------------------

    def bare(self, model: nn.Module) -> nn.Module:
        """The bare model: ``model`` itself, or the one its task class holds.

        Raises:
            UnsupportedModel: when ``model`` is neither.
        """
        found = bare_model_of(model, self.bare_classes)
        if found is None:
            raise UnsupportedModel(f"{type(model).__name__} is not a {self.title}")
        return found

    def matches(self, model: nn.Module) -> bool:
        return bare_model_of(model, self.bare_classes) is not None

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return list(getattr(self.bare(model), self.layers_name, []))

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming the parts the bare model lacks (its
        embedding, layers, final norm and :attr:`model_parts`)."""
        bare = self.bare(model)
        parts = (*self.embedding_names, self.layers_name, self.final_norm_name, *self.model_parts)
        missing = [part for part in parts if not hasattr(bare, part)]
        if missing:
            raise UnsupportedModel(
                f"{type(model).__name__} is not a {self.title}: it lacks {missing}"
            )

    def check_layer_modules(
        self,
        block: nn.Module,
        layer: str,
        norms: Sequence[str],
        linears: Sequence[str],
        activation: str,
    ) -> dict[str, nn.Module]:
        """The modules of ``block`` (``layer``, as errors name it) by name, once it has its
        ``norms`` and ``linears`` (names in the block), every linear a Linear, and its MLP the
        ``activation``.

        Raises:
            UnsupportedModel: naming what is missing or not a Linear.
        """
        modules = dict(block.named_modules())
        missing = [name for name in [*norms, *linears] if name not in modules]
        if missing:
            raise UnsupportedModel(f"{layer} is not a {self.title} layer: it lacks {missing}")
        not_linear = [name for name in linears if not is_linear(modules[name])]
        if not_linear or not hasattr(block.mlp, activation):
            raise UnsupportedModel(
                f"{layer}: expected Linear {not_linear or list(linears)} and an MLP activation "
                f"{activation}"
            )
        return modules

    # --- which parameters are whose -----------------------------------------------------------

    def embedding(self, model: nn.Module) -> Owned:
        bare = self.bare(model)
        return Owned(tuple(getattr(bare, name) for name in self.embedding_names))

    def head(self, model: nn.Module) -> Owned:
        """The final norm, and what a task class adds (``score``, ``classifier``,
        ``qa_outputs``, an ``lm_head`` unless it is tied to the token embedding, whose weight
        ``emb`` trains)."""
        bare = self.bare(model)
        return Owned((getattr(bare, self.final_norm_name), *wrapper_head(model, bare)))

    # --- how it runs --------------------------------------------------------------------------

    def layer_inputs(self, embedded: Embedded, index: int) -> dict[str, Any]:
        """What layer ``index`` is called with beside the tokens, from the embedding's context
        (the default: nothing)."""
        return {}

    def attention_inputs(self, embedded: Embedded, index: int) -> dict[str, Any]:
        """What layer ``index``'s attention is called with beside the tokens (the default: what
        the layer is)."""
        return self.layer_inputs(embedded, index)

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        return attention(tokens, **self.attention_inputs(embedded, index))[0]  # (output, weights)

    def hook_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]  # a layer may pass it by keyword

    def hook_output(self, output: Any) -> torch.Tensor:
        return output[0] if isinstance(output, tuple) else output  # attention: (output, weights)

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        out = block(tokens, **self.layer_inputs(embedded, index))
        return out[0] if isinstance(out, tuple) else out

    # --- other stages -------------------------------------------------------------------------

    def refusal(self, stage: str, model: nn.Module) -> str | None:
        reason = self.text_refusals.get(stage)
        return None if reason is None else f"{type(model).__name__} is a text model: {reason}"
