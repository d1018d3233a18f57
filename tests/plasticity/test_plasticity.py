"""Plasticity against a direct float64 computation written here from the model's weights."""

from __future__ import annotations

import copy
import logging

import numpy as np
import polars as pl
import pytest
import torch
from scipy.special import erf

from tests.helpers.images import write_reference
from tests.helpers.numpy_reference import embedding_protocol, layer_norm, norm_ratio
from vitplasticity.components import COMPONENTS
from vitplasticity.plasticity.measure import PAIR_SCHEMA, measure, measure_protocols
from vitplasticity.plasticity.summary import summarize, summary_scalars

# Measured on the perturbed tiny ViT below (8 pairs, 3 image seeds, both protocols): the
# float64 model agrees with the direct computation to <= 1.2e-15 relative; the float32 model to
# <= 5.5e-7 (worst: in_situ numerators). 1e-5 leaves ~20x room for other BLAS kernels while a
# real error (a wrong slice, norm or scale) shows at >= 1e-2.
FLOAT32_RTOL = 1e-5


# ---------------------------------------------------------------------------------------------
# The direct computation: numpy float64, one pair at a time, from the state dict.


def _weights(model: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}


def direct_embedding(w: dict[str, np.ndarray], image: np.ndarray, patch: int) -> np.ndarray:
    """Patch embedding by hand (non-overlapping patches, row-major), cls token, positions."""
    kernel = w["patch_embed.proj.weight"]  # (d, 3, p, p)
    d = kernel.shape[0]
    _, height, width = image.shape
    rows = []
    for i in range(height // patch):
        for j in range(width // patch):
            piece = image[:, i * patch : (i + 1) * patch, j * patch : (j + 1) * patch]
            rows.append(kernel.reshape(d, -1) @ piece.ravel() + w["patch_embed.proj.bias"])
    tokens = np.vstack([w["cls_token"][0], np.array(rows)])
    return tokens + w["pos_embed"][0]


def attention(w: dict[str, np.ndarray], prefix: str, x: np.ndarray, heads: int) -> np.ndarray:
    """softmax(q k^T / sqrt(d_h)) v per head; head h's q, k, v are rows h*d_h:(h+1)*d_h."""
    d = x.shape[1]
    d_h = d // heads
    qkv_w, qkv_b = w[f"{prefix}.qkv.weight"], w[f"{prefix}.qkv.bias"]
    outputs = []
    for h in range(heads):
        rows = slice(h * d_h, (h + 1) * d_h)
        q = x @ qkv_w[:d][rows].T + qkv_b[:d][rows]
        k = x @ qkv_w[d : 2 * d][rows].T + qkv_b[d : 2 * d][rows]
        v = x @ qkv_w[2 * d :][rows].T + qkv_b[2 * d :][rows]
        logits = q @ k.T / np.sqrt(d_h)
        weights = np.exp(logits - logits.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        outputs.append(weights @ v)
    return np.hstack(outputs) @ w[f"{prefix}.proj.weight"].T + w[f"{prefix}.proj.bias"]


def linear(w: dict[str, np.ndarray], prefix: str, x: np.ndarray) -> np.ndarray:
    return x @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def direct_plasticity(
    model: torch.nn.Module, reference: torch.Tensor, downstream: torch.Tensor, protocol: str
) -> dict[tuple[int, str, int], tuple[float, float]]:
    """(block, component, pair) -> (numerator, denominator), computed pair by pair."""
    w = _weights(model)
    heads = model.blocks[0].attn.num_heads
    eps = model.blocks[0].norm1.eps
    patch = model.patch_embed.patch_size[0]
    depth = len(model.blocks)
    found = {}
    for pair in range(len(reference)):
        x = direct_embedding(w, reference[pair].double().numpy(), patch)
        y = direct_embedding(w, downstream[pair % len(downstream)].double().numpy(), patch)
        for block in range(depth):
            b = f"blocks.{block}"

            def ln(name: str, t: np.ndarray, b: str = b) -> np.ndarray:
                return layer_norm(t, w[f"{b}.{name}.weight"], w[f"{b}.{name}.bias"], eps)

            if protocol == "embedding":
                parts = embedding_protocol(
                    x,
                    y,
                    ln1=lambda t: ln("norm1", t),
                    mha=lambda t, b=b: attention(w, f"{b}.attn", t, heads),
                    ln2=lambda t: ln("norm2", t),
                    fc1=lambda t, b=b: linear(w, f"{b}.mlp.fc1", t),
                    fc2=lambda t, b=b: linear(w, f"{b}.mlp.fc2", t),
                    fc2_width=w[f"{b}.mlp.fc2.weight"].shape[1],
                )
            else:  # in_situ: the real block, each component fed what reaches it
                parts = {"ln1": norm_ratio(lambda t: ln("norm1", t), x, y)}
                ux, uy = ln("norm1", x), ln("norm1", y)
                parts["mha"] = norm_ratio(
                    lambda t, b=b: attention(w, f"{b}.attn", t, heads), ux, uy
                )
                rx = x + attention(w, f"{b}.attn", ux, heads)
                ry = y + attention(w, f"{b}.attn", uy, heads)
                parts["ln2"] = norm_ratio(lambda t: ln("norm2", t), rx, ry)
                vx, vy = ln("norm2", rx), ln("norm2", ry)
                parts["fc1"] = norm_ratio(lambda t, b=b: linear(w, f"{b}.mlp.fc1", t), vx, vy)
                hx = gelu(linear(w, f"{b}.mlp.fc1", vx))
                hy = gelu(linear(w, f"{b}.mlp.fc1", vy))
                parts["fc2"] = norm_ratio(lambda t, b=b: linear(w, f"{b}.mlp.fc2", t), hx, hy)
                x = rx + linear(w, f"{b}.mlp.fc2", hx)
                y = ry + linear(w, f"{b}.mlp.fc2", hy)
            for component, value in parts.items():
                found[(block, component, pair)] = value
    return found


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def vit64(tiny_vit: torch.nn.Module) -> torch.nn.Module:
    """The tiny ViT in float64 with every weight perturbed.

    Random-init norms are gamma = 1, beta = 0 and attention is near uniform; perturbing them
    makes a wrong gamma, head slicing or softmax scale show in the numbers.
    """
    model = copy.deepcopy(tiny_vit).double()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            if "norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.5 * noise)
            elif "qkv.weight" in name:
                parameter.copy_(0.3 * noise)
            else:
                parameter.add_(0.05 * noise)
    # The direct computation assumes what the paper's ViTs have: no layer scale, no pre-norm.
    assert isinstance(model.norm_pre, torch.nn.Identity)
    assert isinstance(model.blocks[0].ls1, torch.nn.Identity)
    return model.eval()


def _images(n: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn((n, 3, 32, 32), generator=generator, dtype=torch.float64)


def _frame_dict(frame: pl.DataFrame) -> dict[tuple[int, str, int], tuple[float, float]]:
    return {
        (row["block"], row["component"], row["pair"]): (row["numerator"], row["denominator"])
        for row in frame.iter_rows(named=True)
    }


# ---------------------------------------------------------------------------------------------
# Against the direct computation


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
def test_matches_direct_float64(vit64: torch.nn.Module, protocol: str) -> None:
    reference, downstream = _images(5, seed=1), _images(3, seed=2)  # downstream cycles
    frame = measure(vit64, reference, downstream, protocol=protocol, batch_size=2)
    expected = direct_plasticity(vit64, reference, downstream, protocol)
    got = _frame_dict(frame)
    assert got.keys() == expected.keys()
    for key, (numerator, denominator) in expected.items():
        assert got[key][0] == pytest.approx(numerator, rel=1e-6), key
        assert got[key][1] == pytest.approx(denominator, rel=1e-6), key
    ratios = {k: n / d for k, (n, d) in expected.items()}
    for row in frame.iter_rows(named=True):
        key = (row["block"], row["component"], row["pair"])
        assert row["ratio"] == pytest.approx(ratios[key], rel=1e-6)
    assert set(frame["protocol"]) == {protocol}


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
def test_float32_model_close_to_direct(vit64: torch.nn.Module, protocol: str) -> None:
    reference, downstream = _images(4, seed=3), _images(4, seed=4)
    model32 = copy.deepcopy(vit64).float()
    frame = measure(model32, reference, downstream, protocol=protocol)  # inputs cast to float32
    # The float64 reference is computed from the float32-rounded weights and images.
    expected = direct_plasticity(model32, reference.float(), downstream.float(), protocol)
    got = _frame_dict(frame)
    worst = max(
        abs(got[key][i] - value[i]) / abs(value[i])
        for key, value in expected.items()
        for i in (0, 1)
    )
    assert worst < FLOAT32_RTOL
    assert frame["numerator"].dtype == pl.Float64


def test_embedding_protocol_feeds_every_block_the_same_pair(vit64: torch.nn.Module) -> None:
    frame = measure(vit64, _images(3, seed=5), _images(3, seed=6))
    denominators = frame.group_by("pair").agg(pl.col("denominator").n_unique().alias("distinct"))
    assert (denominators["distinct"] == 1).all()


# ---------------------------------------------------------------------------------------------
# Pairing, batching, streaming


def test_shorter_downstream_is_cycled(vit64: torch.nn.Module) -> None:
    reference, downstream = _images(7, seed=8), _images(3, seed=9)
    cycled = downstream[torch.tensor([0, 1, 2, 0, 1, 2, 0])]
    short = measure(vit64, reference, downstream, protocol="in_situ", batch_size=4)
    full = measure(vit64, reference, cycled, protocol="in_situ", batch_size=4)
    np.testing.assert_allclose(short["numerator"], full["numerator"], rtol=1e-12)
    np.testing.assert_allclose(short["denominator"], full["denominator"], rtol=1e-12)


def test_n_pairs_takes_the_first_pairs(vit64: torch.nn.Module) -> None:
    reference, downstream = _images(6, seed=10), _images(6, seed=11)
    first = measure(vit64, reference, downstream, n_pairs=4, batch_size=3)
    head = measure(vit64, reference[:4], downstream[:4])
    assert first["pair"].max() == 3
    np.testing.assert_allclose(first["ratio"], head["ratio"], rtol=1e-12)


@pytest.mark.parametrize("protocol", ["embedding", "in_situ"])
def test_iterable_batches_equal_one_tensor(vit64: torch.nn.Module, protocol: str) -> None:
    reference, downstream = _images(7, seed=12), _images(4, seed=13)
    whole = measure(vit64, reference, downstream, protocol=protocol, batch_size=7)
    streamed = measure(
        vit64,
        (batch for batch in (reference[:2], reference[2:3], reference[3:])),  # one-shot is fine
        [downstream[:3], downstream[3:]],  # re-iterable: cycled
        protocol=protocol,
        batch_size=3,
    )
    assert streamed.select("protocol", "block", "component", "pair").equals(
        whole.select("protocol", "block", "component", "pair")
    )
    np.testing.assert_allclose(streamed["ratio"], whole["ratio"], rtol=1e-12)
    np.testing.assert_allclose(streamed["numerator"], whole["numerator"], rtol=1e-12)


def test_several_protocols_in_one_pass(vit64: torch.nn.Module) -> None:
    reference, downstream = _images(3, seed=14), _images(3, seed=15)
    both = measure_protocols(vit64, reference, downstream, protocols=["embedding", "in_situ"])
    for protocol in ("embedding", "in_situ"):
        alone = measure(vit64, reference, downstream, protocol=protocol)
        np.testing.assert_allclose(
            both.filter(pl.col("protocol") == protocol)["ratio"], alone["ratio"], rtol=1e-12
        )


# ---------------------------------------------------------------------------------------------
# Schema and errors


def test_schema_and_ratio(tiny_vit: torch.nn.Module) -> None:
    reference, downstream = _images(4, seed=16).float(), _images(2, seed=17).float()
    frame = measure(tiny_vit, reference, downstream, protocol="in_situ", batch_size=3)
    assert frame.schema == pl.Schema(PAIR_SCHEMA)
    depth = len(tiny_vit.blocks)
    assert frame.height == depth * len(COMPONENTS) * 4
    assert frame["component"].to_list()[:8] == ["ln1"] * 4 + ["mha"] * 4
    assert sorted(frame["block"].unique()) == list(range(depth))
    assert (frame["ratio"] == frame["numerator"] / frame["denominator"]).all()
    assert (frame["denominator"] > 0).all()


def test_errors_name_the_culprit(tiny_vit: torch.nn.Module) -> None:
    images = _images(2, seed=18).float()
    with pytest.raises(ValueError, match=r"'bogus'.*embedding, in_situ"):
        measure(tiny_vit, images, images, protocol="bogus")
    with pytest.raises(ValueError, match=r"Sequential .*no vitplasticity architecture.*timm_vit"):
        measure(torch.nn.Sequential(torch.nn.Linear(3, 3)), images, images)
    with pytest.raises(ValueError, match="unknown fc1 mode 'gate'; valid modes: stage, up"):
        measure(tiny_vit, images, images, fc1="gate")
    with pytest.raises(ValueError, match="fewer than the 5 pairs"):
        measure(tiny_vit, images, images, n_pairs=5)
    with pytest.raises(ValueError, match="fewer than the 5 pairs"):
        measure(tiny_vit, [images], images, n_pairs=5)
    with pytest.raises(ValueError, match="one-shot iterator"):
        measure(tiny_vit, _images(3, seed=19).float(), iter([images]))
    with pytest.raises(ValueError, match=r"expected image batches \(N, 3, H, W\)"):
        measure(tiny_vit, images[0], images)
    with pytest.raises(ValueError, match="downstream: no images"):
        measure(tiny_vit, images, images[:0])
    with pytest.raises(ValueError, match="training mode"):
        measure(tiny_vit.train(), images, images)


@pytest.mark.gpu
def test_cuda_matches_cpu(vit64: torch.nn.Module) -> None:
    reference, downstream = _images(4, seed=20), _images(3, seed=21)
    cpu = measure_protocols(vit64, reference, downstream, protocols=["embedding", "in_situ"])
    gpu = measure_protocols(
        copy.deepcopy(vit64).cuda(), reference, downstream, protocols=["embedding", "in_situ"]
    )
    np.testing.assert_allclose(gpu["ratio"], cpu["ratio"], rtol=1e-9)


# ---------------------------------------------------------------------------------------------
# summarize


def test_summarize_against_numpy() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for protocol in ("embedding", "in_situ"):
        for block in range(4):
            for component in COMPONENTS:
                n = 5 + block  # unequal group sizes
                for pair, value in enumerate(rng.gamma(2.0, size=n)):
                    rows.append((protocol, block, component, pair, value))
    pairs = pl.DataFrame(
        rows, schema=["protocol", "block", "component", "pair", "ratio"], orient="row"
    )
    summary = summarize(pairs)
    assert summary.height == 2 * 4 * len(COMPONENTS)
    assert summary["component"].to_list()[:5] == list(COMPONENTS)
    for row in summary.iter_rows(named=True):
        values = np.array(
            [r[4] for r in rows if r[:3] == (row["protocol"], row["block"], row["component"])]
        )
        std = values.std(ddof=1)
        assert row["n_pairs"] == len(values)
        assert row["mean"] == pytest.approx(values.mean(), rel=1e-12)
        assert row["std"] == pytest.approx(std, rel=1e-12)
        assert row["ci95"] == pytest.approx(1.96 * std / np.sqrt(len(values)), rel=1e-12)
        assert row["relative_depth"] == pytest.approx((row["block"] + 1) / 4)


def test_the_tracked_summary_is_each_block_mean_and_their_mean() -> None:
    rng = np.random.default_rng(1)
    means = {(p, b, c): rng.gamma(2.0) for p in ("embedding", "in_situ") for b in range(3)
             for c in COMPONENTS}  # fmt: skip
    summary = pl.DataFrame(
        [(p, b, c, m) for (p, b, c), m in means.items()],
        schema=["protocol", "block", "component", "mean"],
        orient="row",
    )
    scalars = summary_scalars(summary)
    assert len(scalars) == 2 * len(COMPONENTS) * (3 + 1)
    for (protocol, block, component), mean in means.items():
        assert scalars[f"{protocol}/block{block}/{component}"] == mean
    for protocol in ("embedding", "in_situ"):
        for component in COMPONENTS:
            blocks = [means[protocol, b, component] for b in range(3)]
            assert scalars[f"{protocol}/{component}"] == pytest.approx(np.mean(blocks), rel=1e-12)


# ---------------------------------------------------------------------------------------------
# The CLI, end to end on the tiny model


def test_cli_end_to_end(tmp_path, demo_dataset, tiny_spec, caplog) -> None:
    import json

    from vitplasticity.cli import main
    from vitplasticity.data.store import read_split
    from vitplasticity.data.transforms import eval_batches
    from vitplasticity.models.build import build_model, preprocessing
    from vitplasticity.utils.io import read_parquet_metadata

    reference = tmp_path / "reference.parquet"
    write_reference(
        reference, 40, seed=3, size=(40, 36)
    )  # test split has 32 images: the last 8 pairs cycle
    out, summary = tmp_path / "pairs.parquet", tmp_path / "summary.parquet"
    spec_json = json.dumps(
        {"timm_id": tiny_spec.timm_id, "weights": "random", "kwargs": tiny_spec.kwargs}
    )
    argv = [
        "plasticity", "--model", "tiny", "--model-spec", spec_json,
        "--reference", str(reference), "--dataset-dir", str(demo_dataset), "--split", "test",
        "--protocols", "embedding", "in_situ", "--n-pairs", "38", "--batch-size", "8",
        "--device", "cpu", "--dtype", "float64", "--demo",
        "--out", str(out), "--summary", str(summary),
    ]  # fmt: skip
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    assert any("38/38 (100%)" in message for message in caplog.messages)

    pairs = pl.read_parquet(out)
    meta = read_parquet_metadata(out)
    assert meta["model"] == "tiny" and meta["dataset"] == demo_dataset.name and meta["demo"] is True
    settings = meta["provenance"]["settings"]
    assert settings["n_pairs"] == 38 and settings["dtype"] == "float64"
    assert settings["protocols"] == ["embedding", "in_situ"]
    assert "versions" in meta["provenance"]

    # The same numbers from measure() on the same seeded model and decoded images.
    torch.manual_seed(0)
    model = build_model(tiny_spec, num_classes=0).eval().double()
    pre = preprocessing(model, tiny_spec)
    import pyarrow.parquet as pq

    ref_images = pq.read_table(reference).column("image").to_pylist()[:38]
    test = read_split(demo_dataset, "test")
    ref_tensor = torch.cat(list(eval_batches(ref_images, pre, 64)))
    down_tensor = torch.cat(list(eval_batches(test.images, pre, 64)))
    expected = measure_protocols(
        model, ref_tensor, down_tensor, protocols=["embedding", "in_situ"], batch_size=16
    )
    assert pairs.select("protocol", "block", "component", "pair").equals(
        expected.select("protocol", "block", "component", "pair")
    )
    np.testing.assert_allclose(pairs["ratio"], expected["ratio"], rtol=1e-10)

    table = pl.read_parquet(summary)
    assert table.columns[:2] == ["model", "dataset"]
    assert set(table["model"]) == {"tiny"} and set(table["dataset"]) == {demo_dataset.name}
    assert table.drop("model", "dataset").equals(summarize(pairs))
    assert read_parquet_metadata(summary)["demo"] is True


def test_cli_rejects_bad_input_before_compute(tmp_path, demo_dataset, tiny_spec, caplog) -> None:
    import json

    from vitplasticity.cli import main

    reference = tmp_path / "reference.parquet"
    write_reference(reference, 4, seed=3, size=(40, 36))
    spec_json = json.dumps(
        {"timm_id": tiny_spec.timm_id, "weights": "random", "kwargs": tiny_spec.kwargs}
    )
    base = [
        "plasticity", "--model", "tiny", "--model-spec", spec_json,
        "--dataset-dir", str(demo_dataset), "--out", str(tmp_path / "p.parquet"),
        "--summary", str(tmp_path / "s.parquet"), "--device", "cpu",
    ]  # fmt: skip
    cases = [
        (["--reference", str(tmp_path / "missing.parquet"), "--n-pairs", "2"], "missing.parquet"),
        (["--reference", str(reference), "--n-pairs", "9"], "fewer than --n-pairs 9"),
        (
            ["--reference", str(reference), "--n-pairs", "0"],
            "--n-pairs (plasticity.n_pairs): must be >= 1",
        ),
        (["--reference", str(reference), "--n-pairs", "2", "--protocols", "x"], "'x'"),
        (["--reference", str(reference), "--n-pairs", "2", "--split", "val"], "val.parquet"),
    ]
    for extra, message in cases:
        caplog.clear()
        with caplog.at_level(logging.ERROR):
            assert main(base + extra) == 2
        assert any(message in m for m in caplog.messages), (extra, caplog.messages)
    assert not (tmp_path / "p.parquet").exists()


def test_decoded_batches_keep_order(demo_dataset) -> None:
    from vitplasticity.data.preprocessing import Preprocessing
    from vitplasticity.data.store import read_split
    from vitplasticity.data.transforms import decoded_batches, eval_batches

    images = read_split(demo_dataset, "test").images
    pre = Preprocessing(32, 1.0, "bicubic", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    threaded = list(decoded_batches(images, pre, 5, threads=3))
    plain = list(eval_batches(images, pre, 5))
    assert [len(b) for b in threaded] == [len(b) for b in plain]
    assert all(torch.equal(a, b) for a, b in zip(threaded, plain, strict=True))
