"""recommend's decision in the formats trainers read, beside the PEFT configs (``trainers`` in
``PREFIX.json``):

- ``axolotl.unfrozen_parameters``: axolotl's ``unfrozen_parameters`` list, one pattern per
  trained parameter, ``^name$``. axolotl (``utils/freeze.py``, ``LayerNamePattern``) escapes
  every ``.`` of a pattern that a ``+`` does not follow and matches it with ``re.match`` (from
  the start of the name, not to its end), so a dot is written as it is and the ``$`` is what
  keeps ``layers.1.`` from also selecting ``layers.10.``: a pattern matches its one parameter
  and nothing else. A name holding another regex character is refused (it would not match
  itself). A pattern is a whole parameter: axolotl's optional ``[a:b]`` row range would only
  zero the gradient's other rows through a hook, while the gradient and the optimizer's state
  stay allocated for the whole tensor (and weight decay reaches every row; axolotl PR 3416),
  so it would save no memory; we never write one.
- ``freeze``: the plain list of the parameters to freeze (every other one trains), in
  ``named_parameters`` order, for a trainer that takes names.
- ``spectrum.snr_results``: our Spectrum SNR of each weight matrix of the five components
  (:mod:`.matrix_criteria`) in the shape of Spectrum's score file,
  ``{module_name: {"snr": value, "type": type}}``, type = the module name after its block
  index (``attn.qkv``), as ``spectrum.py`` writes it. Saved as
  ``model_snr_results/snr_results_<model slug>.json`` where axolotl's Spectrum plugin looks,
  the plugin trains the top ``spectrum_top_fraction`` of each type by SNR. Its keys are used
  as unanchored patterns, so a module whose name selects a parameter that is not its own is
  left out (``left_out``, with the reason), as is a matrix whose SNR is n/a (the plugin
  would sort a NaN), and so is an MoE's fused 3-D expert parameter (one module holds every
  expert's FC1 and FC2, so no pattern names one of them). The plugin adds only ``lm_head`` and ``embed_tokens`` itself: a vision
  model's classifier head stays frozen under it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl
    from torch import nn

PLAIN_NAME = re.compile(r"[A-Za-z0-9_.]+")
"""The parameter names an axolotl pattern can spell literally (dots are escaped by axolotl)."""

_AXOLOTL_DOT = re.compile(r"\.(?!\+)")

FUSED_EXPERTS = (
    "fused 3-D expert parameters: the module holds every expert's FC1 and FC2 matrices, so "
    "no module name selects one of them"
)
"""Why an MoE's fused experts module is left out of the Spectrum score file."""


def axolotl_pattern(pattern: str) -> re.Pattern[str]:
    """How axolotl compiles an ``unfrozen_parameters`` entry (without its optional ``[a:b]``
    row range, which we never write: the module docstring): every ``.`` not followed by ``+``
    escaped."""
    return re.compile(_AXOLOTL_DOT.sub(r"\\.", pattern))


def axolotl_unfrozen_parameters(names: Iterable[str]) -> list[str]:
    """One anchored pattern ``^name$`` per parameter name (the module docstring).

    Raises:
        ValueError: naming a parameter whose name holds a regex character other than ``.``.
    """
    patterns = []
    for name in names:
        if not PLAIN_NAME.fullmatch(name):
            raise ValueError(
                f"parameter {name!r} cannot be written as an axolotl pattern: only letters, "
                "digits, '_' and '.' spell themselves"
            )
        patterns.append(f"^{name}$")
    return patterns


def freeze_list(model: nn.Module, trained: Iterable[str]) -> list[str]:
    """The parameters of ``model`` not in ``trained``, in ``named_parameters`` order."""
    keep = set(trained)
    return [name for name, _ in model.named_parameters() if name not in keep]


def spectrum_type(module_name: str) -> str:
    """Spectrum's type of a module: its name after the first all-digit part (the block
    index), or the whole name when it has none (``spectrum.py``'s ``get_weight_types``)."""
    parts = module_name.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return module_name if index is None else ".".join(parts[index + 1 :])


def spectrum_scores(
    model: nn.Module, matrices: pl.DataFrame
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The Spectrum score file of ``model`` from its :func:`.matrix_criteria.matrix_statistics`
    rows, and the modules left out of it with the reason (the module docstring)."""
    parameter_names = [name for name, _ in model.named_parameters()]
    scores: dict[str, dict[str, Any]] = {}
    left_out: dict[str, str] = {}
    for row in matrices.iter_rows(named=True):
        if row["parameter"].endswith("]"):  # one expert's matrix of a fused 3-D parameter
            fused, _, _ = row["parameter"].rpartition("[")
            left_out[fused.rpartition(".")[0]] = FUSED_EXPERTS
            continue
        module, _, leaf = row["parameter"].rpartition(".")
        if leaf != "weight" or not module:
            continue  # Spectrum scores a module by its weight only
        if not math.isfinite(row["spectrum_snr"]):
            left_out[module] = f"Spectrum SNR n/a: {row['spectrum_snr_reason']}"
            continue
        strays = _not_owned(module, parameter_names)
        if strays:
            left_out[module] = (
                f"as a pattern, {module!r} also selects {', '.join(strays[:3])}, not its own"
            )
            continue
        scores[module] = {"snr": row["spectrum_snr"], "type": spectrum_type(module)}
    return scores, left_out


def _not_owned(module: str, parameter_names: Sequence[str]) -> list[str]:
    """The parameters an axolotl pattern ``module`` selects that are not the module's."""
    pattern = axolotl_pattern(module)
    return [
        name
        for name in parameter_names
        if pattern.match(name) and not name.startswith(f"{module}.")
    ]


def trainer_exports(
    model: nn.Module, trained: Sequence[str], matrices: pl.DataFrame
) -> dict[str, Any]:
    """The ``trainers`` part of ``PREFIX.json``: axolotl's patterns and the freeze list of the
    ``trained`` parameters (the configuration's and the head's), and the Spectrum score file.

    Raises:
        ValueError: for a trained parameter name no axolotl pattern can spell.
    """
    scores, left_out = spectrum_scores(model, matrices)
    return {
        "axolotl": {"unfrozen_parameters": axolotl_unfrozen_parameters(trained)},
        "freeze": freeze_list(model, trained),
        "spectrum": {
            "snr_results": scores,
            "left_out": left_out,
            "usage": (
                "save snr_results as model_snr_results/snr_results_<slug>.json (slug: the "
                "model name with '/' and '_' replaced by '-') for axolotl's Spectrum plugin; "
                "it trains the top spectrum_top_fraction of each type by SNR, and not a "
                "vision model's head"
            ),
        },
    }
