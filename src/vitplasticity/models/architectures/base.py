"""What an architecture family answers: where its five components (ln1, mha, ln2, fc1, fc2)
are, which parameters are whose, how its embedding and one block run (docs/protocol.md,
"Architectures").

An :class:`Architecture` is the only code that knows a family's module and parameter names.
Every stage asks it through :mod:`vitplasticity.models.architectures` (plasticity, bounds, finetune
freezing and gradient groups, LoRA, recommend); none guesses from names.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.components import COMPONENTS, FC1_MODES

Parts = tuple[torch.Tensor, ...]
"""A component's output as one or more tensors whose feature-wise concatenation it is."""


class UnsupportedModel(ValueError):
    """A model (or a part of one) that no architecture can account for exactly."""


class UndefinedStage(ValueError):
    """A stage that is not defined for an architecture (the reason is the message)."""


@dataclass(frozen=True)
class Embedded:
    """What the first block receives: tokens (B, n, d) and what each block needs beside them."""

    tokens: torch.Tensor
    context: Any = None  # rotary embedding (Eva), causal mask (GPT2), None (ViT)


@dataclass(frozen=True)
class Owned:
    """Parameters held by modules and, beside them, parameters held directly (e.g. a token)."""

    modules: tuple[nn.Module, ...] = ()
    parameters: tuple[nn.Parameter, ...] = ()

    def all_parameters(self) -> list[nn.Parameter]:
        """Every parameter, the modules' first (in their ``parameters()`` order)."""
        found = [p for module in self.modules for p in module.parameters()]
        return found + [p for p in self.parameters if p is not None]


@dataclass(frozen=True)
class Declared:
    """Parameters outside the components, embedding and head, each declared with the
    finetuning configuration that trains them (docs/protocol.md, "Architectures")."""

    label: str
    """What they are, e.g. ``layer_scale_attn``."""
    trained_by: str
    """The configuration that trains them (``mha``, ``fc2``, ``emb``...; ``full`` alone)."""
    owned: Owned
    block: int | None = None


@dataclass(frozen=True)
class AttentionWeights:
    """One attention module's projections in torch's (out, in) layout, heads along rows."""

    query: torch.Tensor  # (h d_h, d)
    key: torch.Tensor  # (h d_h, d)
    value: torch.Tensor  # (h d_h, d)
    output: torch.Tensor  # (d, h d_h)
    num_heads: int
    logit_scale: float | None = None
    """What the attention multiplies q.k by; None: the paper's 1 / sqrt(d_h). A model that
    scales otherwise (GPT2 with ``scale_attn_weights`` off, or ``scale_attn_by_inverse_layer_idx``)
    says so here: the MHA bound's A^h is the bilinear form of the logits the model computes."""


def is_linear_layer(module: nn.Module) -> bool:
    """Whether ``module`` is a linear layer as LoRA and NFN take one: ``nn.Linear`` or
    transformers' ``Conv1D`` (GPT2's, its weight stored transposed)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def linear_weight(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A linear map's weight in torch's (out, in) layout, and its bias.

    transformers' ``Conv1D`` (GPT2) stores (in, out): it is transposed (a view). A module
    that is a view of parameters held elsewhere says which map it stands for through an
    ``as_linear()`` method (an MoE's routed FC1 and FC2, :mod:`.hf_moe`).
    """
    as_linear = getattr(module, "as_linear", None)
    if callable(as_linear):
        return as_linear()
    if isinstance(module, nn.Linear):
        return module.weight, module.bias
    if type(module).__name__ == "Conv1D":
        return module.weight.T, module.bias
    raise UnsupportedModel(f"{type(module).__name__} is not a linear layer")


def padded_linear(module: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """``module([x, 0, ..., 0])``, x zero-padded to the module's input width: only the first
    ``width`` input columns ever multiply x, so slicing them is the same map at a fraction of
    the work."""
    weight, bias = linear_weight(module)
    width = tokens.shape[-1]
    if weight.shape[1] < width:
        raise UnsupportedModel(
            f"{type(module).__name__} fc2 takes {weight.shape[1]} features, fewer than the "
            f"{width} of a token: the zero-padded FC2 input is undefined"
        )
    return F.linear(tokens, weight[:, :width], bias)


def check_fc1_mode(fc1: str) -> str:
    """Return ``fc1`` after checking it is one of :data:`vitplasticity.components.FC1_MODES`.

    Raises:
        ValueError: naming it and the valid modes.
    """
    if fc1 not in FC1_MODES:
        raise ValueError(f"unknown fc1 mode {fc1!r}; valid modes: {', '.join(FC1_MODES)}")
    return fc1


def has_submodule(module: nn.Module, path: str) -> bool:
    """Whether ``module`` has a submodule at the dotted ``path``."""
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def base_model_of(model: nn.Module) -> nn.Module | None:
    """The base model a transformers task class holds (``GPT2LMHeadModel.transformer``,
    ``LlamaForSequenceClassification.model``, ``ViTForImageClassification.vit``): the child
    its class's ``base_model_prefix`` names, as transformers' own ``base_model`` finds it.
    None for a model that holds none (a bare model is its own base model)."""
    prefix = getattr(model, "base_model_prefix", None)
    inner = getattr(model, prefix, None) if isinstance(prefix, str) and prefix else None
    return inner if isinstance(inner, nn.Module) and inner is not model else None


def bare_model_of(model: nn.Module, class_names: Collection[str]) -> nn.Module | None:
    """The bare model of one of ``class_names`` that ``model`` is or wraps (a task class's base
    model, :func:`base_model_of`); None when it is neither. Matched by the names in each
    class's MRO: transformers is optional and not imported to answer "no"."""
    for candidate in (model, base_model_of(model)):
        if candidate is not None and any(
            cls.__name__ in class_names for cls in type(candidate).__mro__
        ):
            return candidate
    return None


def wrapper_head(model: nn.Module, base: nn.Module) -> tuple[nn.Module, ...]:
    """What a class wrapping ``base`` adds to it: its children beside ``base`` that hold a
    parameter of their own (``lm_head``, ``score``, ``classifier``, ``qa_outputs``,
    ``visual_projection``). They belong to the head, which every configuration trains, as a
    vision tower's classifier does; a child whose parameters all are ``base``'s (an
    ``lm_head`` tied to the token embedding, trained by ``emb``) adds nothing. A parameter
    the wrapper holds outside its children is claimed by no one: the parameter map refuses
    the model, naming it."""
    if model is base:
        return ()
    inside = {id(p) for p in base.parameters()}
    return tuple(
        child
        for child in model.children()
        if child is not base and any(id(p) not in inside for p in child.parameters())
    )


class Architecture:
    """One model family: its blocks and components, its parameters, how it runs.

    Subclasses set the class attributes and implement the methods that raise
    ``NotImplementedError``; the rest have defaults that fit a pre-norm transformer block.
    """

    name: str = ""
    """Registry key, e.g. ``timm_vit``."""
    title: str = ""
    """What it covers, for messages and docs."""
    inputs: str = "images"
    """What a batch is: images (N, 3, H, W) or token ids (N, L)."""
    text_task: str = "causal"
    """How a text family finetunes on text (``vitplasticity finetune --text``): ``causal`` (a
    decoder: the next-token loss of its causal LM) or ``masked`` (an encoder: the masked-LM
    loss of its ``...ForMaskedLM`` class)."""

    # Build facts (transformers families): what vitplasticity.models.hf_build builds and
    # drops for the family's classes, read through ``declared``.
    model_types: tuple[str, ...] = ()
    """The config.json ``model_type`` values the family takes (a torch-free copy for the
    Snakefile: :data:`vitplasticity.models.registry.TRANSFORMERS_MODEL_TYPES`)."""
    default_classes: ClassVar[dict[str, str]] = {}
    """model_type -> the class built by default when it is not transformers' bare model."""
    dual_encoders: ClassVar[dict[str, str]] = {}
    """A tower's model_type -> that of the dual encoder whose checkpoint also holds it."""
    other_tower_keys: ClassVar[dict[str, tuple[str, ...]]] = {}
    """A dual encoder's model_type -> its tensors outside the tower, dropped on loading."""
    classifiers: ClassVar[dict[str, tuple[type | str, str]]] = {}
    """Tower class -> its classification class (a transformers name, or the family's own
    wrapper class taking (tower, num_classes)) and where that class holds the tower."""
    checkpoint_heads: ClassVar[dict[str, tuple[str, ...]]] = {}
    """Tower class -> a checkpoint's head tensors, dropped (the head is new)."""
    unused_modules: ClassVar[dict[str, str]] = {}
    """Class -> a child module no stage uses (BERT's pooler), which a checkpoint may lack: the
    model is then built without it, and the log says so."""
    tower_kwargs: ClassVar[dict[str, dict[str, Any]]] = {}
    """Class -> keyword arguments built into every model of it."""

    # --- what it is ---------------------------------------------------------------------------

    def matches(self, model: nn.Module) -> bool:
        """Whether ``model`` is of this family (by class; an optional library is not imported
        to answer no)."""
        raise NotImplementedError

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        """The model's blocks, unchecked."""
        raise NotImplementedError

    def check_block(self, block: nn.Module, index: int, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming what block ``index`` lacks or has unlike
        the family (the default checks that the components can be found)."""
        try:
            self.components(block)
        except (AttributeError, UnsupportedModel) as error:
            raise UnsupportedModel(
                f"block {index} of {type(model).__name__} is not a {self.title} block: {error}"
            ) from error

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`UnsupportedModel` naming what the model has, beside its blocks,
        unlike the family (parts it lacks, a setting no component accounts for); the default:
        nothing. :meth:`blocks` asks it first."""

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's blocks, after checking the model (:meth:`check_model`) and that each
        block has the five components.

        Raises:
            UnsupportedModel: naming what is missing or unlike the family.
        """
        self.check_model(model)
        blocks = list(self.block_list(model))
        if not blocks:
            raise UnsupportedModel(f"{type(model).__name__} has no blocks")
        for index, block in enumerate(blocks):
            self.check_block(block, index, model)
        return blocks

    # --- which parameters are whose -----------------------------------------------------------

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        """Per component (in :data:`COMPONENTS` order), the module(s) that are it in ``block``.

        Several modules share one input and their outputs are concatenated (a gated MLP's
        gate and up projections). ``fc1`` is one of :data:`FC1_MODES`; parameter ownership
        always uses the whole stage.
        """
        raise NotImplementedError

    def in_situ_parts(
        self, block: nn.Module, fc1: str = "stage"
    ) -> dict[str, tuple[tuple[nn.Module, nn.Module], ...]]:
        """Per component (in :data:`COMPONENTS` order), where the in-situ protocol reads each
        of its parts: the module whose input is the part's input and the module whose output
        is the part's output. The default: each module of :meth:`components` is one part, read
        at its own input and output. A component made of modules run one after the other (a
        post-norm encoder's attention: the self-attention, then its output projection) is one
        part read from the first module's input to the last one's output."""
        return {
            component: tuple((module, module) for module in modules)
            for component, modules in self.components(block, fc1).items()
        }

    def embedding(self, model: nn.Module) -> Owned:
        """What the ``emb`` configuration trains: patch/token embedding, tokens, positions."""
        raise NotImplementedError

    def head(self, model: nn.Module) -> Owned:
        """The classifier head, its pooling and the final norm: trained by every configuration."""
        raise NotImplementedError

    def declared(self, model: nn.Module) -> list[Declared]:
        """The family's other parameters, each with the configuration that trains it."""
        return []

    # --- how it runs --------------------------------------------------------------------------

    def check_batch(self, batch: Any, name: str) -> None:
        """Raise ValueError (naming ``name``) unless ``batch`` is one batch of inputs: images
        (N, 3, H, W), or integer token ids (N, L) for a family whose ``inputs`` are tokens."""
        if self.inputs == "tokens":
            if (
                not isinstance(batch, torch.Tensor)
                or batch.ndim != 2
                or batch.dtype.is_floating_point
                or batch.dtype == torch.bool
            ):
                shape = (
                    f"{tuple(batch.shape)} {batch.dtype}"
                    if isinstance(batch, torch.Tensor)
                    else type(batch)
                )
                raise ValueError(
                    f"{name}: expected token-id batches (N, L) of integers, got {shape}"
                )
        elif not isinstance(batch, torch.Tensor) or batch.ndim != 4 or batch.shape[1] != 3:
            shape = tuple(batch.shape) if isinstance(batch, torch.Tensor) else type(batch)
            raise ValueError(f"{name}: expected image batches (N, 3, H, W), got {shape}")

    def to_device(self, batch: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Any:
        """The batch on the model's device: images in the model's dtype, token ids as ids
        (int64) whatever the model's dtype."""
        if self.inputs == "tokens":
            return batch.to(device=device, dtype=torch.long)
        return batch.to(device=device, dtype=dtype)

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """The embedding output of ``inputs``: what the first block receives."""
        raise NotImplementedError

    def logits(self, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """The classifier's logits (B, classes) of a model with a classification head: what
        finetuning and the recommend criteria run (the default: ``model(inputs)``, a timm
        model's forward)."""
        return model(inputs)

    def classifier(self, model: nn.Module) -> nn.Module:
        """The classification head alone (the linear map of the pooled features), which the
        recommend head warm-up trains (the default: timm's ``get_classifier()``).

        Raises:
            UnsupportedModel: for a model without one.
        """
        get_classifier = getattr(model, "get_classifier", None)
        if get_classifier is None:
            raise UnsupportedModel(f"{type(model).__name__} has no classifier head")
        return get_classifier()

    def attend(
        self, attention: nn.Module, tokens: torch.Tensor, embedded: Embedded, index: int
    ) -> torch.Tensor:
        """The attention module alone on ``tokens`` (no norm before it, no residual), with
        what block ``index`` gives it beside them (rotary positions, a mask)."""
        return attention(tokens)

    def hook_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        """The tokens a component's module was called with: its first argument (some blocks
        pass them to their attention by keyword)."""
        return args[0]

    def hook_output(self, output: Any) -> torch.Tensor:
        """The tensor a component's module returns (some return a tuple)."""
        return output

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        """One real forward pass of block ``index`` (the in-situ protocol)."""
        return block(tokens)

    def in_situ_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        """Block ``index`` as the in-situ protocol runs it, calling every component's modules
        so that their hooks see what reaches them; the default: :meth:`run_block`. A family
        whose component is a view the model does not hold (an MoE's routed FC1 and FC2) runs
        :meth:`compose_block` on its components, which the contract checks against
        :meth:`run_block`."""
        return self.run_block(block, index, tokens, embedded)

    def attention_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        """What the block does to its attention's output before the residual sum (LayerScale,
        dropout, a post-norm); the default: nothing."""
        return out

    def mlp_branch(self, block: nn.Module, out: torch.Tensor) -> torch.Tensor:
        """What the block does to its MLP's output before the residual sum."""
        return out

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        """The block's MLP on ``x`` from its mapped FC1 and FC2 and its own activation."""
        raise NotImplementedError

    def compose_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        """``block(tokens)`` rebuilt from the mapped ``components`` and the family's block
        structure: the pre-norm block ``x + attention_branch(attn(ln1(x)))`` then ``x +
        mlp_branch(mlp(ln2(x)))``. The contract test compares it with :meth:`run_block`, so a
        wrong mapping cannot pass."""
        (ln1,), (mha,), (ln2,), fc1, fc2 = (components[c] for c in COMPONENTS)
        x = tokens + self.attention_branch(block, self.attend(mha, ln1(tokens), embedded, index))
        return x + self.mlp_branch(block, self.mlp(block, fc1, fc2, ln2(x)))

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded, fc1: str = "stage"
    ) -> tuple[Parts, ...]:
        """ln1, mha, ln2, fc1, fc2 of block ``index`` applied to the embedding output (the
        embedding protocol): MHA without the norm before it or the residual, FC1 without its
        activation, FC2 on the tokens zero-padded to its input width."""
        tokens = embedded.tokens
        parts = self.components(block, fc1)
        (ln1,), (mha,), (ln2,), fc1_modules, (fc2,) = (parts[c] for c in COMPONENTS)
        return (
            (ln1(tokens),),
            (self.attend(mha, tokens, embedded, index),),
            (ln2(tokens),),
            tuple(module(tokens) for module in fc1_modules),
            (padded_linear(fc2, tokens),),
        )

    # --- other stages -------------------------------------------------------------------------

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        """Per-head Q, K, V, O of an attention module, for the paper's MHA bound.

        Raises:
            UndefinedStage: naming why the bound does not apply to this family.
        """
        raise UndefinedStage(f"{self.title}: the MHA bound is not implemented")

    def mha_weights(self, modules: tuple[nn.Module, ...]) -> AttentionWeights:
        """Per-head Q, K, V, O of one block's MHA component (its modules, as
        :meth:`components` maps them); the default: :meth:`attention_weights` of its one
        attention module."""
        return self.attention_weights(modules[0])

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        """Why the paper's MHA bound does not hold for ``model`` (None: it does)."""
        return None

    def weight_offsets(self, model: nn.Module) -> dict[nn.Parameter, float]:
        """The parameters of ``model`` that its layers apply as ``offset + weight``, not as
        ``weight`` (Gemma's RMSNorm gains: ``1 + weight``), each with its offset: a criterion
        relative to a weight's size takes the size of what is applied. The default: none."""
        return {}

    def lora_targets(self, model: nn.Module) -> list[str]:
        """Fully qualified names of the linear modules LoRA adapts (:meth:`lora_linears` of
        every block), in ``named_modules`` order."""
        targets = {
            id(module) for block in self.block_list(model) for module in self.lora_linears(block)
        }
        return [name for name, module in model.named_modules() if id(module) in targets]

    def lora_linears(self, block: nn.Module) -> Sequence[nn.Module]:
        """The linear modules of ``block`` that LoRA adapts (the default: every Linear or
        Conv1D of its attention module)."""
        return [
            module
            for module in self.components(block)["mha"][0].modules()
            if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"
        ]

    def prepare_lora(self, model: nn.Module) -> None:
        """Make every :meth:`lora_targets` module one the forward pass calls (the default: they
        already are), before peft wraps them."""

    def refusal(self, stage: str, model: nn.Module) -> str | None:
        """Why ``stage`` (plasticity, bounds, finetune, recommend, lora; export: recommend's
        PEFT and trainer export of a configuration) is not defined for ``model`` (None: it
        is)."""
        return None

    # --- cost ---------------------------------------------------------------------------------

    def train_flops_per_image(self, model: nn.Module, inputs: torch.Tensor) -> int:
        """Training FLOPs of one input: the embedding and every block, forward and backward,
        every parameter trained (``full``, the most a configuration trains), averaged over
        the batch ``inputs``.

        Counted by ``torch.utils.flop_counter`` (matrix products and convolutions, 2 FLOPs per
        multiply-add; norms, activations and softmax are not counted), with attention on
        torch's math kernel: the fused kernels do the same products, but the counter sees
        none of the CPU one's. The head (a linear map of the pooled features) is left out. On
        the meta device (model and inputs) it takes no memory and no arithmetic: the runtime
        estimate counts a 7B model so in seconds. The model's parameters are left as they were.
        """
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.utils.flop_counter import FlopCounterMode

        frozen = [p for p in model.parameters() if not p.requires_grad]
        for parameter in frozen:
            parameter.requires_grad_(True)
        try:
            with (
                FlopCounterMode(display=False) as counter,
                sdpa_kernel([SDPBackend.MATH]),
                torch.enable_grad(),
            ):
                embedded = self.embed(model, inputs)
                tokens = embedded.tokens
                for index, block in enumerate(self.blocks(model)):
                    tokens = self.run_block(block, index, tokens, embedded)
                # Gradients returned, not accumulated: no parameter's .grad changes.
                torch.autograd.grad(tokens.sum(), list(model.parameters()), allow_unused=True)
        finally:
            for parameter in frozen:
                parameter.requires_grad_(False)
        return counter.get_total_flops() // len(inputs)
