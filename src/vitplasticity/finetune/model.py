"""A run's model: built seeded by the run seed, LoRA-adapted when the configuration asks for
it, and frozen but for the parameters its configuration trains (by identity, from the
model's architecture: :class:`vitplasticity.models.architectures.ParameterMap`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitplasticity.data.preprocessing import Preprocessing
from vitplasticity.finetune.identity import FinetuneSettings
from vitplasticity.models.architectures import (
    Architecture,
    ParameterMap,
    UnsupportedModel,
    architecture_for,
    parse_configuration,
)
from vitplasticity.models.build import build_model, preprocessing
from vitplasticity.models.lora import apply_lora, check_adapters_used


def freeze(model: nn.Module, parameters: ParameterMap, configuration: str) -> set[str]:
    """Freeze every parameter of ``model`` that ``configuration`` does not train (which is
    which: ``parameters``, the model's map); return the trained names."""
    trained = parameters.trained_names(configuration)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trained)
    return trained


@dataclass(frozen=True)
class RunModel:
    """The model of a run with its trained parameters (in ``named_parameters`` order) and
    its parameter map (whose each parameter is: the gradient-norm groups)."""

    model: nn.Module
    trainable: list[tuple[str, nn.Parameter]]
    preprocessing: Preprocessing | None  # None for a text model
    parameters: ParameterMap

    @property
    def architecture(self) -> Architecture:
        """The model's architecture (how its logits are computed: :meth:`Architecture.logits`)."""
        return self.parameters.architecture


def build_run_model(settings: FinetuneSettings, num_classes: int, device: torch.device) -> RunModel:
    """Build the model seeded by the run seed (the new head's init), freeze, move to ``device``.

    Rebuilding with the same settings gives bit-identical parameters, which is why a
    checkpoint only needs the trained ones. A ``family: transformers`` model is its vision
    tower in its classification class (:func:`vitplasticity.models.hf_build.build_hf_model`).

    Raises:
        UnsupportedModel: before any step, for a model no architecture knows (naming its
            class and the known families), one its architecture refuses to finetune (or to
            adapt with LoRA, or whose forward pass bypasses a LoRA adapter), or one with a
            parameter its architecture cannot account for.
    """
    spec = settings.training.spec
    torch.manual_seed(settings.run.seed)
    model = build_model(spec, num_classes=num_classes)
    refusal = architecture_for(model).refusal("finetune", model)
    if refusal is not None:
        raise UnsupportedModel(f"finetune of {type(model).__name__}: {refusal}")
    pre = preprocessing(model, spec)
    sample = torch.zeros(1, 3, pre.input_size, pre.input_size)  # (1, 3, S, S)
    return adapted_run_model(model, settings, sample, device, pre)


def adapted_run_model(
    model: nn.Module,
    settings: FinetuneSettings,
    sample: torch.Tensor,
    device: torch.device,
    pre: Preprocessing | None = None,
) -> RunModel:
    """``model`` (built seeded already) LoRA-adapted when its configuration asks for it,
    frozen but for what its configuration trains, on ``device``.

    Args:
        model: an image model or a text LM.
        settings: the run's settings.
        sample: an input of the model's kind (zeros of one image, or of a few token ids):
            LoRA's check that the forward pass goes through every adapter.
        device: where the run trains.
        pre: an image model's preprocessing (None for a text model).

    Raises:
        UnsupportedModel: for a model whose architecture refuses LoRA or whose forward pass
            bypasses an adapter, or with a parameter its architecture cannot account for.
    """
    architecture = architecture_for(model)
    if "lora" in parse_configuration(settings.run.configuration):
        refusal = architecture.refusal("lora", model)
        if refusal is not None:
            raise UnsupportedModel(f"lora of {type(model).__name__}: {refusal}")
        # After the head, so the head's init is that of every other configuration.
        apply_lora(model, settings.training.lora_rank, settings.training.lora_alpha)
        check_adapters_used(model, sample)
    parameters = ParameterMap(architecture, model)
    trained = freeze(model, parameters, settings.run.configuration)
    model.to(device).train()
    trainable = [(n, p) for n, p in model.named_parameters() if n in trained]
    return RunModel(model, trainable, pre, parameters)
