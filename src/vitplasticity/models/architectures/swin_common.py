"""What timm's and transformers' Swin Transformers share (docs/architectures.md, "Swin").

A Swin block is pre-norm, ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``, but its attention
runs inside (shifted) windows: the normed tokens are rolled by the block's shift, cut into
windows of ``w x w`` tokens, attended window by window with a learned relative position bias
(and, shifted, a mask keeping apart the tokens the roll brought together), and put back. The
five components are the usual ones: LN1 and LN2 the block's norms, MHA the window attention
module (its projections and relative position bias table; the windowing around it holds no
parameter), FC1 and FC2 the MLP's linears. The blocks are numbered across the stages in order;
between two stages a patch merging layer (a LayerNorm and a linear map of each 2 x 2 patch
group, halving the grid and doubling the width) is its own part, ``patch_merging``, trained by
``full`` alone.

Stages of different widths have no common input: the embedding protocol (every block fed the
patch embedding) is undefined and refused, and so are recommend (which ranks by it) and the
bounds (relative position bias in the logits, windowed attention). The in-situ protocol is
defined: each component is fed what reaches it in the real forward pass. The attention module
sees windows (B nW, w w, C), batch-major, which :func:`vitplasticity.plasticity.norms.pair_norms`
reads as each image's tokens; the windowing is a permutation of the tokens, so MHA's plasticity
is that of the windowed attention as a map of LN1's output. A grid that is not a whole number of
windows is padded with zeros whose outputs the block drops: the in-situ protocol is refused for
such a model (every standard Swin's grids are whole numbers of its windows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from vitplasticity.models.architectures.base import (
    Architecture,
    AttentionWeights,
    Declared,
    Embedded,
    Owned,
    Parts,
    UndefinedStage,
)
from vitplasticity.models.refusals import (
    SWIN_BOUNDS_REASON,
    SWIN_EMBEDDING_REASON,
    SWIN_REFUSALS,
    swin_padding_reason,
)

Grid = tuple[int, int]


@dataclass(frozen=True)
class SwinLayout:
    """What each block of a Swin needs beside its tokens (the ``context`` of its embedding)."""

    merges: tuple[nn.Module | None, ...]
    """Per block: the patch merging that runs on its input first (the first block of every
    stage but the first), or None."""
    grids: tuple[Grid, ...]
    """Per block: the (H, W) grid of its tokens, after that merging."""


def merged_grid(grid: Grid) -> Grid:
    """The grid after a patch merging: halved, an odd side padded by one first."""
    return ((grid[0] + 1) // 2, (grid[1] + 1) // 2)


def window_partition(x: torch.Tensor, window: Grid) -> torch.Tensor:
    """(B, H, W, C), H and W multiples of the window, as (B nW, wh ww, C) windows, batch-major
    and row-major as both libraries cut them."""
    b, h, w, c = x.shape
    wh, ww = window
    x = x.view(b, h // wh, wh, w // ww, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, c)


def window_reverse(windows: torch.Tensor, window: Grid, grid: Grid) -> torch.Tensor:
    """The inverse of :func:`window_partition` for a (H, W) ``grid``: (B, H, W, C)."""
    wh, ww = window
    h, w = grid
    c = windows.shape[-1]
    x = windows.reshape(-1, h // wh, w // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, h, w, c)


def windowed_attention(
    attend: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    x: torch.Tensor,
    window: Grid,
    shift: Grid,
    mask_for: Callable[[torch.Tensor], torch.Tensor | None],
) -> torch.Tensor:
    """The shifted-window attention of a Swin block on normed tokens ``x`` (B, H, W, C), the
    attention module ``attend(windows, mask)`` alone: roll by -shift, pad the grid to whole
    windows, partition, attend, put back, crop, roll by +shift. ``mask_for`` gives the shifted
    windows' mask of the padded grid (None: no shift)."""
    _, h, w, _ = x.shape
    shifted = torch.roll(x, shifts=(-shift[0], -shift[1]), dims=(1, 2)) if any(shift) else x
    pad_h, pad_w = (-h) % window[0], (-w) % window[1]
    padded = nn.functional.pad(shifted, (0, 0, 0, pad_w, 0, pad_h))
    out = attend(window_partition(padded, window), mask_for(padded))
    out = window_reverse(out, window, padded.shape[1:3])[:, :h, :w, :]
    return torch.roll(out, shifts=shift, dims=(1, 2)) if any(shift) else out


class SwinFamily(Architecture):
    """What the Swin families share: stages of blocks with a patch merging between two, the
    refusals, and :meth:`run_block` / :meth:`compose_block` running a block's merging first.

    Subclasses (before their library's base class in the bases) give :meth:`stages`,
    :meth:`input_grid`, :meth:`merge`, :meth:`forward_block` and :meth:`compose_swin_block`.
    """

    # --- what it is ---------------------------------------------------------------------------

    def stages(self, model: nn.Module) -> list[tuple[nn.Module | None, list[nn.Module]]]:
        """Per stage, in order: the patch merging that runs before its blocks (None for the
        first stage) and its blocks."""
        raise NotImplementedError

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return [block for _, blocks in self.stages(model) for block in blocks]

    def block_window(self, block: nn.Module) -> tuple[Grid, Grid]:
        """The (H, W) grid ``block`` is built for, and the window it attends in (the
        configured one, or the grid where that is smaller)."""
        raise NotImplementedError

    def padding_refusal(self, model: nn.Module) -> str | None:
        """Why the in-situ protocol is undefined for ``model`` (None: it is defined): a block
        whose grid is not a whole number of windows attends zero-padded windows and drops the
        padding's outputs, so its attention's output is not the map the block uses."""
        for index, block in enumerate(self.block_list(model)):
            (h, w), (wh, ww) = self.block_window(block)
            if h % wh or w % ww:
                return swin_padding_reason(index, (h, w), (wh, ww))
        return None

    def layout(self, model: nn.Module, grid: Grid) -> SwinLayout:
        """Each block's merging and token grid, for a patch grid ``grid`` (H, W)."""
        merges: list[nn.Module | None] = []
        grids: list[Grid] = []
        for merge, blocks in self.stages(model):
            if merge is not None:
                grid = merged_grid(grid)
            for position, _ in enumerate(blocks):
                merges.append(merge if position == 0 else None)
                grids.append(grid)
        return SwinLayout(tuple(merges), tuple(grids))

    # --- which parameters are whose -----------------------------------------------------------

    def declared(self, model: nn.Module) -> list[Declared]:
        """Every patch merging layer (its norm and reduction): ``patch_merging``, trained by
        ``full`` alone (it is none of a block's five components)."""
        found = super().declared(model)
        for merge, _ in self.stages(model):
            if merge is not None:
                found.append(Declared("patch_merging", "full", Owned((merge,))))
        return found

    # --- how it runs --------------------------------------------------------------------------

    def merge(self, merge: nn.Module, tokens: torch.Tensor, grid: Grid) -> torch.Tensor:
        """The patch merging ``merge`` on ``tokens`` of the (H, W) ``grid``."""
        raise NotImplementedError

    def forward_block(self, block: nn.Module, tokens: torch.Tensor, grid: Grid) -> torch.Tensor:
        """The block's own forward pass on ``tokens`` of the (H, W) ``grid``."""
        raise NotImplementedError

    def compose_swin_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        grid: Grid,
    ) -> torch.Tensor:
        """:meth:`forward_block` rebuilt from the mapped ``components``."""
        raise NotImplementedError

    def _merged(self, index: int, tokens: torch.Tensor, layout: SwinLayout) -> torch.Tensor:
        merge = layout.merges[index]
        if merge is None:
            return tokens
        return self.merge(merge, tokens, layout.grids[index - 1])

    def run_block(
        self, block: nn.Module, index: int, tokens: torch.Tensor, embedded: Embedded
    ) -> torch.Tensor:
        """Block ``index`` on ``tokens``, after the patch merging before it (the first block of
        a stage receives the previous stage's output merged)."""
        layout: SwinLayout = embedded.context
        return self.forward_block(block, self._merged(index, tokens, layout), layout.grids[index])

    def compose_block(
        self,
        block: nn.Module,
        components: dict[str, tuple[nn.Module, ...]],
        tokens: torch.Tensor,
        embedded: Embedded,
        index: int,
    ) -> torch.Tensor:
        layout: SwinLayout = embedded.context
        merged = self._merged(index, tokens, layout)
        return self.compose_swin_block(block, components, merged, layout.grids[index])

    def embedding_outputs(
        self, block: nn.Module, index: int, embedded: Embedded, fc1: str = "stage"
    ) -> tuple[Parts, ...]:
        raise UndefinedStage(f"{self.title}: {SWIN_EMBEDDING_REASON}")

    # --- other stages -------------------------------------------------------------------------

    def attention_weights(self, attention: nn.Module) -> AttentionWeights:
        raise UndefinedStage(f"{self.title}: {SWIN_BOUNDS_REASON}")

    def mha_bound_refusal(self, model: nn.Module) -> str | None:
        return SWIN_BOUNDS_REASON

    def refusal(self, stage: str, model: nn.Module) -> str | None:
        reasons: dict[str, str | None] = dict(SWIN_REFUSALS)
        if stage == "plasticity in_situ":
            reasons[stage] = self.padding_refusal(model)
        if reasons.get(stage) is not None:
            return f"{type(model).__name__} is a Swin Transformer: {reasons[stage]}"
        return super().refusal(stage, model)
