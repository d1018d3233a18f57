"""What each component is fed (docs/protocol.md): the ``embedding`` protocol (every block's
components fed the embedding outputs of the pair, the reference code) and the ``in_situ``
protocol (forward hooks record what reaches each component in the real forward pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from vitplasticity.models.architectures import (
    Architecture,
    Embedded,
    UnsupportedModel,
)
from vitplasticity.plasticity.norms import joint_pair_norms, pair_norms
from vitplasticity.plasticity.settings import PROTOCOLS


def check_protocols(protocols: Sequence[str]) -> tuple[str, ...]:
    """Return ``protocols`` as a tuple after checking each is known.

    Raises:
        ValueError: naming the unknown protocol and listing the valid ones.
    """
    if isinstance(protocols, str):
        protocols = (protocols,)
    if not protocols:
        raise ValueError(f"no plasticity protocol given; valid protocols: {', '.join(PROTOCOLS)}")
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            raise ValueError(
                f"unknown plasticity protocol {protocol!r}; valid protocols: {', '.join(PROTOCOLS)}"
            )
    return tuple(protocols)


def fc1_mode_matters(architecture: Architecture, blocks: Sequence[nn.Module]) -> bool:
    """Whether the fc1 mode changes what FC1 is in any block (a gated MLP)."""
    for block in blocks:
        try:
            if architecture.components(block, "up")["fc1"] != architecture.components(block)["fc1"]:
                return True
        except UnsupportedModel:  # a packed gated MLP: "up" is refused, "stage" is gated
            return True
    return False


def embedding_block(
    architecture: Architecture,
    block: nn.Module,
    index: int,
    embedded: Embedded,
    batch_pairs: int,
    fc1: str,
) -> torch.Tensor:
    """Numerators (5, B) of block ``index`` in the embedding protocol: each component fed the
    embedding output (FC2 is fc2([x, 0, 0, 0]): x meets fc2's first d input columns only)."""
    outputs = architecture.embedding_outputs(block, index, embedded, fc1)
    return torch.stack([joint_pair_norms(out, batch_pairs) for out in outputs])


def _embedding_protocol(
    architecture: Architecture,
    model: nn.Module,
    blocks: list[nn.Module],
    inputs: torch.Tensor,
    batch_pairs: int,
    fc1: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerators and denominators (n_blocks, 5, B) of the embedding protocol."""
    embedded = architecture.embed(model, inputs)  # tokens (2B, n, d)
    numerator = torch.stack(
        [
            embedding_block(architecture, block, index, embedded, batch_pairs, fc1)
            for index, block in enumerate(blocks)
        ]
    )  # (n_blocks, 5, B)
    # The same pair feeds every component.
    return numerator, pair_norms(embedded.tokens, batch_pairs).expand_as(numerator)


class _InSituRecorder:
    """Forward hooks recording, per component of one block, the pair norms of its input and
    output change.

    Hooks (rather than re-implementing Block.forward) see exactly what the real forward pass
    feeds each module, whatever the block does around it (layer scale, drop path, the MLP's
    activation and optional norm). A component whose input is the previous component's very
    output tensor (attn gets norm1's output, fc1 gets norm2's) reuses that norm. A part that
    runs through several modules (:meth:`Architecture.in_situ_parts`) is read at its first
    module's input and its last module's output.
    """

    def __init__(
        self, architecture: Architecture, block: nn.Module, batch_pairs: int, fc1: str
    ) -> None:
        self.batch_pairs = batch_pairs
        self._input_of = architecture.hook_input
        self._output_of = architecture.hook_output
        self.numerators: list[torch.Tensor | None] = [None] * 5
        self.denominators: list[torch.Tensor | None] = [None] * 5
        # Per component: the pair norms of each of its modules' outputs (a gated fc1 has two,
        # concatenated; see joint_pair_norms).
        self._parts: dict[int, list[torch.Tensor]] = {}
        self._last_output: torch.Tensor | None = None
        self._last_norm: torch.Tensor | None = None
        # Per component: the input pair norms of a part entered but not yet left.
        self._entered: dict[int, torch.Tensor] = {}
        self._handles = []
        for c, parts in enumerate(architecture.in_situ_parts(block, fc1).values()):
            for first, last in parts:
                if first is not last:
                    self._handles.append(
                        first.register_forward_hook(self._enter(c), with_kwargs=True)
                    )
                self._handles.append(
                    last.register_forward_hook(
                        self._hook(c, len(parts), entered=first is not last), with_kwargs=True
                    )
                )

    def _input_norms(self, inputs: torch.Tensor) -> torch.Tensor:
        if inputs is self._last_output:
            return self._last_norm  # type: ignore[return-value]
        return pair_norms(inputs, self.batch_pairs)

    def _enter(self, component: int) -> Callable[..., None]:
        def record(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: object
        ) -> None:
            self._entered[component] = self._input_norms(self._input_of(args, kwargs))

        return record

    def _hook(self, component: int, n_parts: int, entered: bool = False) -> Callable[..., None]:
        def record(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: object
        ) -> None:
            output = self._output_of(output)
            if entered:
                denominator = self._entered.pop(component)
            else:
                denominator = self._input_norms(self._input_of(args, kwargs))
            numerator = pair_norms(output, self.batch_pairs)
            self._last_output, self._last_norm = output, numerator
            if n_parts > 1:
                parts = self._parts.setdefault(component, [])
                parts.append(numerator)
                if len(parts) < n_parts:
                    self.denominators[component] = denominator  # the parts share it
                    return
                numerator = torch.stack(parts).square().sum(0).sqrt()
                del self._parts[component]
                denominator = self.denominators[component]
            self.numerators[component] = numerator
            self.denominators[component] = denominator

        return record

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._last_output = self._last_norm = None
        self._entered.clear()

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Numerators and denominators (5, B) of the pass just run."""
        return (
            torch.stack(self.numerators),  # type: ignore[arg-type]
            torch.stack(self.denominators),  # type: ignore[arg-type]
        )


def in_situ_block(
    architecture: Architecture,
    block: nn.Module,
    index: int,
    tokens: torch.Tensor,
    embedded: Embedded,
    batch_pairs: int,
    fc1: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block ``index`` run on ``tokens`` in the in-situ protocol: its output tokens, and the
    numerators and denominators (5, B) of its components."""
    recorder = _InSituRecorder(architecture, block, batch_pairs, fc1)
    try:
        tokens = architecture.in_situ_block(block, index, tokens, embedded)
    finally:
        recorder.remove()
    return tokens, *recorder.result()


def _in_situ_protocol(
    architecture: Architecture,
    model: nn.Module,
    blocks: list[nn.Module],
    inputs: torch.Tensor,
    batch_pairs: int,
    fc1: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerators and denominators (n_blocks, 5, B) of the in-situ protocol."""
    embedded: Embedded = architecture.embed(model, inputs)
    tokens = embedded.tokens
    numerators, denominators = [], []
    for index, block in enumerate(blocks):
        tokens, numerator, denominator = in_situ_block(
            architecture, block, index, tokens, embedded, batch_pairs, fc1
        )
        numerators.append(numerator)
        denominators.append(denominator)
    return torch.stack(numerators), torch.stack(denominators)


PROTOCOL_FUNCTIONS = {"embedding": _embedding_protocol, "in_situ": _in_situ_protocol}
