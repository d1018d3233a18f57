"""Text plasticity: tokenizing and cutting text files, the plasticity CLI on a GPT2's text
``models:`` entry against plasticity.measure called directly, the entries it refuses, and the
workflow's text_plasticity and text_bounds jobs (dry run)."""

from __future__ import annotations

import json
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

from tests.helpers.repo import REPO
from tests.helpers.text_entries import text_dataset
from vitplasticity.cli import main
from vitplasticity.data.text import byte_tokenizer, cycled, load_tokenizer, read_sequences
from vitplasticity.plasticity.measure import PAIR_SCHEMA, measure
from vitplasticity.plasticity.summary import summarize
from vitplasticity.utils.io import read_parquet_metadata

TINY_GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 256, "n_positions": 64}

REFERENCE_TEXT = "".join(
    f"Document {i}: the quick brown fox jumps over the lazy dog, {i * 7} times.\n\n"
    for i in range(12)
)
DOWNSTREAM_TEXT = "Caf\u00e9 cr\u00e8me\n\nna\u00efve text, short.\nAnother line.\n"


def expected_ids(text: str, vocab: int) -> np.ndarray:
    """Independent byte tokenization: non-empty lines, each + newline, bytes mod vocab."""
    kept = "".join(line + "\n" for line in text.split("\n") if line.strip())
    return np.frombuffer(kept.encode("utf-8"), dtype=np.uint8).astype(np.int64) % vocab


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_byte_tokenizer_is_utf8_bytes_mod_vocab() -> None:
    tokenize = byte_tokenizer(7)
    text = "a\u00e9\u20ac"  # 1, 2 and 3 UTF-8 bytes
    assert tokenize(text) == [b % 7 for b in bytes([0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC])]
    assert load_tokenizer("bytes", 256)(text) == [0x61, 0xC3, 0xA9, 0xE2, 0x82, 0xAC]
    with pytest.raises(ValueError, match="vocab_size"):
        byte_tokenizer(0)


def test_sequences_are_cut_in_file_order(tmp_path: Path) -> None:
    path = write(tmp_path / "ref.txt", REFERENCE_TEXT)
    ids = expected_ids(REFERENCE_TEXT, 256)
    sequences = read_sequences(path, byte_tokenizer(256), 16)
    n = len(ids) // 16
    assert sequences.dtype == np.int64
    np.testing.assert_array_equal(sequences, ids[: n * 16].reshape(n, 16))
    # max_sequences keeps the first ones only.
    np.testing.assert_array_equal(
        read_sequences(path, byte_tokenizer(256), 16, max_sequences=3), sequences[:3]
    )


def test_cycling_pairs_sequence_i_with_i_mod_n() -> None:
    sequences = np.arange(12).reshape(3, 4)
    out = cycled(sequences, 7)
    np.testing.assert_array_equal(out, sequences[[0, 1, 2, 0, 1, 2, 0]])
    with pytest.raises(ValueError, match="no sequences"):
        cycled(sequences[:0], 2)


def test_text_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError, match=r"missing\.txt"):
        read_sequences(missing, byte_tokenizer(256), 8)
    short = write(tmp_path / "short.txt", "abc\n\n\n")
    with pytest.raises(ValueError, match=r"short\.txt: 4 tokens, fewer than one sequence of 8"):
        read_sequences(short, byte_tokenizer(256), 8)
    with pytest.raises(ValueError, match="sequence_length"):
        read_sequences(short, byte_tokenizer(256), 0)


@pytest.fixture(scope="module")
def tiny_gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved random-init tiny GPT2Model (the CLI loads it as a local folder)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(**TINY_GPT2))
    folder = tmp_path_factory.mktemp("gpt2") / "tiny"
    model.save_pretrained(folder)
    return folder


def saved_entry(folder: Path) -> dict:
    """The models: entry of a saved model folder."""
    return {"family": "transformers", "hf_id": "tiny", "weights": str(folder)}


def random_entry(seed: int = 0) -> dict:
    """The models: entry of a random-init tiny GPT2."""
    config = {"model_type": "gpt2", **TINY_GPT2}
    return {"family": "transformers", "hf_id": "tiny", "weights": "random", "config": config} | {
        "init_seed": seed
    }


def run_cli(tmp_path: Path, folder: Path, *extra: str, reference: Path, text: Path) -> int:
    return main(
        [
            "plasticity",
            "--model",
            "tiny",
            "--model-spec",
            json.dumps(saved_entry(folder)),
            "--reference",
            str(reference),
            "--text",
            str(text),
            "--tokenizer",
            "bytes",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "pairs.parquet"),
            "--summary",
            str(tmp_path / "summary.parquet"),
            *extra,
        ]
    )


def test_cli_matches_measure_called_directly(tmp_path: Path, tiny_gpt2_folder: Path) -> None:
    from transformers import GPT2Model

    reference = write(tmp_path / "wiki.txt", REFERENCE_TEXT)
    text = write(tmp_path / "downstream.txt", DOWNSTREAM_TEXT)
    length, n_pairs = 16, 9
    code = run_cli(
        tmp_path,
        tiny_gpt2_folder,
        "--sequence-length",
        str(length),
        "--n-pairs",
        str(n_pairs),
        "--batch-size",
        "4",
        "--protocols",
        "embedding",
        "in_situ",
        "--demo",
        reference=reference,
        text=text,
    )
    assert code == 0
    pairs = pl.read_parquet(tmp_path / "pairs.parquet")
    summary = pl.read_parquet(tmp_path / "summary.parquet")

    # Sequences written out independently: reference i with downstream i mod (their count).
    ref_ids = expected_ids(REFERENCE_TEXT, 256)[: n_pairs * length].reshape(n_pairs, length)
    down_all = expected_ids(DOWNSTREAM_TEXT, 256)
    n_down = len(down_all) // length
    assert 1 <= n_down < n_pairs  # the downstream set really is cycled
    down_ids = down_all[: n_down * length].reshape(n_down, length)
    down_ids = np.stack([down_ids[i % n_down] for i in range(n_pairs)])

    model = GPT2Model.from_pretrained(tiny_gpt2_folder, attn_implementation="eager").eval()
    expected = pl.concat(
        [
            measure(
                model,
                torch.from_numpy(ref_ids),
                torch.from_numpy(down_ids),
                protocol=protocol,
                batch_size=n_pairs,
            )
            for protocol in ("embedding", "in_situ")
        ]
    )
    assert pairs.schema == pl.Schema(PAIR_SCHEMA)
    assert pairs.height == 2 * 2 * 5 * n_pairs
    keys = ["protocol", "block", "component", "pair"]
    joined = pairs.join(expected, on=keys, suffix="_direct")
    assert joined.height == pairs.height
    for column in ("ratio", "numerator", "denominator"):
        np.testing.assert_allclose(joined[column], joined[f"{column}_direct"], rtol=1e-5)
    assert (pairs["ratio"] > 0).all()

    direct = summarize(expected)
    assert summary.columns[:2] == ["model", "dataset"]
    assert set(summary["dataset"]) == {"downstream"} and set(summary["model"]) == {"tiny"}
    check = summary.join(direct, on=["protocol", "block", "component"], suffix="_direct")
    assert check.height == direct.height == 2 * 2 * 5
    np.testing.assert_allclose(check["mean"], check["mean_direct"], rtol=1e-5)

    metadata = read_parquet_metadata(tmp_path / "pairs.parquet")
    assert metadata["demo"] is True and metadata["dataset"] == "downstream"
    assert metadata["provenance"]["settings"]["downstream_sequences"] == n_down


def test_random_init_depends_on_init_seed_alone(tmp_path: Path) -> None:
    """weights: random builds GPT2Config(**config) seeded by init_seed, whatever the global RNG."""
    transformers = pytest.importorskip("transformers")
    reference = write(tmp_path / "wiki.txt", REFERENCE_TEXT)
    text = write(tmp_path / "downstream.txt", DOWNSTREAM_TEXT)

    def cli_ratios(seed: int) -> pl.DataFrame:
        torch.manual_seed(1000 + seed)  # the global state must not matter
        argv = [
            "plasticity",
            "--model",
            "tiny",
            "--model-spec",
            json.dumps(random_entry(seed)),
        ]
        argv += ["--reference", str(reference), "--text", str(text), "--sequence-length", "8"]
        argv += ["--n-pairs", "3", "--device", "cpu", "--out", str(tmp_path / "p.parquet")]
        assert main([*argv, "--summary", str(tmp_path / "s.parquet")]) == 0
        return pl.read_parquet(tmp_path / "p.parquet")

    first, again, other = cli_ratios(3), cli_ratios(3), cli_ratios(4)
    assert first.equals(again)
    assert not np.allclose(first["ratio"], other["ratio"])

    torch.manual_seed(3)
    config = transformers.GPT2Config(**TINY_GPT2, attn_implementation="eager")
    model = transformers.GPT2Model(config).eval()
    ref_ids = expected_ids(REFERENCE_TEXT, 256)[:24].reshape(3, 8)
    down_ids = expected_ids(DOWNSTREAM_TEXT, 256)[:24].reshape(3, 8)
    direct = measure(model, torch.from_numpy(ref_ids), torch.from_numpy(down_ids))
    np.testing.assert_allclose(first["ratio"], direct["ratio"], rtol=1e-5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--sequence-length", "16", "--n-pairs", "500"],
            r"wiki\.txt: \d+ reference sequences of 16 tokens, fewer than --n-pairs 500",
        ),
        (["--sequence-length", "65"], "exceeds the 64 positions of model 'tiny'"),
        (
            ["--sequence-length", "0"],
            r"--sequence-length \(datasets\.downstream\.sequence_length\): must be >= 2",
        ),
        (["--protocols", "nope"], r"--protocols \(text_plasticity\.protocols\): 'nope' not "),
    ],
)
def test_cli_names_the_bad_input(
    tmp_path: Path,
    tiny_gpt2_folder: Path,
    caplog: pytest.LogCaptureFixture,
    extra: list[str],
    message: str,
) -> None:
    reference = write(tmp_path / "wiki.txt", REFERENCE_TEXT)
    text = write(tmp_path / "downstream.txt", DOWNSTREAM_TEXT)
    code = run_cli(tmp_path, tiny_gpt2_folder, *extra, reference=reference, text=text)
    assert code == 2
    assert re.search(message, caplog.text), caplog.text
    assert not (tmp_path / "pairs.parquet").exists()


def test_cli_names_a_missing_file(
    tmp_path: Path, tiny_gpt2_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = write(tmp_path / "downstream.txt", DOWNSTREAM_TEXT)
    assert run_cli(tmp_path, tiny_gpt2_folder, reference=tmp_path / "nowiki.txt", text=text) == 2
    assert "--reference: text file not found" in caplog.text and "nowiki.txt" in caplog.text


TINY_DINOV2 = {
    "model_type": "dinov2",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "image_size": 32,
    "patch_size": 8,
}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"source": "random", "config": TINY_GPT2},
            "--model-spec of model 'tiny': 'source' is the old text-model key; write weights: "
            "hub | random | <saved model folder> (with family: transformers)",
        ),
        (
            {"timm_id": "vit_tiny_patch16_224", "weights": "random"},
            "--model-spec of model 'tiny': family 'timm'; text plasticity measures transformers "
            "text models (family: transformers)",
        ),
        (
            {"family": "transformers", "hf_id": "tiny", "weights": "random", "tokenizer": "x"},
            "unknown model keys ['tokenizer'] (family: transformers)",
        ),
        (
            {"family": "transformers", "hf_id": "tiny", "weights": "random", "config": TINY_DINOV2},
            "model 'tiny' (Dinov2Model, hf_dinov2) takes images, not token ids: measure it with "
            "plasticity.models, not text_plasticity.run_models",
        ),
    ],
)
def test_cli_refuses_a_spec_that_is_not_a_text_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, spec: dict, message: str
) -> None:
    """Before any pair is measured."""
    argv = ["plasticity", "--model", "tiny", "--model-spec", json.dumps(spec)]
    argv += ["--reference", str(write(tmp_path / "r.txt", REFERENCE_TEXT))]
    argv += ["--text", str(write(tmp_path / "t.txt", DOWNSTREAM_TEXT))]
    argv += ["--out", str(tmp_path / "p.parquet"), "--summary", str(tmp_path / "s.parquet")]
    assert main(argv) == 2
    assert message in caplog.text, caplog.text
    assert not (tmp_path / "p.parquet").exists()


def dry_run(tmp_path: Path, override: dict, target: str) -> subprocess.CompletedProcess:
    configfile = tmp_path / "text.yaml"
    configfile.write_text(yaml.safe_dump(override))
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(
        [
            str(bindir / "snakemake"),
            "-n",
            "-p",
            target,
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
        timeout=300,
    )


@pytest.mark.slow
def test_dry_run_lists_the_text_jobs_when_enabled(tmp_path: Path) -> None:
    reference = write(tmp_path / "wiki.txt", REFERENCE_TEXT)
    override = {
        "models": {"tiny_gpt2": random_entry()},
        "datasets": {
            name: text_dataset(path, sequence_length=16)
            for name, path in {
                "wiki": reference,
                "news": write(tmp_path / "news.txt", DOWNSTREAM_TEXT),
                "code": write(tmp_path / "code.txt", DOWNSTREAM_TEXT),
            }.items()
        },
        "text_plasticity": {
            "enabled": True,
            "run_models": ["tiny_gpt2"],
            "bounds_models": ["tiny_gpt2"],
            "reference": "wiki",
            "datasets": ["news", "code"],
            "n_pairs": 4,
        },
    }
    result = dry_run(tmp_path, override, "all")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    table = output[output.index("Job stats:") :].split("\n\n")[0]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}
    assert counts["text_plasticity"] == 2
    for dataset in ("news", "code"):
        assert f"plasticity_text/tiny_gpt2/{dataset}_summary.parquet" in output
    # The text bounds of bounds_models, beside both datasets' pairs, on the same sequences.
    assert counts["text_bounds"] == 1
    bounds = next(
        line for line in output.splitlines() if "vitplasticity bounds --model tiny_gpt2" in line
    )
    assert "--tokenizer auto --sequence-length 16 --n-sequences 4 --batch-size 64" in bounds
    assert "bounds_text/tiny_gpt2.parquet" in bounds
    for dataset in ("news", "code"):
        assert f"plasticity_text/tiny_gpt2/{dataset}.parquet" in bounds
    # Each config value reaches the command line (-p prints the shell commands), the model's
    # entry as its spec; the job runs offline.
    assert "--tokenizer auto --sequence-length 16 --n-pairs 4 --batch-size 64" in output
    assert "--demo" in output
    # The schema's defaults filled in, revision (which only the weights stage reads) left out.
    spec = {**random_entry(), "crop_pct": None, "model_class": None, "normalize": "pretrained"}
    command = "HF_HUB_OFFLINE=1 vitplasticity plasticity --model tiny_gpt2 --model-spec"
    assert f"{command} '{json.dumps(spec, sort_keys=True)}'" in output

    # Naming an undefined model, or enabled without a reference dataset: the workflow stops
    # naming the key.
    override["text_plasticity"]["run_models"] = ["gpt3"]
    result = dry_run(tmp_path, override, "text_plasticity_all")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "text_plasticity.run_models: unknown model 'gpt3'" in output
    override["text_plasticity"]["run_models"] = ["tiny_gpt2"]
    del override["text_plasticity"]["reference"]
    result = dry_run(tmp_path, override, "text_plasticity_all")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "text_plasticity.reference: no reference dataset" in output
