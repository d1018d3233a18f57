"""The LoRA baseline (the paper: rank 8, alpha 16, on the attention linears; docs/protocol.md).

``apply_lora`` injects peft LoRA adapters in place (``peft.inject_adapter_in_model``: the model
keeps its class, forward and parameter names, plus ``...qkv.lora_A.default.weight`` and the
like), so that the "lora" finetuning configuration trains exactly the adapters plus, as every
configuration does, the new classifier head and the final norm
(:func:`vitplasticity.components.trainable_parameter_names`).

``peft`` is the optional extra ``vitplasticity[extras]``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from vitplasticity.adapters import EXTRA_HINT
from vitplasticity.components import LORA_MARKER

ATTENTION_LINEARS = r"blocks\.\d+\.attn\.(qkv|proj)"
"""peft target (a full-match regex): every block's attention linears of a timm ViT, and not
``patch_embed.proj`` (which a plain ["qkv", "proj"] suffix list would also catch)."""


def require_peft() -> Any:
    """The ``peft`` module.

    Raises:
        ImportError: naming the optional extra when peft is not installed.
    """
    try:
        import peft
    except ImportError as error:
        raise ImportError(
            f"the 'lora' configuration needs the 'peft' package: {EXTRA_HINT}"
        ) from error
    return peft


def apply_lora(
    model: nn.Module, rank: int, alpha: float, target_modules: str = ATTENTION_LINEARS
) -> nn.Module:
    """Inject LoRA adapters (``W x + (alpha / rank) B A x``, B = 0 at init) into ``model``.

    The adapters' A matrices are drawn from torch's global RNG: seed it first for a
    reproducible run. No dropout on the adapters (peft's default).

    Args:
        model: a timm VisionTransformer (modified in place and returned).
        rank: LoRA rank r (paper: 8).
        alpha: LoRA alpha (paper: 16); the update is scaled by alpha / r.
        target_modules: peft full-match regex of the module names to adapt.

    Raises:
        ImportError: naming the optional extra when peft is missing.
        ValueError: for a rank < 1, an alpha <= 0, or a target that matches no module.
    """
    if rank < 1:
        raise ValueError(f"LoRA rank (finetune.lora.rank) must be >= 1, got {rank}")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha (finetune.lora.alpha) must be > 0, got {alpha}")
    peft = require_peft()
    config = peft.LoraConfig(
        r=int(rank), lora_alpha=float(alpha), lora_dropout=0.0, target_modules=target_modules
    )
    try:
        model = peft.inject_adapter_in_model(config, model)
    except ValueError as error:  # peft: "Target modules ... not found in the base model"
        raise ValueError(
            f"LoRA targets {target_modules!r} match no module of {type(model).__name__}: {error}"
        ) from error
    return model


def lora_parameter_names(model: nn.Module) -> set[str]:
    """Names of the LoRA adapter parameters in ``model`` (empty when none was injected)."""
    return {name for name, _ in model.named_parameters() if LORA_MARKER in name}
