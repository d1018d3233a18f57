"""The per-pair Frobenius norms every protocol reduces its activations to: the batch carries
the reference half first, the downstream half second, and only the norms of their
differences are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pair_norms(activations: torch.Tensor, batch_pairs: int) -> torch.Tensor:
    """Frobenius norms of (reference half - downstream half), one per pair, in float64: (B,),
    for ``activations`` (2B, ...) of a batch of ``batch_pairs`` = B pairs: each image's
    activations are its rows of d features, whatever their layout (tokens, a grid, windows).

    Each token's norm (d terms) is reduced in the compute dtype (float64 for a 16-bit one), the
    sum over tokens in float64:
    as accurate as a float64 reduction of the whole matrix (~1e-8 relative in float32, where a
    float32 reduction of all n x d terms loses ~1e-6), without a float64 copy of every
    activation, which on a CPU costs as much as the layer that made it.
    """
    # Each image's tokens as rows (2B, n, d): a no-op for tokens (2B, n, d); a Swin's grid
    # (2B, H, W, d) and its attention's windows (2B nW, w w, d), batch-major, become them.
    activations = activations.reshape(2 * batch_pairs, -1, activations.shape[-1])
    if activations.element_size() < 4:
        # A bfloat16 difference keeps 8 significant bits of two close activations: take it,
        # and every norm, in float64 (the layers alone compute in bfloat16).
        activations = activations.to(torch.float64)
    difference = activations[:batch_pairs] - activations[batch_pairs:]  # (B, n, d)
    token_norms = torch.linalg.vector_norm(difference, dim=-1)  # (B, n)
    return token_norms.to(torch.float64).square().sum(dim=-1).sqrt()


def joint_pair_norms(parts: Sequence[torch.Tensor], batch_pairs: int) -> torch.Tensor:
    """Pair norms of the feature-wise concatenation of ``parts`` (a gated MLP's fc1):
    ||[a, b]||_F^2 = ||a||_F^2 + ||b||_F^2, so no concatenated copy is made."""
    if len(parts) == 1:
        return pair_norms(parts[0], batch_pairs)
    return torch.stack([pair_norms(part, batch_pairs) for part in parts]).square().sum(0).sqrt()
