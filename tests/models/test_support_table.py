"""docs/architectures.md's family x stage table, cell by cell, against the code.

Every cell is ``supported`` (the stage runs on the family's first tiny model in
tests/helpers/tiny_models.py), ``refused: "<text>"`` (the stage refuses it, the error
containing that text, before any compute), or, for the bounds, ``<COMPONENTS> refused:
"<text>"`` (the bound of exactly those components is not defined, for that reason; the others
are computed). The table cannot drift from the code: a changed message or a newly supported
stage fails here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.repo import REPO
from tests.helpers.tiny_models import TINY_MODELS, TinyModel
from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import (
    ARCHITECTURES,
    Architecture,
    ParameterMap,
    UndefinedStage,
    UnsupportedModel,
    architecture_for,
)
from vitplasticity.models.lora import apply_lora, check_adapters_used
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.upper_bounds import undefined_bounds, upper_bounds
from vitplasticity.recommend.criteria import measure_criteria

TABLE = REPO / "docs" / "architectures.md"
STAGES = (
    "plasticity (embedding)",
    "plasticity (in situ)",
    "bounds",
    "finetune",
    "recommend",
    "LoRA",
)
REFUSED = re.compile(r'^(?:(?P<components>[A-Z0-9, ]+) )?refused: "(?P<reason>[^"]+)"$')


def read_table() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """(family -> tested model id, (family, stage) -> cell) from the docs' table."""
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in TABLE.read_text().splitlines()
        if line.startswith("| `")
    ]
    tested = {row[0].strip("`"): row[1].strip("`") for row in rows}
    cells = {
        (row[0].strip("`"), stage): cell
        for row in rows
        for stage, cell in zip(STAGES, row[2:], strict=True)
    }
    return tested, cells


TESTED, CELLS = read_table()


def test_the_table_has_every_family_and_stage() -> None:
    assert sorted(TESTED) == sorted(ARCHITECTURES)
    header = next(line for line in TABLE.read_text().splitlines() if line.startswith("| family"))
    assert [c.strip() for c in header.strip().strip("|").split("|")][2:] == list(STAGES)
    for (family, stage), cell in CELLS.items():
        refused = REFUSED.match(cell)
        assert cell == "supported" or refused, (family, stage, cell)
        if refused and stage != "bounds":  # only the bounds are refused per component
            assert not refused["components"], (family, stage)


def _case(family: str) -> TinyModel:
    return next(case for case in TINY_MODELS if case.id == TESTED[family])


def _refuse(architecture: Architecture, stage: str, model: nn.Module) -> None:
    refusal = architecture.refusal(stage, model)
    if refusal is not None:
        raise UnsupportedModel(refusal)


def _classify(architecture: Architecture, model: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    logits = getattr(architecture, "logits", None)
    return logits(model, inputs) if logits is not None else model(inputs)


def run_plasticity(model: nn.Module, inputs: torch.Tensor, protocol: str) -> None:
    architecture = architecture_for(model)
    _refuse(architecture, "plasticity", model)
    frame = measure(model, inputs, inputs.flip(0), protocol=protocol, batch_size=2)
    assert set(frame["component"]) == set(COMPONENTS)


def run_bounds(model: nn.Module, inputs: torch.Tensor) -> dict[str, str]:
    undefined = undefined_bounds(model)  # a family without bounds raises here
    tokens = architecture_for(model).embed(model, inputs).tokens
    table = upper_bounds(model, tokens)
    assert set(table["component"]) == set(COMPONENTS) - set(undefined)
    return undefined


def _text_lm(model: nn.Module) -> tuple[nn.Module, Callable[[nn.Module, torch.Tensor], Any]]:
    """A text family's model as text finetuning trains it, with its loss on token ids: an
    encoder in its masked-LM class (the masked-LM loss), a decoder as its causal LM (the
    next-token loss)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_MASKED_LM_MAPPING,
    )

    from vitplasticity.finetune.tasks import masked_inputs, masked_lm_loss, next_token_loss
    from vitplasticity.finetune.text_run import masked_positions
    from vitplasticity.models.text import causal_lm

    if architecture_for(model).text_task == "masked":
        lm = MODEL_FOR_MASKED_LM_MAPPING[type(model.config)](model.config)

        def masked(lm: nn.Module, ids: torch.Tensor) -> torch.Tensor:
            mask = masked_positions(ids.shape, 0.25, torch.Generator().manual_seed(0))
            logits = lm(input_ids=masked_inputs(ids, mask, 0)).logits
            return masked_lm_loss(logits, ids, mask)

        return lm, masked
    if model.get_output_embeddings() is None and not model.config.tie_word_embeddings:
        model = MODEL_FOR_CAUSAL_LM_MAPPING[type(model.config)](model.config)
    return causal_lm(model), lambda lm, ids: next_token_loss(lm(input_ids=ids).logits, ids)


def run_finetune(model: nn.Module, inputs: torch.Tensor) -> None:
    """Every component configuration trains parameters of that component in every block, and
    each of them gets a gradient from the finetuning loss: classification for images, the
    LM's loss for text (vitplasticity finetune --text)."""
    architecture = architecture_for(model)
    _refuse(architecture, "finetune", model)
    if architecture.inputs == "tokens":
        model, text_loss = _text_lm(model)
        architecture = architecture_for(model)

        def loss() -> torch.Tensor:
            return text_loss(model, inputs)
    else:
        labels = torch.arange(len(inputs)) % 2

        def loss() -> torch.Tensor:
            return F.cross_entropy(_classify(architecture, model, inputs), labels)

    parameters = ParameterMap(architecture, model)
    named = dict(model.named_parameters())
    for component in COMPONENTS:
        trained = parameters.trained_names(component)
        for name, parameter in named.items():
            parameter.requires_grad_(name in trained)
            parameter.grad = None
        loss().backward()
        owned = [n for n, o in parameters.owners.items() if o.trained_by == component]
        # a part held once for every block (DeBERTa-v2's relative embeddings) has no block
        blocks = {parameters.owners[n].block for n in owned} - {None}
        assert blocks == set(range(len(architecture.blocks(model)))), component
        for name in owned:
            assert named[name].grad is not None, name
        assert sum(float(named[n].grad.abs().sum()) for n in owned) > 0, component


def run_recommend(model: nn.Module, inputs: torch.Tensor) -> None:
    architecture = architecture_for(model)
    _refuse(architecture, "recommend", model)
    if architecture.inputs == "tokens" and architecture.refusal("recommend lm", model):
        # An encoder has no next-token loss: it is ranked as a sequence classifier with a new
        # head, by the classification loss on labelled text (recommend --labelled-text).
        import torch.nn.functional as F

        from vitplasticity.models.text import sequence_classifier
        from vitplasticity.recommend.text_criteria import measure_text_criteria

        classifier, _ = sequence_classifier(model, 2, pad_token_id=0)
        classifier.eval()
        attention, labels = torch.ones_like(inputs), torch.arange(len(inputs)) % 2
        batches = [(inputs, attention, labels), (inputs.flip(0), attention, labels)]

        def loss(batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
            logits = classifier(input_ids=batch[0], attention_mask=batch[1]).logits
            return F.cross_entropy(logits, batch[2])

        measurements = measure_text_criteria(
            classifier, inputs, inputs.flip(0), batches, n_pairs=2, loss=loss, nfn_inputs=inputs
        )
    elif architecture.inputs == "tokens":
        # A text family is ranked as a causal LM on token ids (recommend --text). A bare model
        # with an untied head lacks the head's weights: its models: entry names the causal-LM
        # class (model_class), as here.
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        from vitplasticity.models.text import causal_lm
        from vitplasticity.recommend.text_criteria import measure_text_criteria

        if model.get_output_embeddings() is None and not model.config.tie_word_embeddings:
            model = MODEL_FOR_CAUSAL_LM_MAPPING[type(model.config)](model.config).eval()
        batches = [inputs, inputs.flip(0)]
        measurements = measure_text_criteria(
            causal_lm(model), inputs, inputs.flip(0), batches, n_pairs=2
        )
    else:
        labels = torch.arange(len(inputs)) % 2
        batches = [(inputs, labels), (inputs.flip(0), labels)]
        measurements = measure_criteria(
            model, inputs, inputs.flip(0), batches[:1], batches, n_pairs=2, warmup_lr=0.01
        )
    assert measurements.trainable_parameters("mha+fc1") > 0


def run_lora(model: nn.Module, inputs: torch.Tensor) -> None:
    architecture = architecture_for(model)
    _refuse(architecture, "lora", model)
    adapted = apply_lora(copy.deepcopy(model), rank=2, alpha=4.0)
    check_adapters_used(adapted, inputs)
    trained = ParameterMap(architecture, adapted).trained_names("lora")
    assert any(".lora_" in name for name in trained)


def run(stage: str, model: nn.Module, inputs: torch.Tensor) -> dict[str, str] | None:
    if stage.startswith("plasticity"):
        run_plasticity(model, inputs, "in_situ" if "situ" in stage else "embedding")
        return None
    runner = {"finetune": run_finetune, "recommend": run_recommend, "LoRA": run_lora}
    if stage == "bounds":
        return run_bounds(model, inputs)
    runner[stage](model, inputs)
    return None


@pytest.mark.parametrize(("family", "stage"), sorted(CELLS), ids=lambda value: str(value))
def test_cell(family: str, stage: str) -> None:
    case = _case(family)
    torch.manual_seed(0)
    model = case.build().eval()
    inputs = case.inputs(4)
    cell = CELLS[(family, stage)]
    refused = REFUSED.match(cell)
    if refused is None:
        undefined = run(stage, model, inputs)
        assert not undefined, f"{family} {stage}: undefined bounds {undefined}"
    elif refused["components"]:
        undefined = run(stage, model, inputs)
        listed = [c.strip().lower() for c in refused["components"].split(",")]
        assert list(undefined) == listed
        for reason in undefined.values():
            assert refused["reason"] in reason
    else:
        with pytest.raises((UnsupportedModel, UndefinedStage)) as error:
            run(stage, model, inputs)
        assert refused["reason"] in str(error.value)
