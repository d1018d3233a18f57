"""The settings of the measuring stages, each declared once (as
:class:`vitplasticity.finetune.settings.TrainingSettings` declares finetuning's): its default,
help, config key and what the schema says of it. From a declaration come the stage command's
flags, their checks, the workflow rule's params and its command line
(:mod:`vitplasticity.settings.declaration`), and the stage function takes it whole.

- :class:`PlasticitySettings`: ``vitplasticity plasticity`` (config ``plasticity``);
- :class:`TextPlasticitySettings`: ``vitplasticity plasticity --text`` (``text_plasticity``);
- :class:`BoundsSettings`: ``vitplasticity bounds`` (``plasticity``'s pairs as its images);
- :class:`TextBoundsSettings`: ``vitplasticity bounds --text`` (``text_plasticity``'s reference
  sequences).

A setting several stages share (the pairs, the pass size, the protocols, the device, the
dtype, the demo label) is written once, as a function that declares it for a given config
block (a text dataset's tokenizer and sequence length: :mod:`vitplasticity.settings.sequences`); the recommend and criteria settings
(:mod:`vitplasticity.recommend.settings`, :mod:`vitplasticity.report.settings`) use them too.
The schema restates each default; tests/settings/test_settings_agreement.py fails while the
two disagree. Torch-free: the Snakefile and every ``--help`` import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitplasticity.components import FC1_MODES
from vitplasticity.settings.declaration import setting
from vitplasticity.settings.sequences import sequence_length_setting, tokenizer_setting

__all__ = [
    "DTYPES",
    "PROTOCOLS",
    "STREAM_MODES",
    "BoundsSettings",
    "PlasticitySettings",
    "TextBoundsSettings",
    "TextPlasticitySettings",
    "batch_size_setting",
    "demo_setting",
    "device_setting",
]

PROTOCOLS: tuple[str, ...] = ("embedding", "in_situ")
"""The plasticity protocols: embedding (the reference code's) and in_situ (docs/protocol.md)."""

DTYPES: tuple[str, ...] = ("float32", "float64", "bfloat16")
"""Compute dtypes of a measurement (its norms are reduced in float64 either way; bfloat16, for
GPU speed on large models, differs from float64 as docs/protocol.md states)."""

STREAM_MODES: tuple[str, ...] = ("auto", "always", "never")
"""Whether a measurement loads the whole model or streams it block by block from its
checkpoint (:mod:`vitplasticity.plasticity.streamed`): auto streams a model whose weights would
take more than half of the device's free memory."""

SPLITS: tuple[str, ...] = ("pool", "val", "test")
"""The splits of a prepared dataset."""


# -- settings several stages share, declared for a config block ------------------------------


def _n_pairs(block: str, help: str = "pairs (paper: 12,800)") -> Any:
    return setting(12800, help=help, key=f"{block}.n_pairs", minimum=1)


def batch_size_setting(block: str, default: int = 64, help: str = "pairs per forward pass") -> Any:
    """The declaration of ``<block>.batch_size``: what one forward pass holds."""
    return setting(default, help=help, key=f"{block}.batch_size", minimum=1)


def _protocols(block: str) -> Any:
    return setting(
        ("embedding",),
        help="embedding (the reference code) and/or in_situ",
        key=f"{block}.protocols",
        choices=PROTOCOLS,
        metavar="P",
    )


def device_setting(block: str) -> Any:
    """The declaration of ``<block>.device``: auto (a GPU when present), cpu or cuda."""
    return setting("auto", help="auto (GPU when present), cpu, cuda", key=f"{block}.device")


def _dtype(block: str) -> Any:
    return setting(
        "float32",
        help="compute dtype (norms are float64)",
        key=f"{block}.dtype",
        choices=DTYPES,
    )


def stream_setting(block: str) -> Any:
    """The declaration of ``<block>.stream``: whether the stage measures the whole model or
    streams it block by block from its checkpoint."""
    return setting(
        "auto",
        help="auto (block by block from the checkpoint when the whole model would take more "
        "than half the free memory), always, never",
        key=f"{block}.stream",
        choices=STREAM_MODES,
    )


def demo_setting() -> Any:
    """The declaration of the config's ``demo``: the switch that labels a stage's outputs."""
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
    batch_size: int = batch_size_setting(
        "plasticity", help="image pairs per forward pass (2x images)"
    )
    device: str = device_setting("plasticity")
    dtype: str = _dtype("plasticity")
    stream: str = stream_setting("plasticity")
    fc1: str = setting(
        "stage",
        help="a gated MLP's FC1: stage (gate + up projections) or up (the up projection "
        "alone, the reference code's DINOv3 ablation)",
        key="plasticity.fc1",
        choices=FC1_MODES,
    )
    demo: bool = demo_setting()


@dataclass(frozen=True, kw_only=True)
class TextPlasticitySettings:
    """How ``vitplasticity plasticity --text`` measures one (model, text dataset) (config
    ``text_plasticity``)."""

    tokenizer: str = tokenizer_setting()
    sequence_length: int = sequence_length_setting()
    n_pairs: int = _n_pairs("text_plasticity", "sequence pairs")
    batch_size: int = batch_size_setting("text_plasticity")
    protocols: tuple[str, ...] = _protocols("text_plasticity")
    device: str = device_setting("text_plasticity")
    dtype: str = _dtype("text_plasticity")
    stream: str = stream_setting("text_plasticity")
    demo: bool = demo_setting()


@dataclass(frozen=True, kw_only=True)
class BoundsSettings:
    """How ``vitplasticity bounds`` computes one model's bounds: over the images of the
    plasticity stage's pairs (config ``plasticity``)."""

    n_images: int = _n_pairs("plasticity", "reference images whose tokens set sigma, r, E")
    batch_size: int = batch_size_setting("plasticity", help="images per forward pass")
    device: str = device_setting("plasticity")
    demo: bool = demo_setting()


@dataclass(frozen=True, kw_only=True)
class TextBoundsSettings:
    """How ``vitplasticity bounds --text`` computes one text model's bounds: over the reference
    sequences of the text plasticity stage's pairs, cut as that stage cuts them (config
    ``text_plasticity``)."""

    tokenizer: str = tokenizer_setting()
    sequence_length: int = sequence_length_setting()
    n_sequences: int = _n_pairs(
        "text_plasticity", "reference sequences whose tokens set sigma, r, E"
    )
    batch_size: int = batch_size_setting("text_plasticity", help="sequences per forward pass")
    device: str = device_setting("text_plasticity")
    demo: bool = demo_setting()
