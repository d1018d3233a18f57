"""The shared vocabulary: which module of a timm ViT block is ln1/mha/ln2/fc1/fc2, and what
each finetuning configuration trains.

timm names (docs/protocol.md): ``blocks.N.{norm1, attn.{qkv, proj}, norm2, mlp.{fc1, act, fc2}}``
inside each block, and ``patch_embed, cls_token, pos_embed, norm, head`` at the top.
"""

from __future__ import annotations

from torch import nn

from vitplasticity import COMPONENTS

# Module path inside a block for each component.
BLOCK_MODULES: dict[str, str] = {
    "ln1": "norm1",
    "mha": "attn",
    "ln2": "norm2",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
}

# Parameter-name prefixes inside a block that each component trains. "mha" is the two
# attention linears (qkv and proj), as in the paper.
_BLOCK_PARAMETER_PREFIXES: dict[str, tuple[str, ...]] = {
    "ln1": ("norm1.",),
    "mha": ("attn.qkv.", "attn.proj."),
    "ln2": ("norm2.",),
    "fc1": ("mlp.fc1.",),
    "fc2": ("mlp.fc2.",),
}

EMBEDDING_PREFIXES: tuple[str, ...] = ("patch_embed.", "cls_token", "pos_embed", "reg_token")
"""Top-level parameters of the "emb" configuration: patch embedding, cls token, positions."""

ALWAYS_TRAINED_PREFIXES: tuple[str, ...] = ("head.", "norm.", "fc_norm.")
"""The new classifier head and the final norm: trained in every configuration."""

CONFIGURATIONS: tuple[str, ...] = ("full", "emb", *COMPONENTS, "head", "lora")
"""Single-component finetuning configurations; "head" is linear probing (head + final norm);
"lora" the LoRA baseline (adapters on the attention linears, see vitplasticity.lora)."""

LORA_MARKER = ".lora_"
"""In the name of every LoRA adapter parameter (peft's lora_A / lora_B); vitplasticity.lora."""


def block_modules(block: nn.Module) -> dict[str, nn.Module]:
    """Map each component name to its module inside one timm ViT block."""
    return {name: block.get_submodule(path) for name, path in BLOCK_MODULES.items()}


def parse_configuration(configuration: str) -> tuple[str, ...]:
    """Split a configuration ("mha" or a combination "mha+fc1") into its known parts.

    Raises:
        ValueError: if a part is not a known configuration, listing the valid ones.
    """
    parts = tuple(part.strip() for part in configuration.split("+"))
    unknown = [part for part in parts if part not in CONFIGURATIONS]
    if not configuration or unknown:
        raise ValueError(
            f"unknown finetuning configuration {configuration!r}: valid configurations are "
            f"{', '.join(CONFIGURATIONS)} (combine with '+', e.g. 'mha+fc1')"
        )
    return parts


def _is_trained(name: str, parts: tuple[str, ...]) -> bool:
    if "full" in parts or name.startswith(ALWAYS_TRAINED_PREFIXES):
        return True
    if "emb" in parts and name.startswith(EMBEDDING_PREFIXES):
        return True
    if "lora" in parts and LORA_MARKER in name:
        return True
    if name.startswith("blocks."):
        # blocks.<index>.<rest>
        rest = name.split(".", 2)[2]
        return any(
            rest.startswith(_BLOCK_PARAMETER_PREFIXES[part])
            for part in parts
            if part in _BLOCK_PARAMETER_PREFIXES
        )
    return False


def trainable_parameter_names(model: nn.Module, configuration: str) -> set[str]:
    """Names of the parameters that ``configuration`` trains in a timm VisionTransformer.

    Every configuration trains the classifier head and the final norm; "full" trains all;
    "emb" adds patch_embed, cls_token and pos_embed; "ln1"/"ln2" every block's norm1/norm2;
    "mha" every block's attn.qkv and attn.proj; "fc1"/"fc2" every block's mlp.fc1/mlp.fc2;
    "head" nothing more (linear probing); "lora" the LoRA adapters (which
    ``vitplasticity.lora.apply_lora`` must have injected). Combinations join with "+".

    Raises:
        ValueError: for an unknown configuration, listing the valid ones, or "lora" on a
            model without LoRA adapters.
    """
    parts = parse_configuration(configuration)
    names = {name for name, _ in model.named_parameters() if _is_trained(name, parts)}
    if "lora" in parts and not any(LORA_MARKER in name for name in names):
        raise ValueError(
            f"configuration {configuration!r} trains LoRA adapters, but the model has none: "
            "inject them first (vitplasticity.lora.apply_lora)"
        )
    return names


def parameter_group(name: str) -> str:
    """The component group a parameter belongs to, for per-group gradient norms.

    One of "emb", "ln1", "mha", "ln2", "fc1", "fc2", "head" (head and final norm) or "other".
    """
    if name.startswith(ALWAYS_TRAINED_PREFIXES):
        return "head"
    if name.startswith(EMBEDDING_PREFIXES):
        return "emb"
    if name.startswith("blocks."):
        rest = name.split(".", 2)[2]
        for component, prefixes in _BLOCK_PARAMETER_PREFIXES.items():
            if rest.startswith(prefixes):
                return component
    return "other"
