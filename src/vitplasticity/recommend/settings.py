"""The settings of ``vitplasticity recommend`` and ``recommend --text``, each declared once
(:mod:`vitplasticity.settings.declaration`): :class:`RecommendImageSettings` (config
``recommend``) and :class:`RecommendTextSettings` (``recommend``, and the sequences of
``text_plasticity``, declared in :mod:`vitplasticity.plasticity.settings`). What both measure,
rank and choose by is declared once for both.

The budget is given as text (``28K``, ``1.5M``) and converted by :func:`parse_budget`, the
field's ``convert``: a settings object checked by
:func:`~vitplasticity.settings.declaration.check_settings` (or built from the flags) holds a
number of parameters. Torch-free: the Snakefile and every ``--help`` import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vitplasticity.criteria import RECOMMEND_CRITERIA
from vitplasticity.plasticity.settings import (
    batch_size_setting,
    demo_setting,
    device_setting,
    stream_setting,
)
from vitplasticity.settings.declaration import setting
from vitplasticity.settings.sequences import sequence_length_setting, tokenizer_setting

__all__ = [
    "CRITERIA",
    "DEFAULT_CONFIGURATIONS",
    "RANKING_DTYPES",
    "REFERENCE_FALLBACKS",
    "RecommendImageSettings",
    "RecommendTextSettings",
    "check_dtype",
    "parse_budget",
]

CRITERIA: tuple[str, ...] = RECOMMEND_CRITERIA
"""Criterion names, as in the ``criterion`` column of the recommendation table (the
registry's, :data:`vitplasticity.criteria.RECOMMEND_CRITERIA`)."""

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

_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgb]?)\s*$", re.IGNORECASE)


def parse_budget(text: str | int | None) -> int | None:
    """A trainable-parameter budget: a plain integer, or a number with K, M or G (B) after it
    ("28K" = 28,000; "1.5M" = 1,500,000). None and "none" mean no budget.

    Raises:
        ValueError: for anything else (an empty budget too: a budget left blank by mistake
            must not become no budget), a negative budget, or one that is not a whole number
            of parameters ("0.5").
    """
    if text is None or (isinstance(text, str) and text.strip().lower() == "none"):
        return None
    if isinstance(text, str) and not text.strip():
        raise ValueError(
            f"budget {text!r} is empty: give a parameter count such as 28000, 28K or 1.5M, "
            "or none for no budget"
        )
    if isinstance(text, bool):
        raise ValueError(f"budget {text!r}: expected a parameter count such as 28000, 28K or 1.5M")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"budget {text}: must be >= 0")
        return text
    match = _BUDGET.match(str(text))
    if not match:
        raise ValueError(f"budget {text!r}: expected a parameter count such as 28000, 28K or 1.5M")
    number, suffix = match.groups()
    # Exact decimal arithmetic: "1.1M" must be 1,100,000, not 1,100,000.0000000002.
    whole, _, fraction = number.partition(".")
    scale = _SUFFIXES[suffix.lower()]
    numerator = int(whole or "0") * 10 ** len(fraction) + int(fraction or "0")
    value, remainder = divmod(numerator * scale, 10 ** len(fraction))
    if remainder:
        raise ValueError(f"budget {text!r} is not a whole number of parameters")
    return value


RANKING_DTYPES: tuple[str, ...] = ("float32", "float64")
"""The compute dtypes recommend takes: its gradients and warm-up are not measured in bfloat16."""


def check_dtype(dtype: str) -> None:
    """Raise ValueError naming --dtype unless ``dtype`` is one of :data:`RANKING_DTYPES`:
    both recommends take the flag, which the workflow leaves at float32 (so no config key)."""
    if dtype not in RANKING_DTYPES:
        raise ValueError(f"--dtype: {dtype!r} not float32 or float64")


# The workflow passes recommend.n_pairs, or where it is null (its schema default) the measuring
# stage's n_pairs; 1024 serves direct CLI use.
_RANKING: dict[str, dict[str, Any]] = {
    "n_pairs": dict(default=1024, help="plasticity pairs", key="recommend.n_pairs", minimum=1),
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
        convert=parse_budget,
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
}
"""What both recommends measure, rank and choose by (config ``recommend``), by field name."""


def _ranking(name: str) -> Any:
    """The declaration of the recommend setting ``name`` that both recommends share."""
    return setting(**_RANKING[name])


def _batch_size() -> Any:
    return batch_size_setting(
        "recommend", 32, help="images (sequences) per gradient batch and pairs per pass"
    )


@dataclass(frozen=True, kw_only=True)
class RecommendImageSettings:
    """``vitplasticity recommend``'s settings (config ``recommend``). Field order is the order
    of the flags on the rule's command line."""

    n_pairs: int = _ranking("n_pairs")
    batch_size: int = _batch_size()
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
    budget: int | None = _ranking("budget")
    criterion: str = _ranking("criterion")
    combine: bool = _ranking("combine")
    configurations: tuple[str, ...] = _ranking("configurations")
    seed: int = _ranking("seed")
    device: str = device_setting("recommend")
    stream: str = stream_setting("recommend")
    demo: bool = demo_setting()


@dataclass(frozen=True, kw_only=True)
class RecommendTextSettings:
    """``vitplasticity recommend --text``'s settings: the text plasticity's sequences (those of
    its reference dataset, ``text_plasticity.reference``) and the ranking's (``recommend``)."""

    tokenizer: str = tokenizer_setting()
    sequence_length: int = sequence_length_setting()
    n_pairs: int = _ranking("n_pairs")
    batch_size: int = _batch_size()
    batches: int = _ranking("batches")
    budget: int | None = _ranking("budget")
    criterion: str = _ranking("criterion")
    combine: bool = _ranking("combine")
    configurations: tuple[str, ...] = _ranking("configurations")
    seed: int = _ranking("seed")
    device: str = device_setting("recommend")
    stream: str = stream_setting("recommend")
    demo: bool = demo_setting()
