"""recommend on a model larger than memory (vitplasticity.recommend.streamed): a model streamed
block by block from its checkpoint gives the whole model's plasticity, weight statistic,
Spectrum SNR and kappa exactly, in float64, for every kind of family; the gradient criteria
and NFN are n/a with the reason in the report, and a ranking by one of them is refused before
any compute."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from tests.helpers.streamed import saved_checkpoint
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.streamed import StreamedModel, open_streamed, with_new_head
from vitplasticity.recommend.criteria import weight_statistics
from vitplasticity.recommend.matrix_criteria import matrix_statistics
from vitplasticity.recommend.pipeline import RecommendInputs
from vitplasticity.recommend.settings import RecommendImageSettings
from vitplasticity.recommend.streamed import whole_model_criteria
from vitplasticity.utils.io import read_parquet_metadata

CASES = {
    "vit_tiny_patch16_224": "timm ViT",
    "hf_vit": "a transformers vision tower",
    "gpt2_tiny": "a decoder with Conv1D linears",
    "llama_tiny": "a decoder with a gated MLP and RMSNorm (weight statistic n/a for norms)",
    "mixtral_tiny": "a mixture of experts: fused 3-D experts scored expert by expert",
    "bert_tiny": "an encoder with a pooler",
    "deberta_v2_tiny": "an encoder whose MHA owns relative-position embeddings outside the blocks",
}


IMAGES = ("vit_tiny_patch16_224", "hf_vit")
"""Vision models are ranked with a new classifier (a bare transformers tower refuses recommend)."""


def _models(entry: dict, num_classes: int) -> tuple[torch.nn.Module, StreamedModel]:
    """The whole model in float64 and the streamed one, each with a new ``num_classes`` head
    (0: none)."""
    spec = ModelSpec.from_config(entry)
    whole = build_model(entry, num_classes=num_classes).eval().double()
    streamed = open_streamed(spec)
    if num_classes:
        streamed = with_new_head(streamed, spec, num_classes)
    return whole, streamed.to(torch.device("cpu"), torch.float64)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_data_free_criteria_of_a_streamed_model_are_the_whole_models(
    tmp_path: Path, case: str
) -> None:
    whole, streamed = _models(saved_checkpoint(tmp_path, case), 3 if case in IMAGES else 0)
    assert weight_statistics(streamed).equals(weight_statistics(whole)), CASES[case]
    found, expected = matrix_statistics(streamed), matrix_statistics(whole)
    assert found.height > 0 and found.equals(expected), CASES[case]
    assert all(p.device.type == "meta" for b in streamed.blocks for p in b.parameters())


def _recommend(entry: dict, dataset: Path, prefix: Path, **settings: object):
    """recommend of ``entry`` on ``dataset`` in float64, its files written at ``prefix``."""
    from vitplasticity.recommend.pipeline import recommend, write_outputs

    inputs = RecommendInputs(
        model="tiny",
        dataset="demo-stripes",
        model_spec=ModelSpec.from_config(entry),
        reference_fallback="pool",
        dtype="float64",
    )
    small = {"n_pairs": 6, "batch_size": 4, "batches": 2, "warmup_steps": 2, "device": "cpu"}
    result = recommend(inputs, RecommendImageSettings(**{**small, **settings}), dataset)
    write_outputs(result, prefix)
    return result


@pytest.mark.parametrize("case", IMAGES)
def test_a_streamed_image_recommend_reports_what_it_measured_and_why_the_rest_is_na(
    tmp_path: Path, demo_dataset: Path, case: str
) -> None:
    # A saved transformers tower has no preprocessor_config.json: its normalisation is named.
    entry = {**saved_checkpoint(tmp_path, case), "normalize": "imagenet"}
    whole = _recommend(entry, demo_dataset, tmp_path / "whole", stream="never")
    streamed = _recommend(entry, demo_dataset, tmp_path / "streamed", stream="always")
    for field in ("pairs", "weights", "matrices"):
        assert getattr(streamed.measurements, field).equals(getattr(whole.measurements, field))
    assert streamed.measurements.tensors.is_empty() and streamed.measurements.features.is_empty()
    for counted in ("component_parameters", "always_trained"):
        assert getattr(streamed.measurements, counted) == getattr(whole.measurements, counted)
    # The same decision by plasticity, handed over in the same names and PEFT configs.
    assert streamed.recommendation == whole.recommendation
    assert streamed.export == whole.export
    table = pl.read_parquet(tmp_path / "streamed.parquet")
    na = table.filter(pl.col("criterion").is_in(whole_model_criteria()))
    assert na.height == 3 * 8 and na["value"].is_nan().all()
    measured = table.filter(~pl.col("criterion").is_in(whole_model_criteria()))
    expected = pl.read_parquet(tmp_path / "whole.parquet").filter(
        ~pl.col("criterion").is_in(whole_model_criteria())
    )
    assert measured.equals(expected)
    report = (tmp_path / "streamed.md").read_text()
    assert "relative gradient norm, gradient SNR and NFN are n/a for every configuration" in report
    assert "streamed block by block from its checkpoint (stream: always)" in report
    # The recommendation's sentence gives no rank for a criterion it has no value of.
    assert "The other criteria rank it: relative gradient norm n/a, gradient SNR n/a" in report
    settings = read_parquet_metadata(tmp_path / "streamed.parquet")["provenance"]["settings"]
    assert settings["stream"] == "always" and settings["streamed"] is True


@pytest.mark.parametrize("criterion", ["relative_gradient_norm", "gradient_snr", "nfn"])
def test_a_ranking_a_streamed_model_leaves_na_is_refused_before_any_compute(
    tmp_path: Path, demo_dataset: Path, criterion: str
) -> None:
    entry = saved_checkpoint(tmp_path, "vit_tiny_patch16_224")
    with pytest.raises(ValueError, match=f"--criterion {criterion}: the model is streamed"):
        _recommend(entry, demo_dataset, tmp_path / "out", stream="always", criterion=criterion)
    assert not list(tmp_path.glob("out*"))


TEXT = {
    "gpt2_tiny": "a bare GPT2Model: ranked in its causal LM, built around the skeleton",
    "llama_tiny": "a LlamaForCausalLM: its untied LM head is never read",
    "bert_tiny": "an encoder ranked on labelled text, in its sequence classifier",
}


def _text_entry(tmp_path: Path, case: str) -> dict:
    """The saved checkpoint of ``case`` as the text recommend takes it."""
    if case != "llama_tiny":
        return saved_checkpoint(tmp_path, case)
    import transformers

    from tests.helpers.tiny_models import HF_TEXT_TINY_CONFIG, perturbed

    config = transformers.LlamaConfig(**HF_TEXT_TINY_CONFIG, tie_word_embeddings=False)
    torch.manual_seed(0)
    perturbed(transformers.LlamaForCausalLM(config)).float().save_pretrained(tmp_path / "lm")
    return {"family": "transformers", "hf_id": "tiny/lm", "weights": str(tmp_path / "lm")}


def _recommend_text(tmp_path: Path, case: str, stream: str):
    from vitplasticity.recommend.pipeline import write_outputs
    from vitplasticity.recommend.settings import RecommendTextSettings
    from vitplasticity.recommend.text import recommend_text
    from vitplasticity.recommend.text_inputs import TextRecommendInputs

    reference = tmp_path / "reference.txt"
    reference.write_text("".join(f"reference line {i} of plain words\n" for i in range(40)))
    user = tmp_path / "notes.txt"
    user.write_text("".join(f"NOTE {i}: SOME OTHER TEXT, {i * 7}\n" for i in range(40)))
    labelled = None
    if case == "bert_tiny":
        from tests.helpers.labelled_text import write_first_byte_csv

        labelled = str(write_first_byte_csv(tmp_path / "labelled.csv", rows=40))
    inputs = TextRecommendInputs(
        model=case, dataset="notes", model_spec=_text_entry(tmp_path, case),
        reference=str(reference), texts=() if labelled else (str(user),),
        labelled_text=labelled, warmup_steps=2, dtype="float64",
    )  # fmt: skip
    settings = RecommendTextSettings(
        tokenizer="bytes", sequence_length=8, n_pairs=6, batch_size=3, batches=2,
        device="cpu", stream=stream,
    )  # fmt: skip
    result = recommend_text(inputs, settings)
    write_outputs(result, tmp_path / stream)
    return result


@pytest.mark.parametrize("case", sorted(TEXT))
def test_a_streamed_text_recommend_measures_what_the_whole_model_does_block_by_block(
    tmp_path: Path, case: str
) -> None:
    whole = _recommend_text(tmp_path, case, "never")
    streamed = _recommend_text(tmp_path, case, "always")
    for field in ("pairs", "weights", "matrices"):
        found, expected = getattr(streamed.measurements, field), getattr(whole.measurements, field)
        assert found.equals(expected), (TEXT[case], field)
    assert streamed.measurements.tensors.is_empty() and streamed.measurements.features.is_empty()
    assert streamed.measurements.component_parameters == whole.measurements.component_parameters
    assert streamed.export == whole.export, TEXT[case]
    report = (tmp_path / "always.md").read_text()
    assert "gradient SNR and NFN are n/a for every configuration" in report
    assert "next-token cross-entropy of" not in report and "warmed up alone" not in report
    settings = read_parquet_metadata(tmp_path / "always.parquet")["provenance"]["settings"]
    assert settings["streamed"] is True
