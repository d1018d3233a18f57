"""``vitplasticity recommend --labelled-text``: a text model of any kind (an encoder, a
decoder) ranked as a sequence classifier with a new head, on labelled text.

On tiny bare models saved as checkpoint folders (BERT, GPT2, Llama) with the byte tokenizer:
every criterion is valued, or n/a with the reason the report gives (table-driven); the
gradient criteria equal classification cross-entropy gradients taken here by autograd
(float64); the encoder refused on unlabelled text is ranked on labelled text; the command's
refusals name the flag. The real all-MiniLM-L6-v2 is ranked and verified on labelled text
through the workflow: tests/pipeline/test_recommend_labelled_workflow.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.labelled_text import write_first_byte_csv
from tests.helpers.tiny_models import ENCODER_TINY_CONFIG, HF_TEXT_TINY_CONFIG
from vitplasticity import cli
from vitplasticity.data.labelled import encode_texts, read_labelled
from vitplasticity.data.loader import batch_indices
from vitplasticity.models.architectures import UnsupportedModel
from vitplasticity.models.build import build_model
from vitplasticity.models.text import sequence_classifier, text_model_spec
from vitplasticity.recommend.ranking import CRITERIA
from vitplasticity.recommend.settings import RecommendTextSettings
from vitplasticity.recommend.text import recommend_text
from vitplasticity.recommend.text_inputs import TextRecommendInputs

transformers = pytest.importorskip("transformers", reason="the text models are transformers'")

LENGTH = 12
BARE = {
    "bert": ("BertConfig", "BertModel", ENCODER_TINY_CONFIG),
    "gpt2": ("GPT2Config", "GPT2Model", {"n_embd": 48, "n_layer": 2, "n_head": 3, "vocab_size": 64, "n_positions": 16}),
    "llama": ("LlamaConfig", "LlamaModel", HF_TEXT_TINY_CONFIG),
    "mixtral": ("MixtralConfig", "MixtralModel", {**HF_TEXT_TINY_CONFIG, "num_local_experts": 4, "num_experts_per_tok": 2, "experts_implementation": "eager"}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeModel", {**HF_TEXT_TINY_CONFIG, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24, "experts_implementation": "eager"}),
    # DeBERTa-v3's settings: its query and key projections see the relative positions too,
    # so NFN (one call per linear map) is n/a, and the report says why
    "deberta_v2": ("DebertaV2Config", "DebertaV2Model", {**ENCODER_TINY_CONFIG, "relative_attention": True, "pos_att_type": ["p2c", "c2p"], "share_att_key": True, "position_buckets": 8}),
}  # fmt: skip
REASONS = {
    "weight_spectral": "Weight spectral",
    "spectrum_snr": "Spectrum SNR",
    "kappa": "kappa",
    "nfn": "NFN",
}
"""How the report names a criterion that can be n/a beyond the norms (the others never are)."""
LINEAR_ONLY = ("nfn", "spectrum_snr", "kappa")
"""The criteria of a linear map's output or weight matrix: n/a for LN1, LN2 and LN1+LN2."""


def _folder(tmp_path: Path, case: str) -> Path:
    config_class, model_class, config = BARE[case]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    folder = tmp_path / case
    model.save_pretrained(folder)
    return folder


def _data(tmp_path: Path) -> tuple[Path, Path]:
    """(a labelled CSV of two classes, a reference text)."""
    labelled = write_first_byte_csv(tmp_path / "labelled.csv", rows=40)
    reference = tmp_path / "reference.txt"
    reference.write_text("".join(f"reference line {i} of plain words\n" for i in range(40)))
    return labelled, reference


def _inputs(
    folder: Path, labelled: Path, reference: Path, **changes
) -> tuple[TextRecommendInputs, RecommendTextSettings]:
    inputs = TextRecommendInputs(
        model=folder.name, dataset="labelled",
        model_spec={"family": "transformers", "hf_id": folder.name, "weights": str(folder)},
        reference=str(reference), texts=(), labelled_text=str(labelled),
        warmup_steps=changes.pop("warmup_steps", 3), warmup_lr=0.01, dtype=changes.pop("dtype", "float32"),
    )  # fmt: skip
    settings = RecommendTextSettings(
        tokenizer="bytes", sequence_length=LENGTH, n_pairs=8, batch_size=4, batches=3,
        device="cpu", seed=changes.pop("seed", 0),
    )  # fmt: skip
    assert not changes
    return inputs, settings


@pytest.mark.parametrize("case", sorted(BARE))
def test_every_criterion_is_valued_or_na_with_the_reason_the_report_gives(
    tmp_path: Path, case: str
) -> None:
    labelled, reference = _data(tmp_path)
    result = recommend_text(*_inputs(_folder(tmp_path, case), labelled, reference))
    from vitplasticity.recommend.pipeline import write_outputs

    write_outputs(result, tmp_path / "out" / "r")
    report = (tmp_path / "out" / "r.md").read_text()
    table = result.table
    assert set(table["criterion"]) == set(CRITERIA)
    for row in table.iter_rows(named=True):
        norms_only = set(row["configuration"].split("+")) <= {"ln1", "ln2"}
        if row["criterion"] in LINEAR_ONLY and norms_only:
            assert math.isnan(row["value"]), row
        elif math.isnan(row["value"]):  # n/a for another reason: the report says which
            assert f"{REASONS[row['criterion']]} is n/a for" in report, row
        else:
            assert math.isfinite(row["value"]), row
    assert "LN1 and LN2 hold no linear map, so they have no NFN, Spectrum SNR or kappa" in report
    assert "classification cross-entropy" in report and "warmed up alone for 3 SGD steps" in report
    assert type(result.recommendation.configuration) is str
    export = json.loads((tmp_path / "out" / "r.json").read_text())
    assert export["text"]["sequence_classifier"].endswith("ForSequenceClassification")


@pytest.mark.parametrize("case", ["bert", "llama"])
def test_gradient_criteria_equal_a_direct_classification_computation(
    tmp_path: Path, case: str
) -> None:
    """Without a warm-up: the gradients of the mean cross-entropy of the classifier's logits,
    batch by batch (step s: batch_indices(s)), RGN and SNR by their formulas."""
    labelled, reference = _data(tmp_path)
    folder = _folder(tmp_path, case)
    inputs, settings = _inputs(folder, labelled, reference, warmup_steps=0, dtype="float64", seed=5)
    result = recommend_text(inputs, settings)

    torch.manual_seed(5)
    bare = build_model(text_model_spec(case, inputs.model_spec))
    dataset = read_labelled(labelled)
    encoded, pad = encode_texts(dataset.pool.texts, "bytes", bare.config.vocab_size, LENGTH)
    direct, _ = sequence_classifier(bare, 2, pad)
    direct = direct.double().eval()
    rows = {row["parameter"]: row for row in result.measurements.tensors.iter_rows(named=True)}
    named = dict(direct.named_parameters())
    gradients: dict[str, list[np.ndarray]] = {name: [] for name in rows}
    for step in range(settings.batches):
        index = batch_indices(step, 4, len(dataset.pool), 5)
        ids, attention = (
            torch.from_numpy(encoded.ids[index]),
            torch.from_numpy(encoded.attention[index]),
        )
        logits = direct(input_ids=ids, attention_mask=attention).logits
        loss = (
            -torch.log_softmax(logits, -1)
            .gather(-1, torch.from_numpy(dataset.pool.labels[index])[:, None])
            .mean()
        )
        for name, grad in zip(
            rows, torch.autograd.grad(loss, [named[n] for n in rows]), strict=True
        ):
            gradients[name].append(grad.numpy().ravel())
    for name, row in rows.items():
        g, w = np.stack(gradients[name]), named[name].detach().numpy().ravel()
        mean = g.mean(axis=0)
        if not np.linalg.norm(w):  # a zero-initialised bias: its ratio is undefined, n/a
            assert math.isnan(row["relative_gradient_norm"])
            continue
        assert row["relative_gradient_norm"] == pytest.approx(
            np.mean(np.linalg.norm(g, axis=1)) / np.linalg.norm(w), rel=1e-9
        )
        assert row["gradient_snr"] == pytest.approx(
            np.linalg.norm(mean) / np.sqrt(np.mean(np.sum((g - mean) ** 2, axis=1))), rel=1e-9
        )


def test_an_encoder_refused_on_unlabelled_text_is_ranked_on_labelled_text(tmp_path: Path) -> None:
    labelled, reference = _data(tmp_path)
    folder = _folder(tmp_path, "bert")
    inputs, settings = _inputs(folder, labelled, reference)
    import dataclasses

    unlabelled = dataclasses.replace(inputs, labelled_text=None, texts=(str(reference),))
    with pytest.raises(
        UnsupportedModel,
        match=r"no next-token loss; rank it on labelled text \(recommend --labelled-text\)",
    ):
        recommend_text(unlabelled, settings)
    assert recommend_text(inputs, settings).table.height > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--warmup-steps", "5"], "recommend: --warmup-steps goes with an image dataset or --labelled-text"),
        (["--labelled-text", "x.csv"], "recommend: give --text or --labelled-text, not both"),
    ],
)  # fmt: skip
def test_the_command_refuses_a_warm_up_without_a_new_head_and_two_kinds_of_text(
    tmp_path: Path, extra: list[str], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, reference = _data(tmp_path)
    argv = ["recommend", "--model", "m", "--model-spec", "{}", "--reference", str(reference),
            "--text", str(reference), "--out-prefix", str(tmp_path / "o" / "r"), *extra]  # fmt: skip
    assert cli.main(argv) == 2
    assert message in caplog.text
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("case", "baselines"), [("bert", ["head"]), ("qwen2_moe", ["lora"])])
def test_a_text_classifier_ranking_is_verified_by_finetuning_on_the_labelled_text(
    tmp_path: Path, case: str, baselines: list[str]
) -> None:
    """recommend --labelled-text, then recommend-verify --labelled-text: the halving trains the
    candidates as sequence classifiers (runs of the labelled text) and the verified export
    names the classifier's parameters; an encoder, and a mixture of experts with a shared
    expert (its LoRA baseline adapts the attention, as any decoder's)."""
    labelled, reference = _data(tmp_path)
    folder = _folder(tmp_path, case)
    spec = json.dumps({"family": "transformers", "hf_id": case, "weights": str(folder)})
    prefix = tmp_path / "out" / case
    cut = ["--tokenizer", "bytes", "--sequence-length", str(LENGTH), "--device", "cpu"]
    assert cli.main(["recommend", "--model", case, "--model-spec", spec, "--labelled-text",
                     str(labelled), "--reference", str(reference), "--n-pairs", "8",
                     "--batch-size", "4", "--batches", "2", "--warmup-steps", "2",
                     "--out-prefix", str(prefix), *cut]) == 0  # fmt: skip
    argv = ["recommend-verify", "--ranking", f"{prefix}.parquet", "--model", case,
            "--dataset", "labelled", "--labelled-text", str(labelled), "--model-spec", spec,
            "--lrs", "0.001", "0.003", "--steps", "8", "--val-every", "2", "--batch-size", "8",
            "--micro-batch-size", "8", "--top-k", "1", "--baselines", *baselines,
            "--optimizer", "adamw", "--warmup-steps", "1", "--runs-dir", str(tmp_path / "runs"),
            "--out-prefix", str(prefix), *cut]  # fmt: skip
    assert cli.main(argv) == 0
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("summary.json")]
    assert summaries and all(
        "sequences_per_second" in s and "test_accuracy" in s for s in summaries
    )
    assert {s["configuration"] for s in summaries} >= set(baselines)
    report = Path(f"{prefix}_verified.md").read_text()
    assert "## Recommendation (measured)" in report
    export = json.loads(Path(f"{prefix}_verified.json").read_text())
    assert export["verification"]["verified"] is True
    assert "classifier" in json.dumps(export)  # the sequence classifier's names
