"""The settings of the measuring stages, each declared once (as
:class:`vitplasticity.finetune.settings.TrainingSettings` declares finetuning's): its default,
help, config key and what the schema says of it. From a declaration come the stage command's
flags, their checks, the workflow rule's params and its command line
(:mod:`vitplasticity.settings.declaration`).

- :class:`PlasticitySettings`: ``vitplasticity plasticity`` (config ``plasticity``);
- :class:`TextPlasticitySettings`: ``vitplasticity text-plasticity`` (``text_plasticity``);
- :class:`BoundsSettings`: ``vitplasticity bounds`` (``plasticity``'s pairs as its images);
- :class:`RecommendImageSettings`, :class:`RecommendTextSettings`: ``vitplasticity recommend``
  and ``recommend-text`` (``recommend``; the text one takes its sequences from
  ``text_plasticity``);
- :class:`CriteriaSettings`: ``vitplasticity criteria`` (``report.criteria``).

A setting two stages share (the pairs, the pass size, the protocols, the device, the dtype) is
written once, as a function that declares it for a given config block. The schema restates
each default; tests/settings/test_settings_agreement.py fails while the two disagree. Torch-free: the
Snakefile and every ``--help`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitplasticity.components import COMPONENTS, FC1_MODES
from vitplasticity.settings.declaration import setting

__all__ = [
    "CRITERIA",
    "DEFAULT_CONFIGURATIONS",
    "DTYPES",
    "PROTOCOLS",
    "REFERENCE_FALLBACKS",
    "BoundsSettings",
    "CriteriaSettings",
    "PlasticitySettings",
    "RecommendImageSettings",
    "RecommendTextSettings",
    "TextPlasticitySettings",
]

PROTOCOLS: tuple[str, ...] = ("embedding", "in_situ")
"""The plasticity protocols: embedding (the reference code's) and in_situ (docs/protocol.md)."""

DTYPES: tuple[str, ...] = ("float32", "float64")
"""Compute dtypes of a measurement (its norms are reduced in float64 either way)."""

SPLITS: tuple[str, ...] = ("pool", "val", "test")
"""The splits of a prepared dataset."""

CRITERIA: tuple[str, ...] = (
    "plasticity",
    "relative_gradient_norm",
    "gradient_snr",
    "weight_spectral",
    "nfn",
)
"""Criterion names, as in the ``criterion`` column of the recommendation table."""

DEFAULT_CONFIGURATIONS: tuple[str, ...] = (
    "ln1",
    "mha",
    "ln2",
    "fc1",
    "fc2",
    "mha+fc1",
    "ln1+ln2",
    "fc1+fc2",
)
"""The five components and the combined experiment's three pairs (config.yaml)."""

REFERENCE_FALLBACKS: dict[str, str] = {
    "pool": "the dataset's own pool (train) images, in file order",
    "synthetic": "generated 'palette' images at the model's resolution (data/synthetic.py)",
}
"""Named reference sets for when ImageNet is not at hand (--reference-fallback)."""


# -- settings several stages share, declared for a config block ------------------------------


def _n_pairs(block: str, help: str = "pairs (paper: 12,800)") -> Any:
    return setting(12800, help=help, key=f"{block}.n_pairs", minimum=1)


def _batch_size(block: str, default: int = 64, help: str = "pairs per forward pass") -> Any:
    return setting(default, help=help, key=f"{block}.batch_size", minimum=1)


def _protocols(block: str) -> Any:
    return setting(
        ("embedding",),
        help="embedding (the reference code) and/or in_situ",
        key=f"{block}.protocols",
        choices=PROTOCOLS,
        metavar="P",
    )


def _device(block: str) -> Any:
    return setting("auto", help="auto (GPU when present), cpu, cuda", key=f"{block}.device")


def _dtype(block: str) -> Any:
    return setting(
        "float32",
        help="compute dtype (norms are float64)",
        key=f"{block}.dtype",
        choices=DTYPES,
    )


def _tokenizer(help: str) -> Any:
    return setting("auto", help=help, key="text_plasticity.tokenizer", quote=True)


def _sequence_length() -> Any:
    return setting(
        128, help="tokens per sequence", key="text_plasticity.sequence_length", minimum=1
    )


def _demo() -> Any:
    return setting(False, help="label the outputs as a demo", key="demo", switch=True)


# -- plasticity, text plasticity, bounds ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PlasticitySettings:
    """How ``vitplasticity plasticity`` measures one (model, dataset) (config ``plasticity``)."""

    split: str = setting(
        "test", help="downstream split", key="plasticity.downstream_split", choices=SPLITS
    )
    protocols: tuple[str, ...] = _protocols("plasticity")
    n_pairs: int = _n_pairs("plasticity", "image pairs (paper: 12,800)")
    batch_size: int = _batch_size("plasticity", help="image pairs per forward pass (2x images)")
    device: str = _device("plasticity")
    dtype: str = _dtype("plasticity")
    fc1: str = setting(
        "stage",
        help="a gated MLP's FC1: stage (gate + up projections) or up (the up projection "
        "alone, the reference code's DINOv3 ablation)",
        key="plasticity.fc1",
        choices=FC1_MODES,
    )
    demo: bool = _demo()


@dataclass(frozen=True, kw_only=True)
class TextPlasticitySettings:
    """How ``vitplasticity text-plasticity`` measures one (model, text dataset) (config
    ``text_plasticity``)."""

    tokenizer: str = _tokenizer(
        "auto (bytes for a random-init model, else the model's own: its weights folder), "
        "bytes, or a tokenizer folder"
    )
    sequence_length: int = _sequence_length()
    n_pairs: int = _n_pairs("text_plasticity", "sequence pairs")
    batch_size: int = _batch_size("text_plasticity")
    protocols: tuple[str, ...] = _protocols("text_plasticity")
    device: str = _device("text_plasticity")
    dtype: str = _dtype("text_plasticity")
    demo: bool = _demo()


@dataclass(frozen=True, kw_only=True)
class BoundsSettings:
    """How ``vitplasticity bounds`` computes one model's bounds: over the images of the
    plasticity stage's pairs (config ``plasticity``)."""

    n_images: int = _n_pairs("plasticity", "reference images whose tokens set sigma, r, E")
    batch_size: int = _batch_size("plasticity", help="images per forward pass")
    device: str = _device("plasticity")
    demo: bool = _demo()


# -- recommend, recommend-text ---------------------------------------------------------------


# The workflow passes recommend.n_pairs, or where it is null (its schema default) the measuring
# stage's n_pairs; 1024 serves direct CLI use.
_RANKING: dict[str, dict[str, Any]] = {
    "n_pairs": dict(default=1024, help="plasticity pairs", key="recommend.n_pairs", minimum=1),
    "batch_size": dict(
        default=32,
        help="images (sequences) per gradient batch and pairs per pass",
        key="recommend.batch_size",
        minimum=1,
    ),
    "batches": dict(
        default=8,
        help="gradient batches the relative gradient norm and SNR average over",
        key="recommend.batches",
        minimum=2,
    ),
    "budget": dict(
        default=None,
        help="trainable-parameter budget: 28000, 28K, 1.5M (none: no budget)",
        key="recommend.budget",
        quote=True,
    ),
    "criterion": dict(
        default="plasticity",
        help="what the recommendation ranks by (plasticity: the paper's)",
        key="recommend.criterion",
        choices=CRITERIA,
    ),
    "combine": dict(
        default=False,
        help="recommend the greedy union of components that fits --budget",
        key="recommend.combine",
        switch=True,
    ),
    "configurations": dict(
        default=DEFAULT_CONFIGURATIONS,
        help="components and '+' combinations to rank",
        key="recommend.configurations",
        metavar="C",
        quote=True,
    ),
    "seed": dict(
        default=0, help="the new head's init and the batch order", key="recommend.seed", minimum=0
    ),
    "device": dict(
        default="auto", help="auto (GPU when present), cpu, cuda", key="recommend.device"
    ),
}
"""What both recommends measure, rank and choose by (config ``recommend``), by field name."""


def _ranking(name: str) -> Any:
    """The declaration of the recommend setting ``name`` that both recommends share."""
    return setting(**_RANKING[name])


@dataclass(frozen=True, kw_only=True)
class RecommendImageSettings:
    """``vitplasticity recommend``'s settings (config ``recommend``). Field order is the order
    of the flags on the rule's command line."""

    n_pairs: int = _ranking("n_pairs")
    batch_size: int = _ranking("batch_size")
    batches: int = _ranking("batches")
    warmup_steps: int = setting(
        50,
        help="head-only SGD steps before the gradients",
        key="recommend.warmup_steps",
        minimum=0,
    )
    warmup_lr: float = setting(
        0.01, help="head warm-up SGD LR", key="recommend.warmup_lr", exclusive_minimum=0
    )
    budget: str | None = _ranking("budget")
    criterion: str = _ranking("criterion")
    combine: bool = _ranking("combine")
    configurations: tuple[str, ...] = _ranking("configurations")
    seed: int = _ranking("seed")
    device: str = _ranking("device")
    demo: bool = _demo()


@dataclass(frozen=True, kw_only=True)
class RecommendTextSettings:
    """``vitplasticity recommend-text``'s settings: the text plasticity's sequences
    (``text_plasticity``) and the ranking's (``recommend``)."""

    tokenizer: str = _tokenizer(
        "auto (bytes for a random-init model, else its hf_id), bytes, a hub id or folder"
    )
    sequence_length: int = _sequence_length()
    n_pairs: int = _ranking("n_pairs")
    batch_size: int = _ranking("batch_size")
    batches: int = _ranking("batches")
    budget: str | None = _ranking("budget")
    criterion: str = _ranking("criterion")
    combine: bool = _ranking("combine")
    configurations: tuple[str, ...] = _ranking("configurations")
    seed: int = _ranking("seed")
    device: str = _ranking("device")
    demo: bool = _demo()


# -- criteria ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CriteriaSettings:
    """How ``vitplasticity criteria`` scores the criteria (config ``report.criteria``)."""

    configurations: tuple[str, ...] = setting(
        COMPONENTS,
        help="configurations compared (the five components); 'all' for every configuration "
        "that has both a score and an accuracy",
        key="report.criteria.configurations",
        quote=True,
    )
    min_configurations: int = setting(
        3,
        help="fewest configurations a correlation is computed on",
        key="report.criteria.min_configurations",
        minimum=2,
    )
    parameters: bool = setting(
        True,
        help="leave out the trainable-parameter baseline criterion (more = predicted better)",
        key="report.criteria.parameters",
        switch=True,
        inverted=True,
    )
    demo: bool = _demo()
