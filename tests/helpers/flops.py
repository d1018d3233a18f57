"""Training FLOPs of a ViT counted by hand, the independent count the architectures' counter
(tests/models/test_train_flops.py) and the runtime table (tests/workflow/test_runtime.py) are checked against."""

from __future__ import annotations


def hand_count(
    patches: int = 16,
    width: int = 48,
    depth: int = 2,
    mlp: int = 192,
    patch: int = 8,
    prefix: int = 1,
) -> int:
    """Training FLOPs of one image of a pre-norm ViT (``prefix`` class and register tokens
    before the patches), 2 per multiply-add, matrix products and convolutions only.

    A product's backward is two products of its size (gradient of the input and of the
    weight), so a block costs 3x its forward; the patch convolution's input is the image,
    whose gradient is not needed: forward + weight gradient, 2x.
    """
    tokens = patches + prefix
    patch_conv = 2 * patches * width * (3 * patch * patch)
    linears = 2 * tokens * (width * 3 * width + width * width + width * mlp + mlp * width)
    attention = 2 * (2 * tokens * tokens * width)  # Q K^T and A V over all heads
    return 2 * patch_conv + depth * 3 * (linears + attention)
