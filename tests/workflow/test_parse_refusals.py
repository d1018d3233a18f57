"""What a stage refuses for a model, when the config alone decides it, is named when the
Snakefile is parsed, with the key, the model, the family's own reason and what to do (issue 42):
a Swin under the embedding protocol and its bounds, an MoE or an encoder ranked by
recommend --text, a decoder's text bounds, a Falcon with ALiBi or one norm, a DeBERTa-v2 with its
convolution, a Swin grid that is not a whole number of windows; and a text experiment is
checked as every experiment is, and for what only text has (its models take token ids, its
datasets one kind, its sequences within the model's positions). Each case a row (the edit over
config.yaml, the words its message must hold), through the passes the Snakefile runs; one
`snakemake -n` row shows it stops before any job."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.configs import PAPER, SCHEMA, dry_run, load_config, merged
from tests.helpers.text_entries import text_dataset
from vitplasticity.workflow.config import ConfigError, check_keys, load_schema
from vitplasticity.workflow.config_check import check_config

SCHEMA_DICT = load_schema(SCHEMA)
SWIN = {"family": "timm", "timm_id": "swin_tiny_patch4_window7_224", "weights": "random"}
TINY_SWIN_KWARGS = {"embed_dim": 12, "depths": [2, 2], "num_heads": [2, 4], "window_size": 2}


def checked(config: dict[str, Any]) -> None:
    """The Snakefile's passes: strict keys (names included), then the cross-checks."""
    check_keys(config, SCHEMA_DICT)
    check_config(config, build_models=True)


def random_text(model_type: str, **config: Any) -> dict[str, Any]:
    """A random-init transformers entry of ``model_type`` (no hub, no download)."""
    return {
        "family": "transformers",
        "hf_id": f"tiny/{model_type}",
        "weights": "random",
        "config": {"model_type": model_type, **config},
    }


def text_file(tmp: Path) -> str:
    path = tmp / "text.txt"
    path.write_text("one document\nanother\n")
    return str(path)


def measured(tmp: Path, entry: dict[str, Any], recommend: bool = False, **text: Any) -> dict:
    """``entry`` as model ``m``, measured by text plasticity (and ranked by recommend --text with
    ``recommend``)."""
    edit: dict[str, Any] = {
        "models": {"m": entry},
        "datasets": {"ref": text_dataset(text_file(tmp)), "wiki": text_dataset(text_file(tmp))},
        "text_plasticity": {
            "enabled": True,
            "run_models": ["m"],
            "reference": "ref",
            "datasets": ["wiki"],
            **text,
        },
    }
    if recommend:
        edit["recommend"] = {"enabled": True}
    return edit


def saved_folder(tmp: Path, config: dict[str, Any]) -> str:
    """A local weights folder whose config.json is ``config`` (read at parse)."""
    folder = tmp / "saved"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def text_grid(tmp: Path, **grid: Any) -> dict[str, Any]:
    """A text experiment on a tiny GPT2, with ``grid`` over its keys."""
    return {
        "models": {"g": random_text("gpt2", n_positions=256)},
        "datasets": {"wiki": text_dataset(text_file(tmp), steps=3000)},
        "experiments": {
            "text": {
                "optimizer": "adamw",
                "models": ["g"],
                "datasets": ["wiki"],
                "configurations": ["mha"],
                "lrs": [1.0e-4],
                "seeds": [0],
                **grid,
            }
        },
    }


Edit = Callable[[Path], dict[str, Any]]
CASES: list[tuple[str, Edit, list[str]]] = [
    (
        "swin-embedding-protocol",
        lambda tmp: {"models": {"swin_t": SWIN}, "plasticity": {"models": ["swin_t"]}},
        [
            "plasticity.models: 'swin_t' (swin_tiny_patch4_window7_224): timm_swin refuses "
            "the embedding protocol: its stages have different widths",
            "use plasticity.protocols: [in_situ] or drop the model",
        ],
    ),
    (
        "swin-bounds",
        lambda tmp: {
            "models": {"swin_t": SWIN},
            "plasticity": {"models": ["swin_t"], "protocols": ["in_situ"]},
        },
        [
            "plasticity.models: 'swin_t' (swin_tiny_patch4_window7_224): timm_swin refuses "
            "the bounds: its attention adds a learned relative position bias",
            "the bounds of every plasticity.models entry: drop the model",
        ],
    ),
    (
        "swin-recommend",
        lambda tmp: {
            "models": {"swin_t": SWIN},
            "recommend": {"enabled": True, "models": ["swin_t"]},
        },
        [
            "recommend.models (recommend.enabled): 'swin_t' (swin_tiny_patch4_window7_224): "
            "timm_swin refuses recommend: recommend ranks by the embedding protocol's plasticity",
        ],
    ),
    (
        "swin-grid-not-whole-windows",
        lambda tmp: {
            "models": {"swin_t": {**SWIN, "kwargs": {**TINY_SWIN_KWARGS, "img_size": 24}}},
            "plasticity": {"models": ["swin_t"], "protocols": ["in_situ"]},
        },
        [
            "plasticity.models: 'swin_t' (swin_tiny_patch4_window7_224): timm_swin refuses "
            "the in_situ protocol: block 2's 3 x 3 grid is not a whole number of 2 x 2 windows",
            "drop the model (it takes neither protocol)",
        ],
    ),
    (
        "hf-swin-by-model-class",
        lambda tmp: {
            "models": {
                "swin_hf": {
                    "family": "transformers",
                    "hf_id": "microsoft/swin-tiny-patch4-window7-224",
                    "model_class": "SwinForImageClassification",
                }
            },
            "plasticity": {"models": ["swin_hf"]},
        },
        ["plasticity.models: 'swin_hf' (microsoft/swin-tiny-patch4-window7-224)"],
    ),
    (
        "bert-recommend-text",
        lambda tmp: measured(tmp, random_text("bert"), recommend=True),
        [
            "'m' (tiny/bert): hf_bert refuses recommend by the next-token loss (unlabelled text):",
            "no next-token loss",
        ],
    ),
    (
        "deberta-v2-recommend-text",
        lambda tmp: measured(tmp, random_text("deberta-v2"), recommend=True),
        [
            "'m' (tiny/deberta-v2): hf_deberta_v2 refuses recommend by the next-token loss",
            "recommend --labelled-text",
        ],
    ),
    (
        "llama-text-bounds",
        lambda tmp: measured(tmp, random_text("llama"), bounds_models=["m"]),
        [
            "text_plasticity.bounds_models: 'm' (tiny/llama): hf_llama refuses "
            "the bounds: the paper's bounds are stated for LayerNorm (RMSNorm does not centre)",
            "drop it from text_plasticity.bounds_models",
        ],
    ),
    (
        "falcon-alibi",
        lambda tmp: measured(tmp, random_text("falcon", alibi=True)),
        ["models.m: 'm' (tiny/falcon) is refused by every stage: ALiBi (alibi)"],
    ),
    (
        "falcon-one-norm",
        lambda tmp: measured(
            tmp,
            random_text("falcon", new_decoder_architecture=True, num_ln_in_parallel_attn=1),
        ),
        ["models.m: 'm' (tiny/falcon) is refused by every stage: one norm"],
    ),
    (
        "deberta-v2-convolution",
        lambda tmp: measured(tmp, random_text("deberta-v2", conv_kernel_size=3)),
        ["models.m: 'm' (tiny/deberta-v2) is refused by every stage: encoder.conv"],
    ),
    (
        "bert-as-a-decoder",
        lambda tmp: measured(tmp, random_text("bert", is_decoder=True)),
        ["models.m: 'm' (tiny/bert) is refused by every stage: configured as a decoder"],
    ),
    (
        "text-grid-lr-twice",
        lambda tmp: text_grid(tmp, lrs=[1.0e-4, 1.0e-4]),
        ["experiments.text.lrs: 0.0001 is listed twice"],
    ),
    (
        "text-grid-model-twice",
        lambda tmp: text_grid(tmp, models=["g", "g"]),
        ["experiments.text.models: 'g' is listed twice"],
    ),
    (
        "text-grid-two-spellings",
        lambda tmp: text_grid(tmp, configurations=["mha+fc1", "fc1+mha"]),
        [
            "experiments.text.configurations: 'mha+fc1' and 'fc1+mha' train the same parameters",
            "list that configuration once",
        ],
    ),
    (
        "text-grid-lr-out-of-range",
        lambda tmp: text_grid(tmp, lrs=[1e300]),
        ["experiments.text.lrs[0]: 1e+300 is outside the learning rates a run can use"],
    ),
    (
        "text-grid-lr-infinite",
        lambda tmp: text_grid(tmp, lrs=[math.inf]),
        ["experiments.text.lrs: inf is not a learning rate (a finite number > 0)"],
    ),
    (
        "text-grid-dataset-with-slash",
        lambda tmp: merged(
            text_grid(tmp),
            {
                "datasets": {"wiki/2": text_dataset(text_file(tmp))},
                "experiments": {"text": {"datasets": ["wiki/2"]}},
            },
        ),
        ["datasets.wiki/2: not a name a path can hold", "rename it, e.g. wiki_2"],
    ),
    (
        "text-grid-image-and-text-datasets",
        lambda tmp: text_grid(tmp, datasets=["wiki", "cifar100"]),
        [
            "experiments.text.datasets: text datasets of source text_file (wiki) and image "
            "datasets (cifar100): an experiment finetunes on one kind; split it in two"
        ],
    ),
    (
        "text-grid-image-model",
        lambda tmp: text_grid(tmp, models=["g", "vit_base"]),
        [
            "experiments.text.models: 'vit_base' takes images, and experiments.text.datasets "
            "are text datasets (wiki): a text experiment finetunes transformers text models"
        ],
    ),
    (
        "image-grid-text-model",
        lambda tmp: merged(text_grid(tmp), {"experiments": {"sgd": {"models": ["g"]}}}),
        ["experiments.sgd.models: 'g' is a text model", "an experiment of text datasets"],
    ),
    (
        "text-grid-sequence-past-positions",
        lambda tmp: merged(text_grid(tmp), {"datasets": {"wiki": {"sequence_length": 512}}}),
        [
            "datasets.wiki.sequence_length: 512 exceeds the 256 positions that models.g.config "
            "states (experiments.text finetunes it on wiki)"
        ],
    ),
    (
        "text-grid-warmup-past-steps",
        lambda tmp: merged(text_grid(tmp), {"datasets": {"wiki": {"steps": 100}}}),
        [
            "finetune.warmup_steps: 2000, not fewer than datasets.wiki.steps 100: the runs of "
            "experiments.text would never reach their learning rate"
        ],
    ),
    (
        "text-grid-compile",
        lambda tmp: merged(text_grid(tmp), {"finetune": {"compile": True}}),
        ["finetune.compile: true, and experiments.text finetunes text datasets"],
    ),
    (
        "text-plasticity-dataset-with-slash",
        lambda tmp: merged(
            measured(tmp, random_text("gpt2"), datasets=["../up"]),
            {"datasets": {"../up": text_dataset(text_file(tmp))}},
        ),
        ["datasets.../up: not a name a path can hold"],
    ),
]


@pytest.mark.parametrize(("edit", "words"), [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_a_refusal_the_config_decides_is_named_at_parse(
    tmp_path: Path, edit: Edit, words: list[str]
) -> None:
    config = merged(load_config(PAPER), edit(tmp_path))
    with pytest.raises(ConfigError) as error:
        checked(config)
    message = str(error.value)
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"


def test_what_the_config_does_not_decide_is_left_to_the_job(tmp_path: Path) -> None:
    """A hub checkpoint without model_class: its config.json (its family) is fetched by the
    weights job, so no refusal is guessed at parse; a Falcon with two norms, a GPT2 and a
    mixture of experts ranked by recommend --text and a Swin finetuned are not refused."""
    hub_moe = {"family": "transformers", "hf_id": "mistralai/Mixtral-8x7B-v0.1"}
    checked(merged(load_config(PAPER), measured(tmp_path, hub_moe, recommend=True)))
    falcon = random_text("falcon", new_decoder_architecture=True)
    checked(merged(load_config(PAPER), measured(tmp_path, falcon)))
    for ranked in ("gpt2", "mixtral"):
        checked(merged(load_config(PAPER), measured(tmp_path, random_text(ranked), recommend=True)))
    swin = {"models": {"swin_t": SWIN}, "experiments": {"sgd": {"models": ["swin_t"]}}}
    checked(merged(load_config(PAPER), swin))


@pytest.mark.slow
def test_snakemake_stops_at_parse_on_a_refusal(tmp_path: Path) -> None:
    """The default protocol with a Swin: the dry run names it and plans no job."""
    edit = {"models": {"swin_t": SWIN}, "plasticity": {"models": ["swin_t"]}}
    result = dry_run(tmp_path, PAPER, edit=edit)
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "plasticity.models: 'swin_t' (swin_tiny_patch4_window7_224)" in out, out
    assert "use plasticity.protocols: [in_situ] or drop the model" in out, out
    assert "Traceback" not in out and "Building DAG" not in out, out
    assert not (tmp_path / "results").exists()
