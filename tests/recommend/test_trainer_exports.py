"""The trainer exports of ``PREFIX.json`` (axolotl ``unfrozen_parameters``, the freeze list,
Spectrum's score file), each applied to a fresh real model the way its trainer applies it:
exactly the intended parameters train."""

from __future__ import annotations

import math
import re

import numpy as np
import polars as pl
import pytest
from torch import nn

from tests.helpers.tiny_models import TINY_MODELS, TinyModel
from vitplasticity.models.architectures import parameter_map
from vitplasticity.recommend.export import build_export
from vitplasticity.recommend.matrix_criteria import MATRIX_SCHEMA, NOT_A_MATRIX, matrix_statistics
from vitplasticity.recommend.trainer_exports import (
    axolotl_unfrozen_parameters,
    spectrum_scores,
    spectrum_type,
)

MODELS = {
    tiny.id: tiny
    for tiny in TINY_MODELS
    if tiny.id
    in (
        "vit_tiny_patch16_224",  # timm ViT, fused qkv
        "vit_small_plus_patch16_dinov3",  # timm Eva, SwiGLU (fc1 = fc1_g + fc1_x)
        "gpt2_tiny",  # transformers Conv1D
    )
}
CONFIGURATIONS = ("mha", "ln1+ln2", "mha+fc1", "fc2")


def _axolotl_freeze_layers_except(model: nn.Module, patterns: list[str]) -> None:
    """axolotl's utils/freeze.py freeze_layers_except, as it selects (no ranges): every '.'
    not followed by '+' escaped, then re.match against each parameter name."""
    compiled = [re.compile(re.sub(r"\.(?!\+)", "\\\\.", p)) for p in patterns]
    for name, parameter in model.named_parameters():
        parameter.requires_grad = any(p.match(name) for p in compiled)


def _trained(model: nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


def _intended(model: nn.Module, configuration: str) -> set[str]:
    return set(parameter_map(model).trained_names(configuration))


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_axolotl_patterns_and_freeze_list_train_exactly_the_configuration(
    tiny_id: str, configuration: str
) -> None:
    tiny: TinyModel = MODELS[tiny_id]
    model = tiny.build()
    trainers = build_export(model, configuration, model_name=tiny_id, model_entry={})["trainers"]
    intended = _intended(model, configuration)
    assert intended and intended != {n for n, _ in model.named_parameters()}

    fresh = tiny.build()
    _axolotl_freeze_layers_except(fresh, trainers["axolotl"]["unfrozen_parameters"])
    assert _trained(fresh) == intended

    fresh = tiny.build()
    frozen = set(trainers["freeze"])
    for name, parameter in fresh.named_parameters():
        parameter.requires_grad = name not in frozen
    assert _trained(fresh) == intended


class _Deep(nn.Module):
    """Eleven layers: ``layers.1.weight`` is a prefix of ``layers.10.weight``'s name."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(11))


def test_axolotl_patterns_cannot_prefix_collide() -> None:
    model = _Deep()
    _axolotl_freeze_layers_except(model, axolotl_unfrozen_parameters(["layers.1.weight"]))
    assert _trained(model) == {"layers.1.weight"}
    # Unanchored, axolotl's re.match would also select layers.10 and layers.1.bias: the
    # anchors are what the test sees.
    _axolotl_freeze_layers_except(model, ["layers.1"])
    assert _trained(model) == {
        "layers.1.weight",
        "layers.1.bias",
        "layers.10.weight",
        "layers.10.bias",
    }


def test_a_name_axolotl_cannot_spell_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'blocks\[0\]\.weight' cannot be written"):
        axolotl_unfrozen_parameters(["blocks[0].weight"])


def _spectrum_plugin_patterns(snr_data: dict, top_fraction: float) -> list[str]:
    """axolotl's Spectrum plugin (integrations/spectrum): per type, the top
    int(len * top_fraction) layers by SNR, after its two fixed patterns."""
    by_type: dict[str, list[tuple[str, float]]] = {}
    for layer, info in snr_data.items():
        by_type.setdefault(info["type"], []).append((layer, info["snr"]))
    patterns = ["^lm_head.weight$", "^model.embed_tokens.weight$"]
    for layers in by_type.values():
        ranked = sorted(layers, key=lambda item: item[1], reverse=True)
        patterns += [layer for layer, _ in ranked[: int(len(layers) * top_fraction)]]
    return patterns


@pytest.mark.parametrize("tiny_id", list(MODELS))
def test_spectrum_score_file_read_by_the_plugin_trains_the_top_snr_modules(tiny_id: str) -> None:
    tiny = MODELS[tiny_id]
    model = tiny.build()
    matrices = matrix_statistics(model)
    export = build_export(model, "mha", model_name=tiny_id, model_entry={})
    scores = export["trainers"]["spectrum"]["snr_results"]
    assert scores, export["trainers"]["spectrum"]["left_out"]
    for module, entry in scores.items():
        assert set(entry) == {"snr", "type"}
        row = matrices.filter(matrices["parameter"] == f"{module}.weight").row(0, named=True)
        assert entry["snr"] == row["spectrum_snr"] and math.isfinite(entry["snr"])
        assert entry["type"] == spectrum_type(module)
        assert not re.search(r"(^|\.)\d+(\.|$)", entry["type"])  # no block index left
    # Every weight of the five components is scored, or left out with the reason (the
    # norms' 1-D weights: n/a).
    left_out = export["trainers"]["spectrum"]["left_out"]
    weights = {p.removesuffix(".weight") for p in matrices["parameter"] if p.endswith(".weight")}
    assert weights == set(scores) | set(left_out)
    for row in matrices.iter_rows(named=True):
        if row["parameter"].endswith(".weight") and row["spectrum_snr_reason"] == NOT_A_MATRIX:
            assert NOT_A_MATRIX in left_out[row["parameter"].removesuffix(".weight")]

    # The plugin's selection, applied to a fresh model by axolotl's matching.
    fresh = tiny.build()
    _axolotl_freeze_layers_except(fresh, _spectrum_plugin_patterns(scores, 0.5))
    expected: set[str] = set()
    for kind in {entry["type"] for entry in scores.values()}:
        of_kind = [(m, e["snr"]) for m, e in scores.items() if e["type"] == kind]
        values = np.array([snr for _, snr in of_kind])
        top = np.argsort(-values, kind="stable")[: int(len(of_kind) * 0.5)]
        for index in top:
            module = fresh.get_submodule(of_kind[index][0])
            expected |= {f"{of_kind[index][0]}.{n}" for n, _ in module.named_parameters()}
    assert _trained(fresh) == expected


def _hand_made_matrices(model: nn.Module) -> pl.DataFrame:
    """Matrix rows for a model no architecture knows: every weight, SNR 1."""
    rows = [
        {
            "component": "fc1",
            "parameter": name,
            "spectrum_snr": 1.0,
            "spectrum_snr_reason": None,
            "kappa": 1.0,
            "kappa_reason": None,
        }
        for name, _ in model.named_parameters()
        if name.endswith(".weight")
    ]
    return pl.DataFrame(rows, schema=MATRIX_SCHEMA)


def test_spectrum_leaves_out_a_module_whose_name_selects_another() -> None:
    model = _Deep()
    matrices = _hand_made_matrices(model)
    scores, left_out = spectrum_scores(model, matrices)
    assert "layers.1" in left_out and "layers.10.weight" in left_out["layers.1"]
    assert "layers.1" not in scores and "layers.10" in scores
    assert scores["layers.10"]["type"] == ""  # nothing after the index in this toy model
