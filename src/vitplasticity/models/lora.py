"""The LoRA baseline (the paper: rank 8, alpha 16, on the attention linears; docs/protocol.md).

``apply_lora`` injects peft LoRA adapters in place (``peft.inject_adapter_in_model``: the model
keeps its class, forward and parameter names, plus ``...qkv.lora_A.default.weight`` and the
like) into the modules the model's architecture names
(:meth:`vitplasticity.models.architectures.Architecture.lora_targets`), so that the "lora" finetuning
configuration trains exactly the adapters plus, as every configuration does, the new
classifier head and the final norm (:class:`vitplasticity.models.architectures.ParameterMap`).

``peft`` is the optional extra ``vitplasticity[extras]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitplasticity.models.architectures import UnsupportedModel, architecture_for
from vitplasticity.utils.optional import require_peft


def _adapted_modules(model: nn.Module) -> list[str]:
    """Names of the modules peft put LoRA adapters on, in ``named_modules`` order."""
    from peft.tuners.lora import LoraLayer

    return [name for name, module in model.named_modules() if isinstance(module, LoraLayer)]


def apply_lora(
    model: nn.Module, rank: int, alpha: float, target_modules: Sequence[str] | None = None
) -> nn.Module:
    """Inject LoRA adapters (``W x + (alpha / rank) B A x``, B = 0 at init) into ``model``.

    The adapters' A matrices are drawn from torch's global RNG, one module after another in
    ``named_modules`` order: seed it first for a reproducible run. No dropout on the adapters
    (peft's default).

    Args:
        model: a model of a known architecture (modified in place and returned).
        rank: LoRA rank r (paper: 8).
        alpha: LoRA alpha (paper: 16); the update is scaled by alpha / r.
        target_modules: fully qualified names of the modules to adapt; by default the
            architecture's :meth:`~vitplasticity.models.architectures.Architecture.lora_targets`
            (every block's attention linears).

    Raises:
        ImportError: naming the optional extra when peft is missing.
        UnsupportedModel: for a model no architecture knows (naming its class and the known
            families).
        ValueError: for a rank < 1, an alpha <= 0, or a target that names no module (or
            adapts another module than those named).
    """
    if rank < 1:
        raise ValueError(f"LoRA rank (finetune.lora.rank) must be >= 1, got {rank}")
    if not alpha > 0:
        raise ValueError(f"LoRA alpha (finetune.lora.alpha) must be > 0, got {alpha}")
    peft = require_peft()
    targets = _lora_targets(model, target_modules)
    config = peft.LoraConfig(
        r=int(rank), lora_alpha=float(alpha), lora_dropout=0.0, target_modules=targets
    )
    model = peft.inject_adapter_in_model(config, model)
    # peft matches a listed name as a suffix too: a model holding the same path deeper down
    # would get adapters nobody asked for.
    adapted = _adapted_modules(model)
    if sorted(adapted) != sorted(targets):
        raise ValueError(
            f"LoRA on {type(model).__name__}: peft adapted {adapted}, not the targets {targets}"
        )
    return model


def _lora_targets(model: nn.Module, target_modules: Sequence[str] | None) -> list[str]:
    """The modules to adapt: ``target_modules``, or the architecture's (after its
    ``prepare_lora``), each checked to name a module of ``model``.

    Raises:
        ValueError: for one string instead of a list, or a target that names no module.
    """
    if isinstance(target_modules, str):
        raise ValueError(
            f"LoRA targets {target_modules!r}: give a list of module names, not one string"
        )
    architecture = architecture_for(model)
    architecture.prepare_lora(model)  # e.g. Eva/Beit: the attention then calls qkv(x)
    if target_modules is None:
        target_modules = architecture.lora_targets(model)
    targets = list(target_modules)
    modules = dict(model.named_modules())
    missing = [name for name in targets if name not in modules]
    if not targets or missing:
        raise ValueError(
            f"LoRA targets {missing or targets!r} match no module of {type(model).__name__}"
        )
    return targets


def check_adapters_used(model: nn.Module, inputs: torch.Tensor) -> None:
    """Check that a forward pass of ``inputs`` goes through every LoRA adapter of ``model``.

    An attention that multiplies by its linear's ``weight`` itself (timm's Eva and Beit with
    q/v biases compute ``F.linear(x, qkv.weight, qkv_bias)`` unless the architecture's
    ``prepare_lora`` switched them to ``qkv(x) + bias``) bypasses the adapter peft wrapped
    around that linear: the adapter would get no gradient and LoRA would silently train
    less than it says. The pass runs in eval mode without gradient (no dropout, so no draw
    from the RNG) and leaves the model's mode as it was. It is the model's own forward,
    ``model(inputs)``, not its logits: its output is not used, and the model may be a bare
    tower (no classifier) or a peft ``PeftModel`` (no architecture); a transformers
    classification class takes the pixels as its first argument.

    Raises:
        UnsupportedModel: naming the adapted modules the forward pass never calls.
    """
    called: set[str] = set()
    adapted = _adapted_modules(model)
    modules = dict(model.named_modules())
    handles = [
        modules[name].register_forward_hook(lambda *_, name=name: called.add(name))
        for name in adapted
    ]
    training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(training)
    bypassed = [name for name in adapted if name not in called]
    if bypassed:
        shown = ", ".join(bypassed[:4]) + (" ..." if len(bypassed) > 4 else "")
        raise UnsupportedModel(
            f"LoRA on {type(model).__name__}: its forward pass never calls the adapted "
            f"{shown} (it reads their weight itself), so {len(bypassed)} of "
            f"{len(adapted)} adapters would train nothing; the lora configuration is not "
            "defined for this model"
        )
