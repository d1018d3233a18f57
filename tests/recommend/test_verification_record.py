"""The ``verification`` record of the exports: recommend's pick says it is unverified and which
criterion picked it; recommend-verify's export says it was verified, by what, with what
measured accuracy and settings, and its PEFT config and axolotl list still load and apply."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers.run_settings import finetune_settings
from tests.helpers.tiny_models import TINY_MODELS
from vitplasticity.finetune.settings import TrainingSettings
from vitplasticity.models.architectures import parameter_map
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import TimmSpec
from vitplasticity.recommend.export import build_export
from vitplasticity.recommend.trainer_exports import axolotl_pattern
from vitplasticity.recommend.verification_record import (
    VERIFIED_BY,
    verified_record,
    write_verified_export,
)
from vitplasticity.recommend.verify_plan import VerifyPlan

peft = pytest.importorskip("peft")

TINY_VIT = next(t for t in TINY_MODELS if t.id == "vit_tiny_patch16_224")
PLAN = VerifyPlan(
    "verify", "tiny", "demo-stripes", (0.02, 0.1), (0, 1, 2), criterion="nfn", top_k=2, eta=2,
    baselines=("head", "full"),
)  # fmt: skip
CHOSEN = {
    "configuration": "mha",
    "reasons": "top 2 by nfn",
    "lr": 0.1,
    "seeds": 3,
    "val_accuracy_mean": 0.75,
    "val_accuracy_std": 0.02,
    "test_accuracy_mean": 0.7,
    "trainable_parameters": 9000,
}


def training(spec: TimmSpec):
    return finetune_settings(
        experiment="verify",
        model="tiny",
        dataset="demo-stripes",
        model_spec=dataclasses.asdict(spec),
        configuration="mha",
        lr=0.1,
        seed=0,
        steps=12,
        val_every=3,
    ).training


def test_recommends_export_says_unverified_and_which_criterion_picked_it() -> None:
    model = TINY_VIT.build()
    picked = {"configuration": "mha", "criterion": "kappa", "budget": None}
    export = build_export(model, "mha", model_name="tiny", model_entry={}, recommendation=picked)
    assert export["verification"]["verified"] is False
    assert export["verification"]["criterion"] == "kappa"
    assert "recommend-verify" in export["verification"]["note"]


def _model(settings: TrainingSettings) -> torch.nn.Module:
    """The runs' model: the tiny timm model with a 4-way head."""
    return build_model(settings.spec, num_classes=4)


def test_a_verified_export_records_the_measurement_and_the_settings(
    tiny_spec: TimmSpec, tmp_path: Path
) -> None:
    settings = training(tiny_spec)
    record = verified_record(CHOSEN, PLAN, settings, (6, 12), tmp_path / "d_verified.md", 28000)
    path = tmp_path / "d_verified.json"
    written = write_verified_export(path, record, settings, lambda: _model(settings))
    export = json.loads(path.read_text())
    assert export == json.loads(json.dumps(written))
    verification = export["verification"]
    assert verification["verified"] is True and verification["by"] == VERIFIED_BY
    assert verification["report"] == str(tmp_path / "d_verified.md")
    assert verification["measured"] == {
        "configuration": "mha",
        "lr": 0.1,
        "val_accuracy_mean": 0.75,
        "val_accuracy_std": 0.02,
        "test_accuracy_mean": 0.7,
        "seeds": [0, 1, 2],
        "trainable_parameters": 9000,
    }
    assert verification["settings"] == {
        "model": "tiny",
        "dataset": "demo-stripes",
        "experiment": "verify",
        "criterion": "nfn",
        "top_k": 2,
        "baselines": ["head", "full"],
        "eta": 2,
        "rungs": [6, 12],
        "steps": 12,
        "lrs": [0.02, 0.1],
        "seeds": [0, 1, 2],
        "optimizer": settings.optimizer,
        "budget": 28000,
    }
    assert export["configuration"] == "mha" and export["dataset"] == "demo-stripes"

    # The formats load as their tools read them: the LoRA config through a save and
    # from_pretrained, axolotl's list through YAML; applied, exactly mha's weights adapt and
    # the named parameters train.
    peft.LoraConfig(**export["peft"]["lora"]["config"]).save_pretrained(tmp_path / "adapter")
    config = peft.LoraConfig.from_pretrained(tmp_path / "adapter")
    model = build_model(tiny_spec, num_classes=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        adapted = peft.get_peft_model(model, config)
    lora = {n.split(".lora_A")[0] for n, _ in adapted.named_parameters() if ".lora_A" in n}
    assert {n.removeprefix("base_model.model.") for n in lora} == {
        n.removesuffix(".weight") for n in export["peft"]["forms"]["mha"]["adapted"]
    }
    text = yaml.safe_dump(
        {"unfrozen_parameters": export["trainers"]["axolotl"]["unfrozen_parameters"]}
    )
    patterns = [axolotl_pattern(p) for p in yaml.safe_load(text)["unfrozen_parameters"]]
    fresh = build_model(tiny_spec, num_classes=4)
    unfrozen = {n for n, _ in fresh.named_parameters() if any(p.match(n) for p in patterns)}
    assert unfrozen == parameter_map(fresh).trained_names("mha")


def test_a_verified_baseline_and_no_fit_say_what_they_are(
    tiny_spec: TimmSpec, tmp_path: Path
) -> None:
    settings = training(tiny_spec)
    full = verified_record({**CHOSEN, "configuration": "full"}, PLAN, settings, (12,), "r", None)
    export = write_verified_export(tmp_path / "full.json", full, settings, lambda: _model(settings))
    assert export["configuration"] == "full" and export["verification"]["verified"] is True
    assert "peft" not in export and "baselines" in export["usage"][0]

    head = verified_record({**CHOSEN, "configuration": "head"}, PLAN, settings, (12,), "r", None)
    export = write_verified_export(tmp_path / "head.json", head, settings, lambda: _model(settings))
    assert export["components"] == [] and export["usage"][0].startswith("Linear probing")

    # Nothing verified fits the budget: measured None, the head and final norm alone.
    nothing = verified_record(None, PLAN, settings, (12,), "r", 10)
    export = write_verified_export(
        tmp_path / "none.json", nothing, settings, lambda: _model(settings)
    )
    assert export["verification"]["verified"] is True
    assert export["verification"]["measured"] is None and export["configuration"] is None
