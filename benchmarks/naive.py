"""The naive reference the project is measured against: what the paper's code does.

fp32, explicit softmax attention (timm's non-fused path), images decoded from their stored
bytes with PIL and transformed one at a time by torchvision's PIL transforms, in the main
process.
"""

from __future__ import annotations

import copy
import io

import numpy as np
import torch
import torch.nn.functional as functional
from PIL import Image
from torch import nn
from torchvision import transforms

from vitplasticity.data.preprocessing import Preprocessing


def explicit_attention_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose attention layers take timm's explicit softmax(QK^T)V path."""
    naive = copy.deepcopy(model)
    switched = 0
    for module in naive.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
            switched += 1
    if not switched:
        raise ValueError(f"{type(model).__name__} has no timm attention layer to switch")
    return naive


def pil_train_transform(pre: Preprocessing) -> transforms.Compose:
    """Per-image RandomResizedCrop + flip + ToTensor + Normalize on PIL images."""
    interpolation = transforms.InterpolationMode(pre.interpolation)
    return transforms.Compose(
        [
            transforms.RandomResizedCrop(pre.input_size, interpolation=interpolation),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(pre.mean, pre.std),
        ]
    )


def pil_batch(
    encoded: list[bytes], indices: np.ndarray, transform: transforms.Compose
) -> torch.Tensor:
    """Decode and transform the images ``indices`` one by one: float32 (B, 3, S, S)."""
    images = []
    for index in indices:
        with Image.open(io.BytesIO(encoded[int(index)])) as image:
            images.append(transform(image.convert("RGB")))
    return torch.stack(images)


def naive_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: torch.Tensor,
    labels: torch.Tensor,
    clip_grad_norm: float,
    device: torch.device,
) -> float:
    """fp32 forward, backward, clipping and update, as a plain training loop writes it."""
    optimizer.zero_grad()
    logits = model(images.to(device))
    loss = functional.cross_entropy(logits, labels.to(device))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
    optimizer.step()
    return loss.item()
