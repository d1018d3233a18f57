"""PLoP's normalised feature norm (NFN) of every linear map in every component, from one
forward pass without gradients.

PLoP (Hayou, Ghosh and Yu, "PLoP: Precise LoRA Placement for Efficient Finetuning of Large
Models", ICLR 2026, arXiv 2506.20629) scores a linear map W on the task's inputs z by
NFN = ||W z|| / ||W z~||, z~ a Gaussian vector of the same dimension and norm as z: about 1 when
W ignores the direction of its inputs, above 1 when W is aligned with them. PLoP places its
adapters on the module types of *lowest* NFN (the least aligned with the task, so the most to
gain), and checked that placing them on the highest ones (its PLoP^-1) does worse; so NFN ranks
its lowest value first, the opposite end from plasticity and the other criteria
(:mod:`.ranking`). Its reference code (github soufiane001/plop, src/metrics.py) was not
available to us: this follows the paper's definition and the choices below, written here.

Per map (one forward pass of a batch of the task's preprocessed images, the model in eval mode):

- the real inputs are the tokens z_t (t over every token of every image) that reach the map in
  the model's own forward pass, caught by forward hooks;
- the random inputs are z~_t = g_t ||z_t|| / ||g_t||, g_t standard Gaussian: the norm matched
  token by token. They come from one CPU generator seeded with ``seed``, one draw of shape
  (tokens, input width) in float64 per map in the order the forward pass reaches the maps, so
  the value is reproducible on any device;
- NFN = mean_t ||W z_t|| / mean_t ||W z~_t||, in float64, without the bias (the alignment is
  W's; a bias would add the same vector to both).

A map is every linear layer (``nn.Linear``, transformers' ``Conv1D``) inside a component's
modules (:meth:`vitplasticity.models.architectures.Architecture.components`, FC1 the whole stage); the
linears of one component that read the same input tensor are one map, their weights stacked
(||[W_1; W_2] z||^2 = ||W_1 z||^2 + ||W_2 z||^2, with the same z~ for both). So a gated FC1 (gate
and up projections, split as DINOv3's SwiGLU or packed in one Linear as EVA-02's GluMlp) has
one NFN, the stage's joint one, exactly as its plasticity and weight statistic treat FC1 as the
one map to gate and up together (docs/protocol.md, "Models"); separate q/k/v projections are one
map as a fused qkv is; the attention's output projection reads another tensor and is a map of
its own. Norms (LN1, LN2) hold no linear layer: they have no NFN (:mod:`.criteria` reports
them n/a). A family whose attention reads a linear's weight without calling the layer (timm
Eva and Beit with separate q/v biases) is switched to calling it for this pass by its
architecture (:meth:`~vitplasticity.models.architectures.Architecture.prepare_lora`), and switched
back after; a linear the pass still does not call, or calls twice, is an error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import polars as pl
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import Architecture, UnsupportedModel, architecture_for
from vitplasticity.models.architectures.base import is_linear_layer, linear_weight

NFN_SEED = 0
"""The random inputs' seed (fixed: the same model and images give the same NFN)."""

NFN_SCHEMA: dict[str, pl.DataType] = {
    "block": pl.Int64(),
    "component": pl.String(),
    "modules": pl.String(),
    "n_tokens": pl.Int64(),
    "real_norm": pl.Float64(),
    "random_norm": pl.Float64(),
    "nfn": pl.Float64(),
    "reason": pl.String(),
}
"""Columns of :func:`feature_norm_statistics`: one row per (block, component, map);
``modules`` names the map's linear layers ('+'-joined), ``real_norm`` and ``random_norm`` are
mean_t ||W z_t|| and mean_t ||W z~_t||, ``nfn`` their ratio; ``reason`` says why ``nfn`` is
n/a (NaN) for a component the model holds no linear layer of (null otherwise)."""

ROUTED_VIEW = (
    "its experts are slices of fused 3-D parameters that run on the tokens the router picks, "
    "not linear layers the forward pass calls on every token (PLoP's NFN is of such a layer)"
)
"""Why a component that is a view (an MoE's routed FC1 and FC2, :mod:`~vitplasticity.models.
architectures.hf_moe`) has no NFN."""


@dataclass
class _Map:
    """One map being measured: its linears so far, the input they share and its random twin,
    and per token the squared output norms summed over the linears."""

    block: int
    component: str
    inputs: torch.Tensor  # as the layers received it, kept to recognise it
    real: torch.Tensor  # (T, d) float64
    random: torch.Tensor  # (T, d) float64, row norms equal to real's
    names: list[str] = field(default_factory=list)
    real_squares: torch.Tensor | None = None  # (T,)
    random_squares: torch.Tensor | None = None

    def reads(self, block: int, component: str, inputs: torch.Tensor) -> bool:
        """Whether a layer of ``component`` in ``block`` given ``inputs`` joins this map."""
        same = inputs is self.inputs or (
            inputs.data_ptr() == self.inputs.data_ptr()
            and inputs.shape == self.inputs.shape
            and inputs.stride() == self.inputs.stride()
            and inputs.dtype == self.inputs.dtype
        )
        return same and (block, component) == (self.block, self.component)

    def add(self, name: str, weight: torch.Tensor) -> None:
        """Add the linear ``name`` of (out, in) ``weight`` to the map."""
        weight = weight.detach().to(device=self.real.device, dtype=torch.float64)
        real = (self.real @ weight.T).square().sum(dim=1)
        random = (self.random @ weight.T).square().sum(dim=1)
        if self.real_squares is None or self.random_squares is None:
            self.real_squares, self.random_squares = real, random
        else:
            self.real_squares += real
            self.random_squares += random
        self.names.append(name)

    def row(self) -> dict:
        """The map's table row."""
        assert self.real_squares is not None and self.random_squares is not None
        real_norm = self.real_squares.sqrt().mean().item()
        random_norm = self.random_squares.sqrt().mean().item()
        return {
            "block": self.block,
            "component": self.component,
            "modules": "+".join(self.names),
            "n_tokens": int(self.real_squares.numel()),
            "real_norm": real_norm,
            "random_norm": random_norm,
            "nfn": real_norm / random_norm if random_norm > 0 else float("nan"),
            "reason": None,
        }


def _random_twin(real: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Gaussian rows with the norms of ``real``'s rows (drawn on the CPU, then moved)."""
    gaussian = torch.randn(real.shape, generator=generator, dtype=torch.float64)
    gaussian = gaussian.to(real.device)
    scale = torch.linalg.vector_norm(real, dim=1, keepdim=True)
    return gaussian * (scale / torch.linalg.vector_norm(gaussian, dim=1, keepdim=True))


@contextmanager
def _every_linear_called(architecture: Architecture, model: nn.Module) -> Iterator[None]:
    """The model switched by its architecture to call every attention linear (what LoRA
    needs too), then switched back: every module's attributes restored as they were."""
    saved = [(module, dict(module.__dict__)) for module in model.modules()]
    architecture.prepare_lora(model)
    try:
        yield
    finally:
        for module, attributes in saved:
            module.__dict__.clear()
            module.__dict__.update(attributes)


def feature_norm_statistics(
    model: nn.Module, inputs: torch.Tensor, *, seed: int = NFN_SEED
) -> pl.DataFrame:
    """The NFN of every linear map of every block's components (see the module docstring).

    Args:
        model: a model of a known architecture, in eval mode.
        inputs: one batch of its inputs (preprocessed images, or token ids), on its device.
        seed: the random inputs' seed.

    Returns:
        One row per (block, component, map), in forward order, columns :data:`NFN_SCHEMA`;
        no rows for the norms; one NaN row per block, with the reason (:data:`ROUTED_VIEW`),
        for a component that is a view the model does not hold (an MoE's routed FC1 and FC2:
        no linear layer of the model is it).

    Raises:
        ValueError: for a model in training mode (dropout would make the features random).
        UnsupportedModel: for a model no architecture knows, or a linear layer the forward
            pass does not call, or calls more than once.
    """
    if model.training:
        raise ValueError(
            "model is in training mode (dropout would make the features random): call model.eval()"
        )
    architecture = architecture_for(model)
    recorder = _Recorder(model, torch.Generator().manual_seed(seed))
    held = {id(module) for module in model.modules()}
    handles = []
    views = []
    with _every_linear_called(architecture, model):
        try:
            for index, block in enumerate(architecture.blocks(model)):
                parts = architecture.components(block)
                for component in COMPONENTS:
                    for top in parts[component]:
                        if id(top) not in held:
                            views.append(_view_row(index, component, top))
                            continue
                        for layer in top.modules():
                            if is_linear_layer(layer) and id(layer) not in recorder.calls:
                                handles.append(recorder.hook(index, component, layer))
            with torch.no_grad():
                model(inputs)
            recorder.close()
        finally:
            for handle in handles:
                handle.remove()
            recorder.current.clear()
    wrong = {recorder.names[key]: n for key, n in recorder.calls.items() if n != 1}
    if wrong:
        raise UnsupportedModel(
            f"{type(model).__name__} ({architecture.title}): NFN needs each linear layer called "
            "once per forward pass, with its input; "
            + ", ".join(f"{name} was called {count} times" for name, count in wrong.items())
        )
    return pl.DataFrame(recorder.rows + views, schema=NFN_SCHEMA)


def _view_row(block: int, component: str, view: nn.Module) -> dict:
    """The n/a row of a component that is a view the model does not hold."""
    return {
        "block": block,
        "component": component,
        "modules": type(view).__name__,
        "n_tokens": 0,
        "real_norm": float("nan"),
        "random_norm": float("nan"),
        "nfn": float("nan"),
        "reason": ROUTED_VIEW,
    }


class _Recorder:
    """What the forward hooks of one pass record: the maps measured (a map's linears are
    called one after another with the same input), and how often each linear was called."""

    def __init__(self, model: nn.Module, generator: torch.Generator) -> None:
        self.names = {id(module): name for name, module in model.named_modules()}
        self.generator = generator
        self.rows: list[dict] = []
        self.calls: dict[int, int] = {}
        self.current: list[_Map] = []  # the map being measured, at most one

    def close(self) -> None:
        """Finish the map being measured, if any: its row."""
        if self.current:
            self.rows.append(self.current.pop().row())

    def hook(self, block: int, component: str, layer: nn.Module) -> RemovableHandle:
        """Register the forward hook that adds ``layer`` (of ``component`` in ``block``) to
        the map its input belongs to; its handle."""
        name = self.names[id(layer)]
        self.calls[id(layer)] = 0

        def hook(module: nn.Module, args: tuple, output: object) -> None:
            self.calls[id(layer)] += 1
            if not args or not isinstance(args[0], torch.Tensor):
                raise UnsupportedModel(f"{name} was called without a positional input tensor")
            received = args[0].detach()
            if not self.current or not self.current[0].reads(block, component, received):
                self.close()
                real = received.reshape(-1, received.shape[-1]).to(torch.float64)
                twin = _random_twin(real, self.generator)
                self.current.append(_Map(block, component, received, real, twin))
            self.current[0].add(name, linear_weight(layer)[0])

        return layer.register_forward_hook(hook)
