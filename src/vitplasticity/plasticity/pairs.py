"""Where the pairs come from: batches of reference and downstream images (or token ids),
the downstream stream cycled when shorter, handed out in batches of any size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from vitplasticity.models.architectures import Architecture

Images = torch.Tensor | Iterable[torch.Tensor]
"""Preprocessed images (N, 3, H, W), or an iterable of such batches (token ids (N, L) for GPT2)."""


def image_chunks(
    source: Images, name: str, *, cycle: bool, architecture: Architecture
) -> Iterator[torch.Tensor]:
    """The non-empty batches of ``source``, started over at its end when ``cycle``.

    Raises:
        ValueError: when ``source`` holds no image, a batch is not what ``architecture`` takes
            ((N, 3, H, W) images, (N, L) token ids), or a one-shot iterator would have to be
            cycled.
    """
    batches: Iterable[torch.Tensor] = (source,) if isinstance(source, torch.Tensor) else source
    one_shot = iter(batches) is batches
    while True:
        seen = 0
        for chunk in batches:
            architecture.check_batch(chunk, name)
            if len(chunk):
                seen += len(chunk)
                yield chunk
        if not cycle:
            return
        if seen == 0:
            raise ValueError(f"{name}: no images")
        if one_shot:
            raise ValueError(
                f"{name} is a one-shot iterator shorter than the pairs asked for: pass a tensor "
                "or a re-iterable (e.g. a list) of batches so that it can be cycled"
            )


class ImageQueue:
    """Hands out images of a chunk stream in batches of any size, in order.

    Slices of one large tensor stay views: nothing is copied unless a batch spans chunks.
    """

    def __init__(self, chunks: Iterator[torch.Tensor]) -> None:
        self._chunks = chunks
        self._pending: list[torch.Tensor] = []
        self._held = 0

    def take(self, count: int) -> torch.Tensor | None:
        """The next ``count`` images (fewer at the end of the stream; None when it is empty)."""
        while self._held < count:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._pending.append(chunk)
            self._held += len(chunk)
        if not self._held:
            return None
        merged = self._pending[0] if len(self._pending) == 1 else torch.cat(self._pending)
        rest = merged[count:]
        self._pending, self._held = ([rest], len(rest)) if len(rest) else ([], 0)
        return merged[:count]


def checked_pair_count(done: int, n_pairs: int | None) -> None:
    """Raise unless the ``done`` pairs measured are some and fill ``n_pairs``."""
    if done == 0:
        raise ValueError("reference: no images")
    if n_pairs is not None and done < n_pairs:
        raise ValueError(f"reference: {done} images, fewer than the {n_pairs} pairs asked for")
