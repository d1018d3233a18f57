"""``vitplasticity recommend --text``: a causal LM's components ranked on the user's text files.

Tiny random GPT2 and Llama models (tests/helpers/tiny_models.py) with the byte tokenizer, on text
files the tests write: the table holds every criterion per configuration; the gradient criteria
equal next-token cross-entropy gradients taken here by autograd, batch by batch, with RGN and SNR
by their formulas (float64, 1e-10); plasticity equals the text plasticity stage's; the JSON
export names the chosen configuration's parameters; refusals name the culprit.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml
from polars.testing import assert_frame_equal

from tests.helpers.repo import REPO
from tests.helpers.text_entries import text_dataset
from tests.helpers.tiny_models import (
    GPT2_TINY_CONFIG,
    HF_TEXT_TINY_CONFIG,
    TINY_MODELS,
    perturbed,
)
from vitplasticity.cli import main
from vitplasticity.components import COMPONENTS
from vitplasticity.data.loader import batch_indices
from vitplasticity.data.text import byte_tokenizer, read_sequences
from vitplasticity.models.architectures import UnsupportedModel, architecture_for
from vitplasticity.models.text import causal_lm
from vitplasticity.plasticity.settings import TextPlasticitySettings
from vitplasticity.plasticity.text import measure_text
from vitplasticity.recommend.criteria import CRITERIA
from vitplasticity.recommend.pipeline import write_outputs
from vitplasticity.recommend.settings import DEFAULT_CONFIGURATIONS, RecommendTextSettings
from vitplasticity.recommend.text import recommend_text
from vitplasticity.recommend.text_criteria import user_sequences
from vitplasticity.recommend.text_inputs import TextRecommendInputs
from vitplasticity.utils.io import read_parquet_metadata
from vitplasticity.utils.optional import require_transformers

transformers = require_transformers()

VOCAB = 64  # the tiny configs' vocab_size: byte ids mod 64
LENGTH = 12  # tokens per sequence (the tiny configs have 16 positions)

REFERENCE_TEXT = "".join(
    f"Reference {i}: the quick brown fox jumps over the lazy dog, {i * 7} times.\n"
    for i in range(30)
)
USER_TEXTS = {
    "notes.txt": "".join(f"note {i}: cats, dogs & birds sing {i * 3}\n\n" for i in range(9)),
    "mail.txt": "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9 {0}!\n" * 4,
}

# Each component's parameters, written out from transformers' names (docs/protocol.md 3.1).
GPT2_PATTERNS = {  # in GPT2LMHeadModel, the causal LM ranked
    "ln1": r"transformer\.h\.\d+\.ln_1\.",
    "mha": r"transformer\.h\.\d+\.attn\.",
    "ln2": r"transformer\.h\.\d+\.ln_2\.",
    "fc1": r"transformer\.h\.\d+\.mlp\.c_fc\.",
    "fc2": r"transformer\.h\.\d+\.mlp\.c_proj\.",
}
LLAMA_PATTERNS = {
    "ln1": r"model\.layers\.\d+\.input_layernorm\.",
    "mha": r"model\.layers\.\d+\.self_attn\.",
    "ln2": r"model\.layers\.\d+\.post_attention_layernorm\.",
    "fc1": r"model\.layers\.\d+\.mlp\.(gate_proj|up_proj)\.",
    "fc2": r"model\.layers\.\d+\.mlp\.down_proj\.",
}
MIXTRAL_PATTERNS = {  # its experts fused in two 3-D parameters per layer
    **LLAMA_PATTERNS,
    "fc1": r"model\.layers\.\d+\.mlp\.experts\.gate_up_proj$",
    "fc2": r"model\.layers\.\d+\.mlp\.experts\.down_proj$",
}


def _entry(model_type: str, config: dict, **keys) -> dict:
    """A models: entry of a random-init transformers model (family: transformers)."""
    return {
        "family": "transformers",
        "hf_id": f"tiny-{model_type}",
        "weights": "random",
        "config": {"model_type": model_type, **config},
        **keys,
    }


GPT2_ENTRY = _entry("gpt2", GPT2_TINY_CONFIG)
LLAMA_ENTRY = _entry("llama", HF_TEXT_TINY_CONFIG, model_class="LlamaForCausalLM")


def _tiny(case_id: str) -> torch.nn.Module:
    return next(t for t in TINY_MODELS if t.id == case_id).build()


def _tied_llama() -> torch.nn.Module:
    """A bare LlamaModel whose config ties the LM head to the token embedding."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**HF_TEXT_TINY_CONFIG, tie_word_embeddings=True)
    return transformers.LlamaModel(config)


def _mixtral() -> torch.nn.Module:
    """A MixtralForCausalLM: 4 experts, 2 per token, the eager experts loop."""
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        **HF_TEXT_TINY_CONFIG,
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_implementation="eager",
    )
    return transformers.MixtralForCausalLM(config)


MODELS = {
    # id: (build, parameter patterns, the prefix of the ranked module's names in the causal LM:
    # none, every family ranks the causal LM itself)
    "gpt2": (lambda: _tiny("gpt2_tiny"), GPT2_PATTERNS, ""),
    "llama_causal_lm": (lambda: _tiny("llama_causal_lm_tiny"), LLAMA_PATTERNS, ""),
    "llama_tied_bare": (_tied_llama, LLAMA_PATTERNS, ""),
    "mixtral": (_mixtral, MIXTRAL_PATTERNS, ""),
}


def _write_texts(root: Path) -> tuple[Path, list[Path]]:
    root.mkdir(parents=True, exist_ok=True)
    reference = root / "reference.txt"
    reference.write_text(REFERENCE_TEXT, encoding="utf-8")
    users = []
    for name, text in USER_TEXTS.items():
        users.append(root / name)
        users[-1].write_text(text, encoding="utf-8")
    return reference, users


def _settings(
    reference: Path, users: list[Path], **changes
) -> tuple[TextRecommendInputs, RecommendTextSettings]:
    """The inputs and settings of a small recommendation on the texts; ``changes`` to either,
    by field name."""
    values = {
        "model": "tiny",
        "dataset": "notes",
        "model_spec": {"family": "transformers", "hf_id": "tiny", "weights": "random"},
        "reference": str(reference),
        "texts": tuple(str(u) for u in users),
        "tokenizer": "bytes",
        "sequence_length": LENGTH,
        "n_pairs": 10,
        "batch_size": 4,
        "batches": 3,
        "device": "cpu",
        **changes,
    }
    inputs = {field.name for field in dataclasses.fields(TextRecommendInputs)}
    return (
        TextRecommendInputs(**{k: v for k, v in values.items() if k in inputs}),
        RecommendTextSettings(**{k: v for k, v in values.items() if k not in inputs}),
    )


def _ids(text: str) -> np.ndarray:
    """Independent byte tokenization: the non-empty lines, each + newline, bytes mod vocab."""
    kept = "".join(line + "\n" for line in text.split("\n") if line.strip())
    return np.frombuffer(kept.encode("utf-8"), dtype=np.uint8).astype(np.int64) % VOCAB


def _expected_user_sequences(limit: int) -> np.ndarray:
    """Each file cut into LENGTH-token sequences (at most ``limit``), then taken in turn."""
    per_file = []
    for text in USER_TEXTS.values():
        ids = _ids(text)
        n = min(len(ids) // LENGTH, limit)
        per_file.append(ids[: n * LENGTH].reshape(n, LENGTH))
    taken = [s[i] for i in range(max(map(len, per_file))) for s in per_file if i < len(s)]
    return np.stack(taken[:limit])


def _component_of(name: str, patterns: dict[str, str]) -> str | None:
    found = [c for c, pattern in patterns.items() if re.match(pattern, name)]
    assert len(found) <= 1, name
    return found[0] if found else None


def _direct_lm(case: str, model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM built here from transformers' own classes: the model as given when it is
    one; else its XForCausalLM with the bare model's weights loaded and the head tied."""
    if model.get_output_embeddings() is not None:
        return copy.deepcopy(model)
    lm_class = {
        "gpt2": transformers.GPT2LMHeadModel,
        "llama_tied_bare": transformers.LlamaForCausalLM,
    }
    lm = lm_class[case](model.config).to(torch.float64)
    base = getattr(lm, lm.base_model_prefix)
    base.load_state_dict(model.state_dict())
    assert lm.get_output_embeddings().weight is base.get_input_embeddings().weight
    return lm.eval()


# ---------------------------------------------------------------------------------------------
# The table


@pytest.mark.parametrize("case", sorted(MODELS))
def test_the_table_has_every_criterion_per_configuration(tmp_path: Path, case: str) -> None:
    build, _, _ = MODELS[case]
    reference, users = _write_texts(tmp_path)
    result = recommend_text(*_settings(reference, users), model=build())
    table = result.table
    assert table.height == len(DEFAULT_CONFIGURATIONS) * len(CRITERIA)
    for configuration in DEFAULT_CONFIGURATIONS:
        rows = table.filter(pl.col("configuration") == configuration)
        assert sorted(rows["criterion"]) == sorted(CRITERIA)
    for criterion in CRITERIA:
        ranks = table.filter(pl.col("criterion") == criterion)["rank"].sort().to_list()
        assert ranks == list(range(1, len(DEFAULT_CONFIGURATIONS) + 1))
    values = {(r["configuration"], r["criterion"]): r["value"] for r in table.iter_rows(named=True)}
    for configuration in DEFAULT_CONFIGURATIONS:
        for criterion in ("plasticity", "relative_gradient_norm", "gradient_snr"):
            assert np.isfinite(values[(configuration, criterion)]), (configuration, criterion)
    # The weight statistic: defined for every component of GPT2 (LayerNorms, per-head V and O
    # of its packed c_attn, the FCs); n/a, with the reason in the report, for RMSNorm and for
    # attention without per-head V and O (Llama's grouped-query attention).
    undefined = set() if case == "gpt2" else {"ln1", "mha", "ln2"}
    for component in COMPONENTS:
        assert np.isnan(values[(component, "weight_spectral")]) == (component in undefined)
    notes = [n for n in result.notes if n.startswith("Weight spectral is n/a")]
    if case == "gpt2":
        assert not notes
    else:
        assert "weight statistic refused (NaN) for" in notes[0]
        assert "RMSNorm is not a LayerNorm" in notes[0]
    assert any("No head warm-up: the LM head is pretrained" in n for n in result.notes)


# ---------------------------------------------------------------------------------------------
# Gradient criteria: next-token cross-entropy, by autograd here


@pytest.mark.parametrize("case", sorted(MODELS))
def test_gradient_criteria_equal_a_direct_next_token_computation(tmp_path: Path, case: str) -> None:
    build, patterns, prefix = MODELS[case]
    model = perturbed(build())
    reference, users = _write_texts(tmp_path)
    inputs, settings = _settings(reference, users, dtype="float64", seed=3)
    direct = _direct_lm(case, model)
    result = recommend_text(inputs, settings, model=model)

    sequences = _expected_user_sequences(max(settings.n_pairs, 3 * 4))
    named = dict(direct.named_parameters())
    names = [
        n.removeprefix(prefix)
        for n in named
        if n.startswith(prefix) and _component_of(n.removeprefix(prefix), patterns)
    ]
    gradients: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for step in range(settings.batches):
        ids = torch.from_numpy(sequences[batch_indices(step, 4, len(sequences), 3)])
        logits = direct(input_ids=ids).logits  # (B, L, V)
        log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
        targets = ids[:, 1:]
        loss = -log_probs.gather(-1, targets[..., None]).mean()
        grads = torch.autograd.grad(loss, [named[prefix + n] for n in names])
        for name, grad in zip(names, grads, strict=True):
            gradients[name].append(grad.numpy().ravel())

    rows = {row["parameter"]: row for row in result.measurements.tensors.iter_rows(named=True)}
    assert set(rows) == set(names)
    rgn, snr = {}, {}
    for name in names:
        g = np.stack(gradients[name])  # (B, numel)
        w = named[prefix + name].detach().numpy().ravel()
        rgn[name] = np.mean(np.linalg.norm(g, axis=1)) / np.linalg.norm(w)
        mean = g.mean(axis=0)
        snr[name] = np.linalg.norm(mean) / np.sqrt(np.mean(np.sum((g - mean) ** 2, axis=1)))
        assert rows[name]["component"] == _component_of(name, patterns)
        assert rows[name]["relative_gradient_norm"] == pytest.approx(rgn[name], rel=1e-10)
        assert rows[name]["gradient_snr"] == pytest.approx(snr[name], rel=1e-10)
    # Pooled per configuration: the unweighted mean over the configuration's tensors.
    table = result.table
    for configuration in DEFAULT_CONFIGURATIONS:
        parts = configuration.split("+")
        members = [n for n in names if _component_of(n, patterns) in parts]
        for criterion, direct_values in (("relative_gradient_norm", rgn), ("gradient_snr", snr)):
            value = table.filter(
                (pl.col("configuration") == configuration) & (pl.col("criterion") == criterion)
            )["value"].item()
            expected = np.mean([direct_values[n] for n in members])
            assert value == pytest.approx(expected, rel=1e-10)


def test_recommend_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    """No head warm-up, no optimizer: every weight and requires_grad flag is as before."""
    model = _tiny("llama_causal_lm_tiny")
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith("lm_head"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reference, users = _write_texts(tmp_path)
    recommend_text(*_settings(reference, users), model=model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {"lm_head.weight"}
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------------------------------
# Plasticity


def test_plasticity_equals_the_text_plasticity_stage(tmp_path: Path) -> None:
    """GPT2 from a text model entry: the pairs are the text plasticity stage's, number for number."""
    reference, users = _write_texts(tmp_path)
    mail = users[1]
    # Fewer user sequences than pairs: both cycle them.
    assert len(read_sequences(mail, byte_tokenizer(VOCAB), LENGTH)) < 12
    spec = {**GPT2_ENTRY, "init_seed": 4}
    result = recommend_text(
        *_settings(reference, [mail], model_spec=spec, n_pairs=12, batch_size=5)
    )
    stage = measure_text(
        "tiny",
        spec,
        reference,
        mail,
        TextPlasticitySettings(
            tokenizer="bytes", sequence_length=LENGTH, n_pairs=12, batch_size=5, device="cpu"
        ),
    )
    assert_frame_equal(result.measurements.pairs, stage.pairs)


@pytest.mark.parametrize("case", ["llama_causal_lm", "llama_tied_bare"])
def test_llama_plasticity_equals_numpy_in_the_embedding_protocol(tmp_path: Path, case: str) -> None:
    """LN1 and FC1 (gate and up together) of every layer fed the embedding output, written out
    here: ||f(e(x)) - f(e(y))|| / ||e(x) - e(y)|| for reference sequence i and user sequence i.
    transformers computes RMSNorm in float32 whatever the model's dtype: LN1 agrees to 1e-6."""
    build, _, _ = MODELS[case]
    model = perturbed(build())
    reference, users = _write_texts(tmp_path)
    result = recommend_text(*_settings(reference, users, dtype="float64"), model=model)
    decoder = model.model if hasattr(model, "model") else model
    ref_ids = _ids(REFERENCE_TEXT)[: 10 * LENGTH].reshape(10, LENGTH)
    user = _expected_user_sequences(12)
    user_ids = user[np.arange(10) % len(user)]
    with torch.no_grad():
        x = decoder.embed_tokens(torch.from_numpy(ref_ids)).numpy()
        y = decoder.embed_tokens(torch.from_numpy(user_ids)).numpy()
        for index, layer in enumerate(decoder.layers):
            weight = layer.input_layernorm.weight.numpy()
            eps = layer.input_layernorm.variance_epsilon

            def rms(t: np.ndarray, weight: np.ndarray = weight, eps: float = eps) -> np.ndarray:
                return weight * t / np.sqrt(np.mean(t**2, axis=-1, keepdims=True) + eps)

            stacked = np.concatenate(
                [layer.mlp.gate_proj.weight.numpy(), layer.mlp.up_proj.weight.numpy()]
            )
            for component, f, rtol in (
                ("ln1", rms, 1e-6),
                ("fc1", lambda t, w=stacked: t @ w.T, 1e-10),
            ):
                expected = np.linalg.norm(f(x) - f(y), axis=(1, 2)) / np.linalg.norm(
                    x - y, axis=(1, 2)
                )
                measured = (
                    result.measurements.pairs.filter(
                        (pl.col("block") == index) & (pl.col("component") == component)
                    )
                    .sort("pair")["ratio"]
                    .to_numpy()
                )
                np.testing.assert_allclose(measured, expected, rtol=rtol)


# ---------------------------------------------------------------------------------------------
# The text, the causal LM


def test_user_sequences_take_each_file_in_turn(tmp_path: Path) -> None:
    _, users = _write_texts(tmp_path)
    got = user_sequences(users, byte_tokenizer(VOCAB), LENGTH, 100)
    np.testing.assert_array_equal(got, _expected_user_sequences(100))
    first = _ids(USER_TEXTS["notes.txt"])[:LENGTH]
    second = _ids(USER_TEXTS["mail.txt"])[:LENGTH]
    np.testing.assert_array_equal(got[:2], np.stack([first, second]))
    assert len(user_sequences(users, byte_tokenizer(VOCAB), LENGTH, 5)) == 5


def test_a_bare_model_is_wrapped_in_its_causal_lm_around_the_same_modules() -> None:
    model = perturbed(_tiny("gpt2_tiny"))
    lm = causal_lm(model)
    assert type(lm).__name__ == "GPT2LMHeadModel" and lm.transformer is model
    assert lm.lm_head.weight is model.wte.weight
    ids = torch.randint(0, VOCAB, (2, LENGTH), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model(ids).last_hidden_state.numpy()
        logits = lm(input_ids=ids).logits.numpy()
    np.testing.assert_allclose(logits, hidden @ model.wte.weight.detach().numpy().T, rtol=1e-12)
    causal = _tiny("llama_causal_lm_tiny")
    assert causal_lm(causal) is causal


# ---------------------------------------------------------------------------------------------
# The outputs and the command


def _cli(
    tmp_path: Path, reference: Path, users: list[Path], *extra: str, spec: dict = GPT2_ENTRY
) -> list[str]:
    return [
        "recommend",
        "--model",
        "gpt2_tiny",
        "--model-spec",
        json.dumps(spec),
        "--reference",
        str(reference),
        "--text",
        *map(str, users),
        "--sequence-length",
        str(LENGTH),
        "--n-pairs",
        "8",
        "--batch-size",
        "4",
        "--batches",
        "2",
        "--device",
        "cpu",
        "--out-prefix",
        str(tmp_path / "out" / "gpt2_tiny" / "notes"),
        *extra,
    ]


def test_the_command_writes_the_report_table_and_export(tmp_path: Path) -> None:
    reference, users = _write_texts(tmp_path / "text")
    argv = _cli(tmp_path, reference, users, "--configurations", "mha+fc1", "ln1", "fc2")
    argv += ["--criterion", "relative_gradient_norm", "--demo"]
    assert main(argv) == 0
    prefix = tmp_path / "out" / "gpt2_tiny" / "notes"
    assert sorted(p.name for p in prefix.parent.iterdir()) == [  # the image recommend's files
        "notes.json",
        "notes.md",
        "notes.parquet",
        "notes.pdf",
        "notes.png",
    ]
    table = pl.read_parquet(f"{prefix}.parquet")
    meta = read_parquet_metadata(f"{prefix}.parquet")
    chosen = meta["recommendation"]["configuration"]
    best = table.filter(pl.col("criterion") == "relative_gradient_norm").sort("rank")
    assert chosen == best["configuration"][0]
    assert meta["demo"] is True and meta["dataset"] == "notes"
    assert meta["provenance"]["settings"]["loss"] == "next-token cross-entropy"

    export = json.loads(Path(f"{prefix}.json").read_text())
    assert export["configuration"] == chosen
    # The names are the causal LM's, GPT2LMHeadModel's (its lm_head tied to wte).
    lm = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2_TINY_CONFIG))
    for component in chosen.split("+"):
        expected = [n for n, _ in lm.named_parameters() if re.match(GPT2_PATTERNS[component], n)]
        assert export["parameters"]["components"][component] == expected
    assert export["parameters"]["always_trained"] == [
        "transformer.ln_f.weight",
        "transformer.ln_f.bias",
    ]
    assert export["text"]["prefix"] == ""
    assert export["model"]["class"].endswith("GPT2LMHeadModel")

    text = Path(f"{prefix}.md").read_text()
    assert "# Which components should I finetune? gpt2_tiny on notes" in text
    assert "`notes.txt`, `mail.txt`" in text and "next-token cross-entropy" in text
    assert "they sit under" not in text


def test_the_export_of_a_llama_names_its_parameters_and_lora_targets(tmp_path: Path) -> None:
    reference, users = _write_texts(tmp_path)
    model = _tiny("llama_causal_lm_tiny")
    result = recommend_text(*_settings(reference, users, configurations=("mha+fc1",)), model=model)
    write_outputs(result, tmp_path / "llama")
    export = json.loads((tmp_path / "llama.json").read_text())
    assert export["configuration"] == "mha+fc1"
    names = [n for n, _ in model.named_parameters()]
    for component in ("mha", "fc1"):
        expected = [n for n in names if re.match(LLAMA_PATTERNS[component], n)]
        assert export["parameters"]["components"][component] == expected
    assert export["parameters"]["always_trained"] == ["model.norm.weight", "lm_head.weight"]
    assert sorted(export["peft"]["lora"]["config"]["target_modules"]) == sorted(
        f"model.layers.{i}.{module}"
        for i in range(2)
        for module in (
            *(f"self_attn.{p}_proj" for p in "qkvo"),
            "mlp.gate_proj",
            "mlp.up_proj",
        )
    )
    assert export["text"]["prefix"] == "" and export["model"]["class"].endswith("LlamaForCausalLM")


# ---------------------------------------------------------------------------------------------
# Refusals


def test_an_image_model_is_refused_by_name(tmp_path: Path) -> None:
    reference, users = _write_texts(tmp_path)
    vit = _tiny("vit_tiny_patch16_224")
    with pytest.raises(UnsupportedModel, match=r"VisionTransformer \(timm .*\) takes images"):
        recommend_text(*_settings(reference, users), model=vit)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"family": "timm", "timm_id": "vit_tiny_patch16_224", "weights": "random"},
            "model 'vit' is a timm model (family: timm), an image model",
        ),
        (
            _entry(
                "dinov2",
                {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2},
                model_class="Dinov2Model",
            ),
            "Dinov2Model (transformers Dinov2Model) takes images",
        ),
    ],
)
def test_the_command_refuses_an_image_model_entry_by_name(
    tmp_path: Path, spec: dict, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    reference, users = _write_texts(tmp_path / "text")
    argv = _cli(tmp_path, reference, users, spec=spec)
    argv[argv.index("--model") + 1] = "vit"
    with caplog.at_level(logging.ERROR):
        assert main(argv) == 2
    assert message in caplog.text
    assert not (tmp_path / "out").exists()


def test_the_image_recommend_refuses_a_text_model_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The other way round: ``recommend`` (images) builds a text entry with a classification
    head, which models.hf_build refuses by class before any compute."""
    from tests.helpers.images import image_folder

    folder = image_folder(tmp_path / "pets", per_class=3)
    argv = ["recommend", "--model", "gpt2", "--model-spec", json.dumps(GPT2_ENTRY)]
    argv += ["--image-folder", str(folder), "--reference-fallback", "pool", "--n-pairs", "4"]
    argv += ["--device", "cpu", "--out-prefix", str(tmp_path / "out" / "x")]
    with caplog.at_level(logging.ERROR):
        assert main(argv) == 2
    assert "GPT2Model has no classification class here" in caplog.text
    assert not (tmp_path / "out").exists()


def test_a_bare_model_with_an_untied_head_is_refused_by_name(tmp_path: Path) -> None:
    reference, users = _write_texts(tmp_path)
    with pytest.raises(
        UnsupportedModel,
        match=r"LlamaModel has no LM head .*tie_word_embeddings.*model_class: LlamaForCausalLM",
    ):
        recommend_text(*_settings(reference, users), model=_tiny("llama_tiny"))


def test_the_text_families_no_longer_refuse_recommend() -> None:
    for case_id in ("gpt2_tiny", "llama_tiny", "gemma2_tiny", "mixtral_tiny", "qwen2_moe_tiny"):
        model = _tiny(case_id)
        assert architecture_for(model).refusal("recommend", model) is None


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"short": True}, ValueError, r"short\.txt: 4 tokens, fewer than one sequence of 12"),
        ({"n_pairs": 500}, ValueError, r"--reference .*reference\.txt: \d+ sequences of 12 "),
        ({"sequence_length": 32}, ValueError, "--sequence-length 32 exceeds the 16 positions"),
        (
            {"sequence_length": 1},
            ValueError,
            r"--sequence-length \(datasets\.notes\.sequence_length\): must be >= 2",
        ),
        ({"batches": 1}, ValueError, r"--batches \(recommend\.batches\): must be >= 2"),
        ({"texts": ("missing.txt",)}, FileNotFoundError, "--text: text file not found"),
        ({"configurations": ("full",)}, ValueError, "cannot be ranked"),
        ({"combine": True}, ValueError, "--combine needs --budget"),
    ],
)
def test_bad_input_is_refused_by_name(
    tmp_path: Path, change: dict, error: type, message: str
) -> None:
    reference, users = _write_texts(tmp_path)
    if change.pop("short", False):
        short = tmp_path / "short.txt"
        short.write_text("abc\n\n", encoding="utf-8")
        change["texts"] = (str(users[0]), str(short))
    with pytest.raises(error, match=message):
        recommend_text(*_settings(reference, users, **change), model=_tiny("gpt2_tiny"))


def test_the_command_refuses_before_writing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    reference, _ = _write_texts(tmp_path / "text")
    short = tmp_path / "text" / "short.txt"
    short.write_text("abc\n", encoding="utf-8")
    with caplog.at_level(logging.ERROR):
        assert main(_cli(tmp_path, reference, [short])) == 2
    assert "short.txt: 4 tokens, fewer than one sequence of 12" in caplog.text
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------
# The workflow


def _snakemake(tmp_path: Path, override: dict, *args: str) -> subprocess.CompletedProcess:
    configfile = tmp_path / "text.yaml"
    configfile.write_text(yaml.safe_dump(override))
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [
            str(bindir / "snakemake"),
            *args,
            "--directory",
            str(tmp_path),
            "--snakefile",
            str(REPO / "workflow/Snakefile"),
            "--configfile",
            str(REPO / "config/config.yaml"),
            str(REPO / "config/demo.yaml"),
            str(configfile),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _text_override(tmp_path: Path, enabled: bool) -> dict:
    reference, users = _write_texts(tmp_path / "text")
    return {
        "models": {"tiny_gpt2": GPT2_ENTRY, "tiny_llama": LLAMA_ENTRY},
        "datasets": {
            name: text_dataset(path, sequence_length=LENGTH)
            for name, path in {"wiki": reference, "notes": users[0], "mail": users[1]}.items()
        },
        "text_plasticity": {
            "enabled": True,
            "run_models": ["tiny_gpt2", "tiny_llama"],
            "reference": "wiki",
            "datasets": ["notes", "mail"],
            "n_pairs": 6,
            "batch_size": 4,
        },
        "recommend": {"enabled": enabled, "batch_size": 4, "batches": 2, "budget": "40K"},
    }


@pytest.mark.slow
def test_the_workflow_runs_recommend_text_per_text_model_and_dataset(tmp_path: Path) -> None:
    """models: entries (a GPT2, a Llama causal LM) -> text plasticity -> recommend, through
    Snakemake: planned per text model and dataset, then a Llama job run for real."""
    override = _text_override(tmp_path, enabled=True)
    result = _snakemake(tmp_path, override, "-n", "-p", "all")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    table = output[output.index("Job stats:") :].split("\n\n")[0]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}
    assert counts["recommend_text"] == 4 and counts["text_plasticity"] == 4
    for model in ("tiny_gpt2", "tiny_llama"):
        for dataset in ("notes", "mail"):
            assert f"results/demo/recommend_text/{model}/{dataset}.json" in output
    # Each setting reaches the command line: recommend's, and text_plasticity's for the text.
    assert "--tokenizer auto --sequence-length 12 --n-pairs 6 --batch-size 4" in output
    assert "--batches 2 --budget 40K --criterion plasticity" in output
    assert "HF_HUB_OFFLINE=1 vitplasticity recommend --model tiny_llama" in output

    # Not enabled: no text recommend in `all`.
    result = _snakemake(tmp_path, _text_override(tmp_path, enabled=False), "-n", "all")
    assert result.returncode == 0 and "recommend_text" not in result.stdout + result.stderr

    # The Llama's text plasticity and recommend run for real.
    plasticity = "results/demo/plasticity_text/tiny_llama/mail_summary.parquet"
    target = "results/demo/recommend_text/tiny_llama/mail.json"
    result = _snakemake(tmp_path, override, "--cores", "1", plasticity, target)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    export = json.loads((tmp_path / target).read_text())
    assert export["dataset"] == "mail" and export["model"]["entry"]["hf_id"] == "tiny-llama"
    assert export["model"]["class"].endswith("LlamaForCausalLM") and export["text"]["prefix"] == ""
    meta = read_parquet_metadata(tmp_path / target.replace(".json", ".parquet"))
    assert meta["demo"] is True and meta["recommendation"]["budget"] == 40_000
    # The recommendation's plasticity pairs are the text plasticity stage's.
    summary = pl.read_parquet(tmp_path / plasticity)
    assert summary["n_pairs"].unique().to_list() == [6]
    table = pl.read_parquet(tmp_path / target.replace(".json", ".parquet"))
    ln1 = table.filter((pl.col("configuration") == "ln1") & (pl.col("criterion") == "plasticity"))
    pairs = pl.read_parquet(tmp_path / plasticity.replace("_summary", ""))
    expected = pairs.filter(pl.col("component") == "ln1")["ratio"].mean()
    assert ln1["value"].item() == pytest.approx(expected, rel=1e-12)
