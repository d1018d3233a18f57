"""Which module of a timm ViT block is ln1/mha/ln2/fc1/fc2, by name: what adapters.py,
bounds.py and recommend's weight statistic still read until they ask the architecture registry
(issue 16). Finetuning, LoRA and recommend's parameter groups ask
:mod:`vitplasticity.architectures`; the configurations live there too.
"""

from __future__ import annotations

from torch import nn

# Module path inside a block for each component.
BLOCK_MODULES: dict[str, str] = {
    "ln1": "norm1",
    "mha": "attn",
    "ln2": "norm2",
    "fc1": "mlp.fc1",
    "fc2": "mlp.fc2",
}


def block_modules(block: nn.Module) -> dict[str, nn.Module]:
    """Map each component name to its module inside one timm ViT block."""
    return {name: block.get_submodule(path) for name, path in BLOCK_MODULES.items()}
