"""One adapter per architecture: where its five components (ln1, mha, ln2, fc1, fc2) are, what
its embedding output is, and how to run one of its blocks (docs/protocol.md, "Plasticity").

The plasticity measurement (:mod:`vitplasticity.plasticity`) only talks to an :class:`Adapter`:

- :class:`TimmViT`: timm ``VisionTransformer`` (``blocks.N.{norm1, attn, norm2, mlp.fc1,
  mlp.fc2}``), the paper's ViT-B/L/H.
- :class:`TimmDinoV3`: timm ``Eva`` models, the ``vit_*_patch16_dinov3`` family. The embedding
  is the patch tokens after the cls and register tokens are prepended (DINOv3 has no absolute
  position embedding); positions enter through the rotary embedding that ``Eva._pos_embed``
  returns and every block's ``attn(x, rope=...)`` applies to q and k. MHA is therefore
  ``attn(x, rope)``: the attention of x *at those positions*, without norm1, layer scale or
  residual. The MLP is plain (``fc1``, S/B/L) or gated (SwiGLU ``fc1_g``/``fc1_x``: S+, H+, 7B).
  For a gated MLP, FC1 is the concatenation ``[fc1_g(x), fc1_x(x)]`` of the two
  pre-activations: that is the MLP's first *linear* stage (one (2h x d) matrix, exactly timm's
  packed ``GluMlp.fc1`` and DINOv3's ``w12``), so FC1 stays a linear map without activation as
  in the paper, and its bound is that matrix's spectral norm. The product ``silu(g) * x`` would
  fold the activation in, which the paper's FC1 excludes. ||[a, b]||_F^2 = ||a||^2 + ||b||^2,
  so the norm of the concatenation is combined from the two parts' norms.
- :class:`HFGPT2`: transformers ``GPT2Model`` (``h.N.{ln_1, attn, ln_2, mlp.c_fc,
  mlp.c_proj}``; Conv1D weights are (in, out)). Inputs are token ids (N, L); the embedding is
  ``wte(ids) + wpe(positions)``; MHA is ``attn(x)`` with the causal mask; FC2 is
  ``c_proj([x, 0, 0, 0])``, i.e. the first d *rows* of the Conv1D weight.

``transformers`` is the optional extra ``vitplasticity[extras]``; it is imported only when a
GPT2 model is built or met.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitplasticity.components import block_modules

EXTRA_HINT = "install the optional extra: pip install 'vitplasticity[extras]'"
"""How to get transformers and peft, quoted in every error about them."""

Parts = tuple[torch.Tensor, ...]
"""A component's output as one or more tensors whose feature-wise concatenation it is."""


def require_transformers() -> Any:
    """The ``transformers`` module.

    Raises:
        ImportError: naming the optional extra when transformers is not installed.
    """
    try:
        import transformers
    except ImportError as error:
        raise ImportError(f"GPT2 models need the 'transformers' package: {EXTRA_HINT}") from error
    return transformers


@dataclass(frozen=True)
class Embedded:
    """What the first block receives: tokens (B, n, d) and what each block needs beside them."""

    tokens: torch.Tensor
    context: Any = None  # rotary embedding (DINOv3), causal mask (GPT2), None (ViT)


class Adapter:
    """The five components of one architecture's blocks, its embedding and its inputs."""

    name: str = ""
    inputs: str = "images"  # what a batch is: images (N, 3, H, W) or token ids (N, L)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The model's blocks, after checking each has the five components.

        Raises:
            ValueError: naming what is missing.
        """
        raise NotImplementedError

    def check_batch(self, batch: Any, name: str) -> None:
        """Raise ValueError (naming ``name``) unless ``batch`` is one batch of inputs."""
        if not isinstance(batch, torch.Tensor) or batch.ndim != 4 or batch.shape[1] != 3:
            shape = tuple(batch.shape) if isinstance(batch, torch.Tensor) else type(batch)
            raise ValueError(f"{name}: expected image batches (N, 3, H, W), got {shape}")

    def to_device(self, batch: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Any:
        """The batch on the model's device, images in the model's dtype."""
        return batch.to(device=device, dtype=dtype)

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        """The embedding output of ``inputs``: what the first block receives."""
        raise NotImplementedError

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded
    ) -> tuple[Parts, ...]:
        """ln1, mha, ln2, fc1, fc2 of block ``index`` applied to the embedding (that protocol)."""
        raise NotImplementedError

    def in_situ_modules(self, block: nn.Module) -> dict[str, tuple[nn.Module, ...]]:
        """Per component, the module(s) whose input and output the in-situ protocol records;
        several modules share one input and their outputs are concatenated (gated fc1)."""
        raise NotImplementedError

    def hook_output(self, output: Any) -> torch.Tensor:
        """The tensor a component's module returns (some return a tuple)."""
        return output

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        """One real forward pass of block ``index`` (the in-situ protocol)."""
        return block(tokens)


def _padded_linear(tokens: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """``linear([x, 0, ..., 0])`` for an (out, in) weight, in >= width: only the first ``width``
    input columns ever multiply x, so slicing them is the same map at a fraction of the work."""
    return F.linear(tokens, weight[:, : tokens.shape[-1]], bias)


def _check_fc2_width(index: int, fc2: nn.Module, width: int, in_features: int) -> None:
    if in_features < width:
        raise ValueError(
            f"block {index}: {type(fc2).__name__} fc2 takes {in_features} features, fewer than "
            f"the {width} of a token: the zero-padded FC2 input is undefined"
        )


# ---------------------------------------------------------------------------------------------
# timm VisionTransformer (the paper's ViTs)


class TimmViT(Adapter):
    """timm ``VisionTransformer``: ``patch_embed`` + ``_pos_embed`` (cls token, positions)."""

    name = "timm_vit"

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        missing = [
            name
            for name in ("patch_embed", "_pos_embed", "patch_drop", "norm_pre", "blocks")
            if not hasattr(model, name)
        ]
        if missing:
            raise ValueError(
                f"{type(model).__name__} is not a timm VisionTransformer: it lacks {missing}"
            )
        blocks = list(model.blocks)
        if not blocks:
            raise ValueError(f"{type(model).__name__} has no blocks")
        for index, block in enumerate(blocks):
            try:
                modules = block_modules(block)
            except AttributeError as error:
                raise ValueError(
                    f"block {index} of {type(model).__name__} is not a timm ViT block: {error}"
                ) from error
            if not isinstance(modules["fc2"], nn.Linear):
                raise ValueError(
                    f"block {index}: mlp.fc2 is {type(modules['fc2']).__name__}, not Linear"
                )
        return blocks

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # patch_drop and norm_pre are identities in the paper's models.
        tokens = model._pos_embed(model.patch_embed(inputs))
        return Embedded(model.norm_pre(model.patch_drop(tokens)))  # (B, n, d)

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded
    ) -> tuple[Parts, ...]:
        tokens = embedded.tokens
        modules = block_modules(block)
        fc2 = modules["fc2"]
        return (
            (modules["ln1"](tokens),),
            (modules["mha"](tokens),),
            (modules["ln2"](tokens),),
            (modules["fc1"](tokens),),
            (_padded_linear(tokens, fc2.weight, fc2.bias),),
        )

    def in_situ_modules(self, block: nn.Module) -> dict[str, tuple[nn.Module, ...]]:
        return {name: (module,) for name, module in block_modules(block).items()}


# ---------------------------------------------------------------------------------------------
# timm Eva: the DINOv3 family (rotary positions, plain or gated MLP)


def _dinov3_fc1(mlp: nn.Module) -> tuple[nn.Module, ...]:
    """The MLP's first linear stage: (fc1_g, fc1_x) of a SwiGLU, else (fc1,) (plain or packed)."""
    if hasattr(mlp, "fc1_g") and hasattr(mlp, "fc1_x"):
        return (mlp.fc1_g, mlp.fc1_x)
    return (mlp.fc1,)


class TimmDinoV3(Adapter):
    """timm ``Eva`` (``vit_*_patch16_dinov3``): rotary position embedding passed to attention."""

    name = "timm_dinov3"

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        if getattr(model, "rope_mixed", False):
            raise ValueError(
                f"{type(model).__name__} uses per-block ('mixed') rotary embeddings: not a "
                "DINOv3 model (rope_type 'dinov3'), not supported"
            )
        blocks = list(model.blocks)
        if not blocks:
            raise ValueError(f"{type(model).__name__} has no blocks")
        for index, block in enumerate(blocks):
            missing = [
                path
                for path in ("norm1", "attn", "norm2", "mlp", "mlp.fc2")
                if not _has_submodule(block, path)
            ]
            if not missing and not (
                _has_submodule(block, "mlp.fc1")
                or (_has_submodule(block, "mlp.fc1_g") and _has_submodule(block, "mlp.fc1_x"))
            ):
                missing.append("mlp.fc1 (or mlp.fc1_g + mlp.fc1_x)")
            if missing:
                raise ValueError(
                    f"block {index} of {type(model).__name__} is not an Eva/DINOv3 block: it "
                    f"lacks {missing}"
                )
            fc2 = block.mlp.fc2
            if not isinstance(fc2, nn.Linear):
                raise ValueError(f"block {index}: mlp.fc2 is {type(fc2).__name__}, not Linear")
            _check_fc2_width(index, fc2, model.embed_dim, fc2.in_features)
        return blocks

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        # Patch tokens, then cls + register tokens prepended (and an absolute position embedding
        # where the model has one; DINOv3 has none); the rotary embedding of the patch grid
        # comes back beside them. norm_pre is an identity in DINOv3.
        tokens, rope = model._pos_embed(model.patch_embed(inputs))
        return Embedded(model.norm_pre(tokens), rope)  # (B, n, d), (n_patches, 2 * d_head)

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded
    ) -> tuple[Parts, ...]:
        tokens, rope = embedded.tokens, embedded.context
        fc2 = block.mlp.fc2
        return (
            (block.norm1(tokens),),
            (block.attn(tokens, rope=rope),),
            (block.norm2(tokens),),
            tuple(linear(tokens) for linear in _dinov3_fc1(block.mlp)),
            (_padded_linear(tokens, fc2.weight, fc2.bias),),
        )

    def in_situ_modules(self, block: nn.Module) -> dict[str, tuple[nn.Module, ...]]:
        return {
            "ln1": (block.norm1,),
            "mha": (block.attn,),
            "ln2": (block.norm2,),
            "fc1": _dinov3_fc1(block.mlp),
            "fc2": (block.mlp.fc2,),
        }

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        return block(tokens, rope=embedded.context)


# ---------------------------------------------------------------------------------------------
# transformers GPT2Model (text)


def _causal_mask(length: int, tokens: torch.Tensor) -> torch.Tensor:
    """Additive causal mask (1, 1, L, L): 0 on and below the diagonal, the dtype's min above.

    Passed explicitly so that every attention implementation (eager adds it, SDPA takes it)
    is causal; without a mask the eager one would attend to the future.
    """
    blocked = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)
    mask = torch.zeros(length, length, dtype=tokens.dtype, device=tokens.device)
    return mask.masked_fill(blocked, torch.finfo(tokens.dtype).min)[None, None]


class HFGPT2(Adapter):
    """transformers ``GPT2Model``: token + position embedding, causal attention, Conv1D MLP."""

    name = "hf_gpt2"
    inputs = "tokens"

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        missing = [name for name in ("wte", "wpe", "drop", "h") if not hasattr(model, name)]
        if missing:
            raise ValueError(f"{type(model).__name__} is not a GPT2Model: it lacks {missing}")
        blocks = list(model.h)
        if not blocks:
            raise ValueError(f"{type(model).__name__} has no blocks")
        width = model.wte.embedding_dim
        for index, block in enumerate(blocks):
            missing = [
                path
                for path in ("ln_1", "attn", "ln_2", "mlp.c_fc", "mlp.c_proj")
                if not _has_submodule(block, path)
            ]
            if missing:
                raise ValueError(f"block {index} of the GPT2 model lacks {missing}")
            c_proj = block.mlp.c_proj
            _check_fc2_width(index, c_proj, width, c_proj.weight.shape[0])  # Conv1D: (in, out)
        return blocks

    def check_batch(self, batch: Any, name: str) -> None:
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
            raise ValueError(f"{name}: expected token-id batches (N, L) of integers, got {shape}")

    def to_device(self, batch: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Any:
        return batch.to(device=device, dtype=torch.long)

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        length = inputs.shape[1]
        if length > model.wpe.num_embeddings:
            raise ValueError(
                f"sequences of {length} tokens exceed the model's {model.wpe.num_embeddings} "
                "positions"
            )
        positions = torch.arange(length, device=inputs.device)[None]  # (1, L)
        tokens = model.drop(model.wte(inputs) + model.wpe(positions))  # (B, L, d)
        return Embedded(tokens, _causal_mask(length, tokens))

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded
    ) -> tuple[Parts, ...]:
        tokens = embedded.tokens
        c_proj = block.mlp.c_proj
        # Conv1D computes x @ W + b with W (in, out): the padded input meets its first d rows.
        fc2 = torch.addmm(
            c_proj.bias, tokens.reshape(-1, tokens.shape[-1]), c_proj.weight[: tokens.shape[-1]]
        ).view(*tokens.shape[:-1], -1)
        return (
            (block.ln_1(tokens),),
            (block.attn(tokens, attention_mask=embedded.context)[0],),
            (block.ln_2(tokens),),
            (block.mlp.c_fc(tokens),),
            (fc2,),
        )

    def in_situ_modules(self, block: nn.Module) -> dict[str, tuple[nn.Module, ...]]:
        return {
            "ln1": (block.ln_1,),
            "mha": (block.attn,),
            "ln2": (block.ln_2,),
            "fc1": (block.mlp.c_fc,),
            "fc2": (block.mlp.c_proj,),
        }

    def hook_output(self, output: Any) -> torch.Tensor:
        return output[0] if isinstance(output, tuple) else output  # attn: (output, weights)

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        out = block(tokens, attention_mask=embedded.context)
        return out[0] if isinstance(out, tuple) else out


# ---------------------------------------------------------------------------------------------
# Dispatch


def _has_submodule(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _is_eva(model: nn.Module) -> bool:
    from timm.models.eva import Eva

    return isinstance(model, Eva)


def _is_gpt2(model: nn.Module) -> bool:
    # By class name: transformers is optional and must not be imported to answer "no".
    return any(cls.__name__ == "GPT2Model" for cls in type(model).__mro__)


_ADAPTERS: tuple[tuple[Callable[[nn.Module], bool], Adapter], ...] = (
    (_is_gpt2, HFGPT2()),
    (_is_eva, TimmDinoV3()),
)


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter of ``model``'s architecture: GPT2Model, timm Eva (DINOv3), else timm ViT.

    A model none of them knows fails in :meth:`TimmViT.blocks`, which names what it lacks.
    """
    for matches, adapter in _ADAPTERS:
        if matches(model):
            return adapter
    return TimmViT()


# ---------------------------------------------------------------------------------------------
# Building a GPT2 model from a config entry


GPT2_KEYS = frozenset({"family", "hf_id", "weights", "config", "tokenizer"})
"""Keys of a text model's config entry (``family: gpt2``)."""


def is_text_model(entry: dict[str, Any]) -> bool:
    """Whether a config model entry names a transformers text model (``family: gpt2``)."""
    return entry.get("family") == "gpt2"


def build_gpt2(entry: dict[str, Any]) -> nn.Module:
    """The ``GPT2Model`` of a config entry, in eval mode.

    Entry keys: ``family: gpt2``; ``hf_id`` (e.g. "gpt2", the 124M model); ``weights``:
    "hub" (``from_pretrained(hf_id)``), "random" (``GPT2Config(**config)``, no download) or a
    local folder holding a saved model; ``config``: GPT2Config overrides (a tiny model for
    tests); ``tokenizer``: "hub" (the hf_id's tokenizer) or a local folder (optional).

    Raises:
        ImportError: naming the optional extra when transformers is missing.
        ValueError: for an unknown key or weights value, naming it.
    """
    unknown = set(entry) - GPT2_KEYS
    if unknown:
        raise ValueError(f"unknown text-model keys {sorted(unknown)}; known: {sorted(GPT2_KEYS)}")
    transformers = require_transformers()
    weights = entry.get("weights", "hub")
    overrides = dict(entry.get("config") or {})
    # Eager attention: the explicit causal mask of _causal_mask is the mask every kernel gets.
    overrides.setdefault("attn_implementation", "eager")
    if weights == "random":
        model = transformers.GPT2Model(transformers.GPT2Config(**overrides))
    elif weights == "hub":
        model = transformers.GPT2Model.from_pretrained(entry.get("hf_id", "gpt2"), **overrides)
    elif Path(weights).is_dir():
        model = transformers.GPT2Model.from_pretrained(weights, **overrides)
    else:
        raise FileNotFoundError(
            f"text model weights {weights!r}: not 'hub', 'random' nor a saved model folder"
        )
    return model.eval()
