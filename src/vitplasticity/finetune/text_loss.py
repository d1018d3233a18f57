"""The losses of text finetuning: the next-token loss of a causal LM, and the masked-LM loss
of an encoder on deterministically masked tokens.

Both are means over the predicted tokens; the perplexity of a validation set is
``exp(mean token loss)`` (:func:`perplexity`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as functional

CAUSAL = "causal"
"""The task of a decoder: predict token t + 1 from the tokens up to t."""

MASKED = "masked"
"""The task of an encoder: predict the masked tokens from the whole sequence."""


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``ids[:, t + 1]`` from ``logits[:, t]``.

    Args:
        logits: (B, L, V) the LM's output on ``ids``.
        ids: (B, L) the token ids.
    """
    predicted = logits[:, :-1].reshape(-1, logits.shape[-1]).float()  # (B (L - 1), V)
    return functional.cross_entropy(predicted, ids[:, 1:].reshape(-1))


def masked_positions(
    shape: torch.Size, probability: float, generator: torch.Generator
) -> torch.Tensor:
    """A boolean mask (B, L) with exactly ``max(1, round(probability * L))`` masked positions
    per sequence, drawn from ``generator``.

    A fixed count per sequence (not BERT's independent coin per token) keeps every batch's
    loss defined: a sequence with no masked token would make it 0 / 0.
    """
    batch, length = shape
    count = max(1, round(probability * length))
    scores = torch.rand(batch, length, generator=generator)
    chosen = scores.argsort(dim=1)[:, :count]  # (B, count)
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[torch.arange(batch)[:, None], chosen] = True
    return mask


def masked_inputs(ids: torch.Tensor, mask: torch.Tensor, mask_id: int) -> torch.Tensor:
    """``ids`` with every masked position replaced by ``mask_id`` (BERT's [MASK] token; the
    80/10/10 replacement of its pre-training is not used: finetuning here measures how well a
    configuration learns the text, and the masked tokens are the ones scored)."""
    return torch.where(mask, torch.full_like(ids, mask_id), ids)


def masked_lm_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the original ``ids`` at the ``mask`` positions.

    Args:
        logits: (B, L, V) the encoder's MLM output on the masked inputs.
        ids: (B, L) the original token ids.
        mask: (B, L) which positions were masked (at least one).
    """
    return functional.cross_entropy(logits[mask].float(), ids[mask])  # (masked, V) vs (masked,)


def perplexity(mean_loss: float) -> float:
    """``exp`` of a mean token cross-entropy (inf past float range)."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return math.inf
