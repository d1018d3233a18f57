"""recommend's decision as data that applies without vitplasticity: the ``PREFIX.json`` file.

:func:`build_export` describes one configuration (``mha+fc1``) of one model: the exact names
of the parameters it trains (:class:`~vitplasticity.models.architectures.ParameterMap`, by identity),
split into the chosen components' and the head and final norm's (which every configuration
trains, docs/protocol.md), their counts, and PEFT configs to pass to peft as they are:

- ``peft.lora.config``: ``peft.LoraConfig`` fields. ``target_modules`` are the fully qualified
  names of the chosen linear components' modules (MHA: the architecture's ``lora_targets``,
  the attention linears; FC1: the MLP's first linear stage, gate and up of a gated MLP; FC2),
  at the paper's rank 8 and alpha 16 (docs/protocol.md, "LoRA baseline"); an MoE's fused
  experts (3-D parameters, one matrix per expert: Mixtral's and Qwen2-MoE's
  ``experts.gate_up_proj`` for FC1, ``experts.down_proj`` for FC2) are
  ``target_parameters``, which peft (0.17 on) adapts expert by expert, a shared expert's
  linears ``target_modules``;
  ``modules_to_save`` trains copies of the chosen norms and of the head and final norm, so
  this one config stands for the whole configuration, its linear weights in low rank.
  ``peft.lora.set_attributes`` are module attributes to set first, so that the forward pass
  calls every adapted linear (:meth:`~vitplasticity.models.architectures.Architecture.prepare_lora`:
  timm Eva and Beit with q/v biases otherwise read ``qkv.weight`` themselves, bypassing
  the adapter).
- ``peft.ln_tuning.config``: ``peft.LNTuningConfig`` fields: the chosen norms, and the head
  and final norm in ``modules_to_save``.

peft selects modules by name; every name is checked against the model's own under peft's rules
(:mod:`.peft_names`): a part (a component, or the head) that cannot be named exactly has no
PEFT form, and ``peft.forms`` says so with the reason instead of dropping it; each form also
lists the parameters of its part that it leaves frozen (a linear's bias beside its LoRA
adapter, a LayerScale), since LoRA trains a low-rank update of a weight, not the component.

``trainers`` holds the same decision in the formats trainers read without peft: axolotl's
``unfrozen_parameters``, a plain freeze list, and Spectrum's score file of our Spectrum SNR
(:mod:`.trainer_exports`).

``verification`` says how the configuration was chosen (:mod:`.verification_record`):
``verified: false`` and the criterion for recommend's heuristic pick, ``verified: true`` with
the measured accuracy and the verification's settings for recommend-verify's. It is a key of
the file beside the formats, never inside one: ``peft.LoraConfig(**...)``, axolotl's
``unfrozen_parameters`` and Spectrum's score file take their parts as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vitplasticity.recommend.peft_names import (
    excluded_by_modules_to_save,
    modules_to_save_matches,
    target_matches,
)

if TYPE_CHECKING:
    import polars as pl
    from torch import nn

    from vitplasticity.models.architectures import Architecture, ParameterMap

FORMAT = "vitplasticity.recommend.export/1"
"""What the file is and its version, its ``format`` key."""

LORA_RANK = 8
LORA_ALPHA = 16
"""The paper's LoRA baseline: rank 8, alpha 16 (docs/protocol.md, "LoRA baseline")."""

LINEAR_PROBE = "head"
"""The configuration that trains the head and final norm alone (a verification's baseline)."""

NORM_COMPONENTS: tuple[str, ...] = ("ln1", "ln2")
"""The components peft tunes as norms (LNTuningConfig); the others are linear (LoRA)."""


def build_export(
    model: nn.Module,
    configuration: str | None,
    *,
    model_name: str,
    model_entry: Mapping[str, Any],
    dataset: str | None = None,
    recommendation: Mapping[str, Any] | None = None,
    verification: Mapping[str, Any] | None = None,
    matrices: pl.DataFrame | None = None,
) -> dict[str, Any]:
    """The JSON-ready description of ``configuration`` on ``model`` (the module docstring's).

    Args:
        model: the model the names are of (class, sizes and head of the one to finetune),
            left as it was.
        configuration: components joined by ``+`` (``mha+fc1``); ``head`` (a verified linear
            probe) or None when no configuration fits the budget: the head and final norm
            alone.
        model_name, model_entry: its name in the outputs and its config.yaml ``models`` entry.
        dataset, recommendation: what it is for, how it was chosen (copied as it is).
        verification: the ``verification`` record (:mod:`.verification_record`); None: the
            heuristic pick of ``recommendation``'s criterion, unverified.
        matrices: ``model``'s matrix statistics when already measured (recommend's, of a
            streamed model too); None: :func:`.matrix_criteria.matrix_statistics` of it.

    Raises:
        ValueError: for a configuration that is not made of the five components.
        UnsupportedModel: for a model no architecture knows or cannot account for, one whose
            architecture refuses the export, linear targets of
            two kinds (``nn.Linear`` and ``Conv1D``: no one ``fan_in_fan_out``), or LoRA
            targets that are not the MHA's.
    """
    from vitplasticity.models.architectures import (
        ParameterMap,
        UnsupportedModel,
        architecture_for,
    )
    from vitplasticity.recommend.criteria import configuration_components
    from vitplasticity.recommend.matrix_criteria import matrix_statistics
    from vitplasticity.recommend.trainer_exports import trainer_exports

    probe = configuration in (None, LINEAR_PROBE)
    components = () if probe else configuration_components(configuration)
    architecture = architecture_for(model)
    refusal = architecture.refusal("export", model)
    if refusal is not None:
        raise UnsupportedModel(f"export of {type(model).__name__}: {refusal}")
    parameters, names = ParameterMap(architecture, model), _Names(model)
    chosen = {c: parameters.component_names(c) for c in components}
    always = _head_names(parameters)
    forms = _peft_forms(architecture, model, parameters, names, components)
    lora, ln_tuning = _peft_configs(architecture, model, forms)
    counts = _counts(names.sizes, chosen, always)
    trained_names = set(always).union(*chosen.values())
    trained = [n for n in names.parameters if n in trained_names]
    if lora is not None:
        counts["lora_adapters"] = _adapter_count(model, lora["config"])
    return {
        "format": FORMAT,
        "model": _model_record(model_name, model_entry, model, architecture),
        "dataset": dataset,
        "recommendation": None if recommendation is None else dict(recommendation),
        "configuration": configuration,
        "components": list(components),
        "parameters": {"components": chosen, "always_trained": always},
        "counts": counts,
        "peft": {"lora": lora, "ln_tuning": ln_tuning, "forms": forms},
        "trainers": trainer_exports(
            model, trained, matrix_statistics(model) if matrices is None else matrices
        ),
        "usage": _usage(configuration, lora, ln_tuning),
        "verification": dict(verification or heuristic_record(recommendation)),
    }


def _model_record(
    name: str, entry: Mapping[str, Any], model: nn.Module, architecture: Architecture
) -> dict[str, Any]:
    """The export's model: name, config entry, class (``package.module.Class``), architecture."""
    return {
        "name": name,
        "entry": dict(entry),
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "architecture": architecture.name,
    }


def _counts(
    sizes: Mapping[str, int], chosen: Mapping[str, list[str]], always: list[str]
) -> dict[str, Any]:
    """Parameters of each ``chosen`` component, all of them, ``always``, the model, trained."""
    counts = {
        "components": {c: sum(sizes[n] for n in names) for c, names in chosen.items()},
        "configuration": sum(sizes[n] for names in chosen.values() for n in names),
        "always_trained": sum(sizes[n] for n in always),
        "model": sum(sizes.values()),
    }
    counts["trained"] = counts["configuration"] + counts["always_trained"]
    return counts


class _Names:
    """The model's module and parameter names, by identity."""

    def __init__(self, model: nn.Module) -> None:
        self.modules = [name for name, _ in model.named_modules(remove_duplicate=False)]
        self.of_module = {id(module): name for name, module in model.named_modules()}
        self.parameters = [name for name, _ in model.named_parameters()]
        self.of_parameter = {id(p): name for name, p in model.named_parameters()}
        self.sizes = {name: p.numel() for name, p in model.named_parameters()}
        self.holds_parameters = {
            name
            for name, module in model.named_modules(remove_duplicate=False)
            if next(module.parameters(), None) is not None
        }

    def of(self, modules: Iterable[nn.Module]) -> list[str]:
        """Names of ``modules``, in ``named_modules`` order."""
        wanted = {id(module) for module in modules}
        return [name for key, name in self.of_module.items() if key in wanted]

    def parameters_of(self, modules: Iterable[nn.Module]) -> list[str]:
        """Names of the parameters held by ``modules``, in ``named_parameters`` order."""
        wanted = {self.of_parameter[id(p)] for module in modules for p in module.parameters()}
        return [name for name in self.parameters if name in wanted]


def _peft_forms(
    architecture: Architecture,
    model: nn.Module,
    parameters: ParameterMap,
    names: _Names,
    components: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """Per chosen component and for the head: its PEFT form and the parameters the form
    leaves frozen, or no form and why."""
    blocks = architecture.blocks(model)
    forms: dict[str, dict[str, Any]] = {}
    head = architecture.head(model)
    held = [names.of_parameter[id(p)] for p in head.parameters if p is not None]
    if held:
        forms["head"] = _no_form(f"parameters held outside a module ({', '.join(held)})")
    else:
        forms["head"] = _saved_form("modules_to_save", names, head.modules, _head_names(parameters))
    saved = forms["head"].get("modules", [])
    for component in (c for c in components if c in NORM_COMPONENTS):
        modules = [m for block in blocks for m in architecture.components(block)[component]]
        forms[component] = _saved_form(
            "ln_tuning", names, modules, parameters.component_names(component), saved=saved
        )
    saved = [m for form in forms.values() if form["form"] for m in form["modules"]]
    for component in (c for c in components if c not in NORM_COMPONENTS):
        forms[component] = _lora_form(
            architecture, model, parameters, names, blocks, component, saved
        )
    return forms


def _head_names(parameters: ParameterMap) -> list[str]:
    """The head and final norm's parameters, in ``named_parameters`` order."""
    return [n for n, owner in parameters.owners.items() if owner.trained_by == "head"]


def _no_form(reason: str) -> dict[str, Any]:  # a part without a PEFT form, and why
    return {"form": None, "reason": reason}


def _saved_form(
    form: str,
    names: _Names,
    modules: Iterable[nn.Module],
    trained: Sequence[str],
    *,
    saved: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A part peft trains as copies of whole modules: the modules that hold parameters,
    checked under modules_to_save's suffix rule (a norm is in the LoRA config's), and for
    LNTuning's targets (``saved`` given: the head's modules_to_save beside them) under
    ``target_modules``' dotted one and the exclusion of what ``saved`` covers."""
    modules = [m for m in modules if next(m.parameters(), None) is not None]
    if not modules:
        return _no_form("it holds no parameters")
    entries = names.of(modules)
    extra = [
        name
        for name in modules_to_save_matches(names.modules, entries)
        if name in names.holds_parameters and name not in entries
    ]
    if saved is not None:
        extra += [n for n in target_matches(names.modules, entries) if n not in entries]
        skipped = [e for e in entries if excluded_by_modules_to_save(e, saved)]
        if skipped:
            return _no_form(
                f"peft would skip {', '.join(skipped[:4])}: their names fall under a "
                "modules_to_save entry"
            )
    if extra:
        return _no_form(
            f"peft would also train {', '.join(sorted(set(extra))[:4])}: a module whose name "
            f"ends as an entry of {', '.join(entries[:4])} does"
        )
    covered = set(names.parameters_of(modules))
    return {
        "form": form,
        "modules": entries,
        "frozen": [n for n in trained if n not in covered],
    }


def _lora_form(
    architecture: Architecture,
    model: nn.Module,
    parameters: ParameterMap,
    names: _Names,
    blocks: Sequence[nn.Module],
    component: str,
    saved: Sequence[str],
) -> dict[str, Any]:
    """A linear component: LoRA on its linear modules (MHA: the architecture's lora_targets).

    Raises:
        UnsupportedModel: when a LoRA target's weight is not the component's.
    """
    from vitplasticity.models.architectures import UnsupportedModel

    trained = parameters.component_names(component)
    fused: list[str] = []
    if component == "mha":
        targets = architecture.lora_targets(model)
    else:
        modules = [m for block in blocks for m in architecture.components(block)[component]]
        targets, fused = _linear_targets(model, names, modules)
    if not targets and not fused:
        return _no_form(f"{component} holds no linear module (nn.Linear or Conv1D) to adapt")
    adapted = [f"{target}.weight" for target in targets] + fused
    foreign = [name for name in adapted if name not in trained]
    if foreign:
        raise UnsupportedModel(
            f"{type(model).__name__}: the {architecture.title} LoRA targets' weights "
            f"{', '.join(foreign[:4])} are not {component}'s parameters"
        )
    extra = [n for n in target_matches(names.modules, targets) if n not in targets]
    extra += [n for n in target_matches(names.parameters, fused) if n not in fused]
    if extra:
        return _no_form(
            f"peft would also adapt {', '.join(extra[:4])}: a name that ends as a "
            f"target's ({', '.join([*targets, *fused][:4])}) does"
        )
    skipped = [t for t in targets if excluded_by_modules_to_save(t, saved)]
    if skipped:
        return _no_form(
            f"peft would skip {', '.join(skipped[:4])}: their names fall under a "
            "modules_to_save entry"
        )
    return {
        "form": "lora",
        "modules": targets,
        "parameters": fused,
        "adapted": adapted,
        "frozen": [n for n in trained if n not in adapted],
    }


def _linear_targets(
    model: nn.Module, names: _Names, modules: Sequence[nn.Module]
) -> tuple[list[str], list[str]]:
    """The linear modules a component's ``modules`` hold (LoRA's ``target_modules``) and the
    3-D parameters they read, each a stack of per-expert matrices (``target_parameters``).

    A module the model does not hold is a view of the model's parameters (an MoE's routed
    FC1 or FC2, :mod:`~vitplasticity.models.architectures.hf_moe`): its linears are the
    model's linear modules whose weight it reads (a shared expert's), and its fused experts'
    3-D parameters are adapted as peft adapts them, per expert (``lora.ParamWrapper``)."""
    from vitplasticity.models.architectures.base import is_linear_layer

    held = [m for m in modules if id(m) in names.of_module]
    read = {id(p): p for m in modules if id(m) not in names.of_module for p in m.parameters()}
    linears = [sub for module in held for sub in module.modules() if is_linear_layer(sub)]
    linears += [m for m in model.modules() if is_linear_layer(m) and id(m.weight) in read]
    fused = [names.of_parameter[key] for key, p in read.items() if p.ndim == 3]
    return names.of(linears), [n for n in names.parameters if n in fused]


def _peft_configs(
    architecture: Architecture, model: nn.Module, forms: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The LoRA config (with the attributes to set first) and the LNTuning config, each None
    when the configuration has no part of that form.

    Raises:
        UnsupportedModel: for LoRA targets of two kinds (no one ``fan_in_fan_out``).
    """
    from vitplasticity.models.architectures import UnsupportedModel

    def modules(form: str) -> list[str]:
        return [m for f in forms.values() if f["form"] == form for m in f["modules"]]

    head = modules("modules_to_save") or None
    lora = ln_tuning = None
    norms = modules("ln_tuning")
    if norms:
        ln_tuning = {"config": {"target_modules": norms, "modules_to_save": head}}
    targets = modules("lora")
    fused = [p for f in forms.values() if f["form"] == "lora" for p in f["parameters"]]
    if targets or fused:
        by_name = dict(model.named_modules())
        # transformers' Conv1D stores its weight (in, out): peft must know, and one config
        # holds one flag.
        transposed = {type(by_name[t]).__name__ == "Conv1D" for t in targets} or {False}
        if len(transposed) > 1:
            raise UnsupportedModel(
                f"{type(model).__name__}: LoRA targets mix nn.Linear and Conv1D modules; one "
                "LoraConfig has one fan_in_fan_out"
            )
        config = {
            "r": LORA_RANK,
            "lora_alpha": LORA_ALPHA,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": transposed.pop(),
            "target_modules": targets,
            "modules_to_save": (norms + (head or [])) or None,
        }
        if fused:  # a key peft knows from 0.17 on: written only where it is needed
            config["target_parameters"] = fused
        lora = {"config": config, "set_attributes": _lora_preparation(architecture, model)}
    return lora, ln_tuning


def _scalar_attributes(model: nn.Module) -> dict[str, Any]:
    """Every module's plain (bool, int, float, str) attributes, by dotted path."""
    found = {}
    for name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if not attribute.startswith("_") and isinstance(value, (bool, int, float, str)):
                found[f"{name}.{attribute}" if name else attribute] = value
    return found


def _lora_preparation(architecture: Architecture, model: nn.Module) -> dict[str, Any]:
    """The attributes :meth:`Architecture.prepare_lora` sets, found by running it and setting
    them back, so that a user sets them without vitplasticity.

    Raises:
        UnsupportedModel: when it changes more than plain attributes (modules, parameters).
    """
    from vitplasticity.models.architectures import UnsupportedModel

    before = _scalar_attributes(model)
    structure = [id(x) for x in (*model.modules(), *model.parameters())]
    architecture.prepare_lora(model)
    after = _scalar_attributes(model)
    changed = {path: value for path, value in after.items() if before.get(path, ...) != value}
    for path in changed:
        owner, _, attribute = path.rpartition(".")
        module = model.get_submodule(owner)
        if path in before:
            setattr(module, attribute, before[path])
        else:
            delattr(module, attribute)
    if [id(x) for x in (*model.modules(), *model.parameters())] != structure:
        raise UnsupportedModel(
            f"{architecture.title}: preparing {type(model).__name__} for LoRA changes its "
            "modules or parameters, which the export cannot state as attributes to set"
        )
    return changed


def _adapter_count(model: nn.Module, config: Mapping[str, Any]) -> int:
    """LoRA adapter parameters at :data:`LORA_RANK`: r (in + out) per adapted linear, and
    r (in + out) per expert of an adapted 3-D parameter (E, out, in)."""
    from vitplasticity.models.architectures.base import linear_weight

    by_name = dict(model.named_modules())
    tensors = dict(model.named_parameters())
    linears = sum(sum(linear_weight(by_name[t])[0].shape) for t in config["target_modules"])
    experts = sum(
        tensors[p].shape[0] * sum(tensors[p].shape[1:]) for p in config.get("target_parameters", ())
    )
    return LORA_RANK * (linears + experts)


def _usage(
    configuration: str | None, lora: Mapping[str, Any] | None, ln_tuning: Mapping[str, Any] | None
) -> list[str]:
    """How to apply the file, in sentences."""
    if configuration == LINEAR_PROBE:
        return ["Linear probing: train the head and final norm alone (parameters.always_trained)."]
    if configuration is None:
        return [
            "No configuration fits the budget: train the head and final norm alone "
            "(parameters.always_trained)."
        ]
    sentences = [
        "Without PEFT: train exactly parameters.components and parameters.always_trained and "
        "freeze the rest (with vitplasticity installed: "
        f"vitplasticity.select(model, {configuration!r}))."
    ]
    if lora is not None:
        sentences.append(
            "LoRA: set each of peft.lora.set_attributes on the model (module path, then "
            "attribute), then peft.get_peft_model(model, peft.LoraConfig(**peft.lora.config)); "
            "it adapts the linear components' weights in low rank and trains copies of the "
            "modules_to_save; each form's 'frozen' parameters stay frozen."
        )
    if ln_tuning is not None:
        sentences.append(
            "Norms alone: peft.get_peft_model(model, peft.LNTuningConfig(**peft.ln_tuning.config))."
        )
    sentences.append("A part whose peft.forms entry has no form is not in the PEFT configs.")
    sentences.append(
        "axolotl: unfrozen_parameters: trainers.axolotl.unfrozen_parameters (anchored, one per "
        "parameter); a trainer taking names: freeze trainers.freeze; axolotl's Spectrum plugin: "
        "trainers.spectrum (its usage)."
    )
    return sentences


def heuristic_record(recommendation: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record of recommend's pick: unverified, and the criterion that ranked it first."""
    return {
        "verified": False,
        "criterion": None if recommendation is None else recommendation.get("criterion"),
        "note": (
            "ranked by a criterion, not measured by finetuning: `vitplasticity "
            "recommend-verify` checks it (docs/recommend.md)"
        ),
    }
