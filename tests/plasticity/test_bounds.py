"""The theoretical bounds: equal to a direct numpy computation, and above measured plasticity."""

from __future__ import annotations

import copy
import json
import logging

import numpy as np
import polars as pl
import pytest
import torch

from tests.helpers.images import write_reference
from vitplasticity.components import COMPONENTS
from vitplasticity.models.architectures import architecture_for
from vitplasticity.plasticity.measure import measure
from vitplasticity.plasticity.upper_bounds import BOUND_SCHEMA, TokenStatistics, upper_bounds


def embedding_tokens(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """What the first block of ``model`` receives for ``images``, (B, n, d)."""
    return architecture_for(model).embed(model, images).tokens


def _images(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((n, 3, 32, 32), generator=generator, dtype=torch.float64)


@pytest.fixture
def vit64(tiny_vit: torch.nn.Module) -> torch.nn.Module:
    """The tiny ViT in float64 with perturbed weights (non-trivial gammas, peaked attention).

    The query bias stays zero: the paper's attention bound is for bias-free attention, and
    of the biases only the query's does not cancel (see vitplasticity.plasticity.upper_bounds).
    """
    model = copy.deepcopy(tiny_vit).double()
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if "norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.5 * noise)
            elif "qkv.weight" in name:
                parameter.copy_(0.3 * noise)
            else:
                parameter.add_(0.05 * noise)
        for block in model.blocks:
            width = block.attn.qkv.in_features
            block.attn.qkv.bias[:width] = 0.0
    return model.eval()


def direct_bounds(model: torch.nn.Module, tokens: np.ndarray) -> dict[tuple[int, str], tuple]:
    """(block, component) -> (bound, bound_energy) from the state dict, in numpy float64."""
    w = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    n, d = tokens.shape[1:]
    r = np.sqrt((tokens**2).sum(axis=-1)).max()
    energy = (tokens**2).sum(axis=(1, 2)).max()
    variance = tokens.reshape(-1, d).var(axis=1).min()
    heads = model.blocks[0].attn.num_heads
    d_h = d // heads
    found = {}
    for b in range(len(model.blocks)):
        p = f"blocks.{b}"
        for component, norm in (("ln1", "norm1"), ("ln2", "norm2")):
            eps = getattr(model.blocks[b], norm).eps
            bound = np.abs(w[f"{p}.{norm}.weight"]).max() / np.sqrt(variance + eps)
            found[(b, component)] = (bound, None)
        for component in ("fc1", "fc2"):
            found[(b, component)] = (np.linalg.norm(w[f"{p}.mlp.{component}.weight"], ord=2), None)
        qkv, proj = w[f"{p}.attn.qkv.weight"], w[f"{p}.attn.proj.weight"]
        bound = bound_energy = 0.0
        for h in range(heads):
            rows = np.arange(h * d_h, (h + 1) * d_h)
            q, k, v = qkv[rows], qkv[d + rows], qkv[2 * d + rows]  # (d_h, d) each
            a = np.linalg.norm(q.T @ k / np.sqrt(d_h), ord=2)
            ov = np.linalg.norm(proj[:, rows], ord=2) * np.linalg.norm(v, ord=2)
            bound += ov * np.sqrt(3 * n + (12 * n + 3) * r**4 * a**2)
            bound_energy += ov * (np.sqrt(n) + energy * a)
        found[(b, "mha")] = (bound, bound_energy)
    return found


def test_bounds_equal_direct_computation(vit64: torch.nn.Module) -> None:
    with torch.no_grad():
        tokens = embedding_tokens(vit64, _images(6, seed=1))
    table = upper_bounds(vit64, tokens)
    assert table.schema == pl.Schema(BOUND_SCHEMA)
    assert table.height == len(vit64.blocks) * len(COMPONENTS)
    expected = direct_bounds(vit64, tokens.numpy())
    for row in table.iter_rows(named=True):
        bound, bound_energy = expected[(row["block"], row["component"])]
        assert row["bound"] == pytest.approx(bound, rel=1e-10), row
        if bound_energy is None:
            assert row["bound_energy"] is None
        else:
            assert row["bound_energy"] == pytest.approx(bound_energy, rel=1e-10)
            assert row["alpha"] == 1.0 and row["n_tokens"] == tokens.shape[1]


def test_token_statistics_stream_equals_tensor(vit64: torch.nn.Module) -> None:
    with torch.no_grad():
        tokens = embedding_tokens(vit64, _images(7, seed=2))
    whole = TokenStatistics.from_tokens(tokens)
    streamed = TokenStatistics.from_tokens(iter([tokens[:3], tokens[3:3], tokens[3:]]))
    assert streamed.n_sequences == whole.n_sequences == 7
    for field in ("min_variance", "radius", "energy"):
        assert getattr(streamed, field) == pytest.approx(getattr(whole, field), rel=1e-12)
    squared = tokens.square().sum(-1)
    assert whole.radius == pytest.approx(squared.max().sqrt().item())
    assert whole.energy == pytest.approx(squared.sum(-1).max().item())


def _assert_measured_below_bounds(model: torch.nn.Module, ref: torch.Tensor, down: torch.Tensor):
    # Both images of every pair belong to the set the bound assumes.
    with torch.no_grad():
        tokens = torch.cat([embedding_tokens(model, ref), embedding_tokens(model, down)])
    bounds = upper_bounds(model, tokens)
    measured = (
        measure(model, ref, down, protocol="embedding")
        .group_by("block", "component")
        .agg(pl.col("ratio").max().alias("worst"))
        .join(bounds, on=["block", "component"])
    )
    assert measured.height == bounds.height
    violations = measured.filter(pl.col("worst") > pl.col("bound"))
    assert violations.height == 0, violations
    mha = measured.filter(pl.col("component") == "mha")
    assert (mha["worst"] <= mha["bound_energy"]).all(), mha
    return measured


@pytest.mark.parametrize("model_name", ["tiny_vit", "vit64"])
def test_measured_plasticity_below_bounds(model_name: str, request) -> None:
    model = request.getfixturevalue(model_name).double()
    ref, down = _images(6, seed=3), _images(6, seed=4)
    _assert_measured_below_bounds(model, ref, down)
    # Close pairs probe the local slope, where a bound is easiest to break.
    near = ref + 1e-3 * _images(6, seed=5)
    measured = _assert_measured_below_bounds(model, ref, near)
    # LayerNorm's bound is within a modest factor of its measured slope (not vacuous).
    ln = measured.filter(pl.col("component") == "ln1")
    assert (ln["bound"] / ln["worst"] < 50).all()


def test_errors_name_the_culprit(tiny_vit: torch.nn.Module) -> None:
    with pytest.raises(ValueError, match=r"expected \(N, n, d\)"):
        upper_bounds(tiny_vit, torch.zeros(4, 48))
    with pytest.raises(ValueError, match="no sequences"):
        upper_bounds(tiny_vit, torch.zeros(0, 17, 48))
    with pytest.raises(ValueError, match="tokens have 40 features, block 0 expects 48"):
        upper_bounds(tiny_vit, torch.randn(2, 17, 40))
    with pytest.raises(ValueError, match="not a timm VisionTransformer"):
        upper_bounds(torch.nn.Linear(3, 3), torch.randn(2, 17, 48))


def test_cli_end_to_end(tmp_path, demo_dataset, tiny_spec, caplog) -> None:
    import pyarrow.parquet as pq

    from vitplasticity.cli import main
    from vitplasticity.data.transforms import eval_batches
    from vitplasticity.models.build import build_model, preprocessing
    from vitplasticity.utils.io import read_parquet_metadata

    reference = tmp_path / "reference.parquet"
    write_reference(reference, 12, seed=5)
    spec_json = json.dumps(
        {"timm_id": tiny_spec.timm_id, "weights": "random", "kwargs": tiny_spec.kwargs}
    )
    pairs = tmp_path / "plasticity" / f"{demo_dataset.name}.parquet"
    common = ["--model", "tiny", "--model-spec", spec_json, "--reference", str(reference)]
    common += ["--device", "cpu", "--batch-size", "5", "--demo"]
    torch.manual_seed(0)
    measure_argv = ["plasticity", *common, "--dataset-dir", str(demo_dataset), "--n-pairs", "12"]
    measure_argv += ["--out", str(pairs), "--summary", str(tmp_path / "summary.parquet")]
    assert main(measure_argv) == 0
    out, prefix = tmp_path / "bounds" / "tiny.parquet", tmp_path / "figures" / "bounds_tiny"
    torch.manual_seed(0)  # the same random-init model as the measurement
    with caplog.at_level(logging.INFO):
        argv = ["bounds", *common, "--n-images", "10", "--out", str(out)]
        argv += ["--plasticity", str(pairs), "--figure-prefix", str(prefix)]
        assert main(argv) == 0

    table = pl.read_parquet(out)
    assert table.height == 3 * len(COMPONENTS)
    assert set(table["model"]) == {"tiny"} and set(table["n_datasets"]) == {1}
    meta = read_parquet_metadata(out)
    assert meta["demo"] is True and meta["model"] == "tiny"
    assert meta["provenance"]["settings"]["token_statistics"]["n_sequences"] == 10
    for suffix in ("pdf", "png"):
        assert (tmp_path / "figures" / f"bounds_tiny.{suffix}").stat().st_size > 1000

    # The bounds equal upper_bounds() on the same model and the first 10 reference images.
    torch.manual_seed(0)
    model = build_model(tiny_spec, num_classes=0).eval().double()
    images = pq.read_table(reference).column("image").to_pylist()[:10]
    batch = torch.cat(list(eval_batches(images, preprocessing(model, tiny_spec), 64)))
    with torch.no_grad():
        expected = upper_bounds(model, embedding_tokens(model, batch.double()))
    np.testing.assert_allclose(table["bound"], expected["bound"], rtol=1e-10)

    # The measured columns are the pooled embedding-protocol ratios of the pairs file.
    measured = pl.read_parquet(pairs).filter(pl.col("protocol") == "embedding")
    means = measured.group_by("block", "component").agg(pl.col("ratio").mean())
    joined = table.join(means, on=["block", "component"])
    np.testing.assert_allclose(joined["measured_mean"], joined["ratio"], rtol=1e-12)


def test_cli_rejects_missing_plasticity_file(tmp_path, tiny_spec, caplog) -> None:
    from vitplasticity.cli import main

    reference = tmp_path / "reference.parquet"
    write_reference(reference, 3, seed=5)
    spec_json = json.dumps({"timm_id": tiny_spec.timm_id, "weights": "random"})
    argv = ["bounds", "--model", "tiny", "--model-spec", spec_json, "--reference", str(reference)]
    argv += ["--n-images", "3", "--out", str(tmp_path / "b.parquet"), "--figure-prefix", "x"]
    with caplog.at_level(logging.ERROR):
        assert main([*argv, "--plasticity", str(tmp_path / "gone.parquet")]) == 2
        assert main([*argv, "--n-images", "9"]) == 2
    assert any("gone.parquet" in m for m in caplog.messages)
    assert any("fewer than --n-images 9" in m for m in caplog.messages)
    assert not (tmp_path / "b.parquet").exists()
