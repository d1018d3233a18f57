"""Tiny random-init models saved as their families save a safetensors checkpoint, and the
``models:`` entries naming them: a timm ViT (one file of its state dict, head included) and
transformers causal LMs (``save_pretrained``: a folder), of as many blocks as a test wants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VIT_KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "num_heads": 3}
"""The demo's ViT shape (config/demo.yaml's demo_vit), its depth left to the caller."""


def saved_vit(folder: Path, depth: int = 3) -> dict[str, Any]:
    """A timm ViT-Ti/16 of :data:`VIT_KWARGS` and ``depth`` blocks saved in
    ``folder/vit.safetensors``; its ``models:`` entry."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    kwargs = {**VIT_KWARGS, "depth": depth}
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs)
    path = folder / "vit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return {
        "family": "timm",
        "timm_id": "vit_tiny_patch16_224",
        "kwargs": kwargs,
        "weights": str(path),
    }


def saved_causal_lm(folder: Path, kind: str, layers: int = 4, width: int = 48) -> dict[str, Any]:
    """A transformers causal LM of ``kind`` (``llama``: untied LM head; ``gpt2``: tied),
    ``layers`` blocks of ``width`` (heads of 16) saved in ``folder/<kind>``; its ``models:``
    entry."""
    import transformers

    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(
            hidden_size=width, num_hidden_layers=layers, num_attention_heads=width // 16,
            num_key_value_heads=1, head_dim=16, intermediate_size=2 * width, vocab_size=64,
            max_position_embeddings=32, tie_word_embeddings=False,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            n_embd=width, n_layer=layers, n_head=width // 16, vocab_size=64, n_positions=32
        )
        model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(folder / kind)
    return {"family": "transformers", "hf_id": f"tiny/{kind}", "weights": str(folder / kind)}
