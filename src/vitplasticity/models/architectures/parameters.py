"""Which parameter is whose: every parameter of a model owned by exactly one group, found by
identity through the modules its architecture names (never by parsing parameter names).

Groups: the five components of every block (``ln1`` ... ``fc2``), ``emb`` (the embedding),
``head`` (classifier head, pooling and final norm: trained by every configuration), ``lora``
(peft's LoRA adapters, when injected), and the architecture's declared others, each with the
configuration that trains it. A parameter no group claims, or one two groups claim, is an error:
a model the code cannot account for exactly is never finetuned or ranked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch import nn

from vitplasticity.components import parse_configuration
from vitplasticity.models.architectures.base import Architecture, UnsupportedModel


@dataclass(frozen=True)
class Owner:
    """The group a parameter belongs to."""

    group: str
    """``emb``, a component, ``head``, ``lora``, or a declared label."""
    trained_by: str
    """The configuration that trains it (``head``: every configuration)."""
    block: int | None = None

    @property
    def gradient_group(self) -> str:
        """Its column among the per-group gradient norms: the configuration that trains it
        (``other`` for a parameter only ``full`` trains)."""
        return "other" if self.trained_by == "full" else self.trained_by


def _lora_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The adapter parameters peft injected (its LoRA layers' lora_A/lora_B/... containers)."""
    found: list[nn.Parameter] = []
    for module in model.modules():
        adapter_names = getattr(module, "adapter_layer_names", None)
        if adapter_names is None:
            continue
        for attribute in adapter_names:
            container = getattr(module, attribute, None)
            if isinstance(container, nn.Module):
                found.extend(container.parameters())
    return found


class ParameterMap:
    """Every parameter of ``model`` with its :class:`Owner`, in ``named_parameters`` order.

    Raises:
        UnsupportedModel: when a parameter belongs to no group or to two (naming them).
    """

    def __init__(self, architecture: Architecture, model: nn.Module) -> None:
        self.architecture = architecture
        owners: dict[int, Owner] = {}
        lora = _lora_parameters(model)
        lora_ids = {id(p) for p in lora}

        def claim(parameters: Iterable[nn.Parameter], owner: Owner) -> None:
            for parameter in parameters:
                key = id(parameter)
                if key in lora_ids and owner.group != "lora":
                    continue  # an adapter inside a component's module: LoRA's, not the component's
                if key in owners and owners[key] != owner:
                    raise UnsupportedModel(
                        f"{type(model).__name__}: a parameter of shape {tuple(parameter.shape)} "
                        f"is claimed by both {owners[key].group} and {owner.group} "
                        f"({architecture.title})"
                    )
                owners[key] = owner

        claim(lora, Owner("lora", "lora"))
        for index, block in enumerate(architecture.blocks(model)):
            for component, modules in architecture.components(block).items():
                claim(
                    (p for module in modules for p in module.parameters()),
                    Owner(component, component, index),
                )
        claim(architecture.embedding(model).all_parameters(), Owner("emb", "emb"))
        claim(architecture.head(model).all_parameters(), Owner("head", "head"))
        for declared in architecture.declared(model):
            claim(
                declared.owned.all_parameters(),
                Owner(declared.label, declared.trained_by, declared.block),
            )
        self.owners: dict[str, Owner] = {}
        unclaimed = []
        for name, parameter in model.named_parameters():
            owner = owners.get(id(parameter))
            if owner is None:
                unclaimed.append(name)
            else:
                self.owners[name] = owner
        if unclaimed:
            shown = ", ".join(unclaimed[:5]) + (" ..." if len(unclaimed) > 5 else "")
            raise UnsupportedModel(
                f"{type(model).__name__}: {len(unclaimed)} parameter(s) that the "
                f"{architecture.title} architecture does not account for: {shown}"
            )

    def group(self, name: str) -> str:
        """The gradient group of parameter ``name`` (see :attr:`Owner.gradient_group`)."""
        return self.owners[name].gradient_group

    def trained_names(self, configuration: str) -> set[str]:
        """Names of the parameters ``configuration`` trains (head and final norm always).

        Raises:
            ValueError: for an unknown configuration, or ``lora`` on a model without LoRA
                adapters.
        """
        parts = set(parse_configuration(configuration))
        if "full" in parts:
            return set(self.owners)
        names = {
            name
            for name, owner in self.owners.items()
            if owner.trained_by == "head" or owner.trained_by in parts
        }
        if "lora" in parts and not any(o.group == "lora" for o in self.owners.values()):
            raise ValueError(
                f"configuration {configuration!r} trains LoRA adapters, but the model has none: "
                "inject them first (vitplasticity.models.lora.apply_lora)"
            )
        return names

    def component_names(self, component: str) -> list[str]:
        """The parameters ``component`` trains beyond the head, in ``named_parameters`` order."""
        return [n for n, o in self.owners.items() if o.trained_by == component]
