"""The weights stage for transformers models: a snapshot fetched once from a hub, recorded file
by file, loaded offline by compute jobs.

The stand-in hub of tests/helpers/fake_hub.py (127.0.0.1, the hub's HTTP layout, its API calls
for snapshot_download) serves tiny random-init models saved with save_pretrained: a GPT2 in
shards with a byte-level tokenizer, a DINOv2 with its image processor, and repos that the
stage must refuse.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import workflow
from tests.helpers.fake_hub import COMMIT, FakeHub, git_blob_id, hub_env
from tests.helpers.workflow import planned_jobs
from vitplasticity.models.weights import RECORD_FILENAME, fetch_snapshot
from vitplasticity.utils.io import read_parquet_metadata

transformers = pytest.importorskip("transformers")

GPT2_REPO = "acme/tiny-gpt2"
DINOV2_REPO = "acme/tiny-dinov2"
TINY_GPT2 = {
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 2,
    "vocab_size": 257,
    "n_positions": 64,
    "bos_token_id": 256,
    "eos_token_id": 256,
}
TINY_DINOV2 = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "image_size": 32,
    "patch_size": 8,
}
# Files of the GPT2 repo that a snapshot must leave on the hub.
NOT_FETCHED = {
    "pytorch_model.bin": b"a pickle",
    "README.md": b"# tiny\n",
    "onnx/model.onnx": b"onnx",
    "generation_config.json": b"{}",
}


def byte_level_vocab() -> dict[str, int]:
    """GPT2's byte-to-unicode alphabet (every byte a token; no merges), independently built."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    chars = [chr(b) for b in printable] + [chr(256 + n) for n in range(len(others))]
    return {char: index for index, char in enumerate(chars)}


def folder_files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def gpt2_repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A tiny GPT2Model in four safetensors shards with their index, and its tokenizer."""
    torch.manual_seed(5)
    folder = tmp_path_factory.mktemp("gpt2")
    model = transformers.GPT2Model(transformers.GPT2Config(**TINY_GPT2))
    model.save_pretrained(folder, max_shard_size="40KB")
    transformers.GPT2Tokenizer(vocab=byte_level_vocab(), merges=[]).save_pretrained(folder)
    files = folder_files(folder)
    assert sum(name.endswith(".safetensors") for name in files) > 1  # really sharded
    return {**files, **NOT_FETCHED}


@pytest.fixture(scope="module")
def dinov2_repo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A tiny Dinov2Model (one safetensors file) and its image processor config."""
    torch.manual_seed(6)
    folder = tmp_path_factory.mktemp("dinov2")
    transformers.Dinov2Model(transformers.Dinov2Config(**TINY_DINOV2)).save_pretrained(folder)
    processor = transformers.BitImageProcessor(
        size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32}
    )
    processor.save_pretrained(folder)
    return folder_files(folder)


@pytest.fixture
def hub(gpt2_repo: dict[str, bytes], dinov2_repo: dict[str, bytes]) -> Iterator[FakeHub]:
    config = gpt2_repo["config.json"]
    index = json.loads(gpt2_repo["model.safetensors.index.json"])
    kept = sorted(set(index["weight_map"].values()))[0]
    server = FakeHub(
        {
            GPT2_REPO: gpt2_repo,
            DINOV2_REPO: dinov2_repo,
            "acme/bin-only": {"config.json": config, "pytorch_model.bin": b"a pickle"},
            "acme/no-config": {"model.safetensors": dinov2_repo["model.safetensors"]},
            "acme/missing-shard": {
                "config.json": config,
                "model.safetensors.index.json": gpt2_repo["model.safetensors.index.json"],
                kept: gpt2_repo[kept],
            },
        },
        gated=("meta/gated",),
    )
    yield server
    server.stop()


def fetched(repo: dict[str, bytes]) -> dict[str, bytes]:
    """The files of ``repo`` a snapshot fetches: config, weights and their index, the image
    processor and tokenizer files (written out here, not from the module's patterns)."""
    return {
        name: data
        for name, data in repo.items()
        if name in ("config.json", "preprocessor_config.json", "model.safetensors.index.json")
        or name.endswith(".safetensors")
        or name.startswith("tokenizer")
    }


def test_snapshot_records_every_file_and_downloads_once(
    hub: FakeHub, gpt2_repo: dict[str, bytes], tmp_path: Path
) -> None:
    cache = tmp_path / "hf-cache"
    record = fetch_snapshot(
        "tiny_gpt2", GPT2_REPO, tmp_path / "a", endpoint=hub.url, cache_dir=cache
    )
    expected = fetched(gpt2_repo)
    assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= set(expected)
    assert folder_files(tmp_path / "a") == {
        **expected,
        RECORD_FILENAME: (tmp_path / "a" / RECORD_FILENAME).read_bytes(),
    }
    assert json.loads((tmp_path / "a" / RECORD_FILENAME).read_text()) == record
    assert (record["repo_id"], record["revision"], record["commit"]) == (GPT2_REPO, "main", COMMIT)
    assert record["files"] == [
        {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, data in sorted(expected.items())
    ]
    api = [r for r in hub.requests if r[1].startswith("/api/models/")]
    assert api == [
        ("GET", f"/api/models/{GPT2_REPO}/revision/main"),
        ("GET", f"/api/models/{GPT2_REPO}/tree/{COMMIT}"),
    ]
    # Weights come from the "CDN" (LFS), the small files from the repo itself; nothing else.
    gets = [path for method, path in hub.file_requests() if method == "GET"]
    lfs = {hashlib.sha256(d).hexdigest() for n, d in expected.items() if n.endswith("tensors")}
    assert sorted(p.removeprefix("/blobs/") for p in gets if p.startswith("/blobs/")) == sorted(lfs)
    assert not [p for p in gets if any(name in p for name in NOT_FETCHED)]

    # The same commit again, into another folder: one API call resolves "main", no download;
    # a pinned commit needs no request at all.
    before = len(hub.requests)
    again = fetch_snapshot(
        "tiny_gpt2", GPT2_REPO, tmp_path / "b", endpoint=hub.url, cache_dir=cache
    )
    assert [r[1] for r in hub.requests[before:]] == [f"/api/models/{GPT2_REPO}/revision/main"]
    before = len(hub.requests)
    pinned = fetch_snapshot(
        "tiny_gpt2", GPT2_REPO, tmp_path / "c", revision=COMMIT, endpoint=hub.url, cache_dir=cache
    )
    assert len(hub.requests) == before
    assert again["files"] == pinned["files"] == record["files"]
    assert pinned["revision"] == COMMIT


def test_a_new_snapshot_leaves_no_stale_shard(
    hub: FakeHub, gpt2_repo: dict[str, bytes], dinov2_repo: dict[str, bytes], tmp_path: Path
) -> None:
    """The folder of a sharded snapshot refetched as another (one file) holds that one's files
    only; a file the stage never fetches (a note of the user's) stays."""
    out = tmp_path / "model"
    fetch_snapshot("m", GPT2_REPO, out, endpoint=hub.url, cache_dir=tmp_path / "cache")
    (out / "notes.txt").write_text("mine")
    record = fetch_snapshot("m", DINOV2_REPO, out, endpoint=hub.url, cache_dir=tmp_path / "cache")
    expected = fetched(dinov2_repo)
    assert set(expected) == {"config.json", "model.safetensors", "preprocessor_config.json"}
    assert set(folder_files(out)) == {*expected, RECORD_FILENAME, "notes.txt"}
    assert [f["path"] for f in record["files"]] == sorted(expected)


@pytest.mark.parametrize(
    ("repo", "revision", "error", "message"),
    [
        ("nobody/missing", "main", ValueError, r"hub repo nobody/missing not found"),
        ("meta/gated", "main", ValueError, r"meta/gated is gated.*HF_TOKEN"),
        (GPT2_REPO, "v9", ValueError, r"models\.m\.revision 'v9': no such revision"),
        ("acme/bin-only", "main", ValueError, r"no safetensors weights at revision 'main'"),
        ("acme/no-config", "main", ValueError, r"no config\.json .*not a transformers model"),
        (
            "acme/missing-shard",
            "main",
            ValueError,
            r"model\.safetensors\.index\.json names shards the repo lacks",
        ),
    ],
)
def test_errors_name_the_model_and_repo(
    hub: FakeHub, tmp_path: Path, repo: str, revision: str, error: type, message: str
) -> None:
    with pytest.raises(error, match=message) as raised:
        fetch_snapshot(
            "m", repo, tmp_path / "out", revision=revision, endpoint=hub.url, cache_dir=tmp_path
        )
    assert "models.m" in str(raised.value)
    assert not (tmp_path / "out" / RECORD_FILENAME).exists()


def test_a_cached_file_that_is_not_the_hubs_is_refused(
    hub: FakeHub, gpt2_repo: dict[str, bytes], tmp_path: Path
) -> None:
    """Each file is checked against the id the hub gave it (an LFS file's sha256, a git
    file's blob id): a cache whose bytes changed since stops the fetch, naming the file."""
    cache = tmp_path / "cache"
    fetch_snapshot("m", GPT2_REPO, tmp_path / "a", endpoint=hub.url, cache_dir=cache)
    blobs = cache / f"models--{GPT2_REPO.replace('/', '--')}" / "blobs"
    config_blob = blobs / git_blob_id(gpt2_repo["config.json"])
    config_blob.write_bytes(gpt2_repo["config.json"] + b" ")
    with pytest.raises(RuntimeError, match=r"config\.json has git blob id .*, the hub says"):
        fetch_snapshot("m", GPT2_REPO, tmp_path / "b", revision=COMMIT, cache_dir=cache)
    config_blob.write_bytes(gpt2_repo["config.json"])
    shard = sorted(blobs.glob("?" * 64))[0]
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
    with pytest.raises(RuntimeError, match=r"has sha256 .*, the hub says " + shard.name):
        fetch_snapshot("m", GPT2_REPO, tmp_path / "c", revision=COMMIT, cache_dir=cache)


def test_the_folder_loads_offline_with_the_served_tensors(
    hub: FakeHub, gpt2_repo: dict[str, bytes], dinov2_repo: dict[str, bytes], tmp_path: Path
) -> None:
    """Fetched with the hub up, then loaded in a process with HF_HUB_OFFLINE=1, an empty
    HF_HOME and the hub stopped: the model holds exactly the served tensors, the tokenizer
    and image processor come from the folder."""
    for repo in (GPT2_REPO, DINOV2_REPO):
        fetch_snapshot("m", repo, tmp_path / repo, endpoint=hub.url, cache_dir=tmp_path / "c")
    hub.stop()
    script = (
        "import json, sys\n"
        "import transformers\n"
        "from safetensors.torch import save_file\n"
        "gpt2, dinov2, out = sys.argv[1:]\n"
        "for name, folder in (('gpt2', gpt2), ('dinov2', dinov2)):\n"
        "    model = transformers.AutoModel.from_pretrained(folder)\n"
        "    state = {k: v.contiguous() for k, v in model.state_dict().items()}\n"
        "    save_file(state, f'{out}/{name}.safetensors')\n"
        "tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)\n"
        "processor = transformers.AutoImageProcessor.from_pretrained(dinov2)\n"
        "print(json.dumps([tokenizer('h\\u00e9')['input_ids'], dict(processor.crop_size)]))\n"
    )
    env = {**hub_env(hub.url, tmp_path / "hf-compute"), "HF_HUB_OFFLINE": "1"}
    folders = [str(tmp_path / GPT2_REPO), str(tmp_path / DINOV2_REPO), str(tmp_path)]
    result = subprocess.run(
        [sys.executable, "-c", script, *folders],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ids, crop = json.loads(result.stdout.strip().splitlines()[-1])
    vocab = byte_level_vocab()
    assert ids == [vocab[chr(ord("h"))], vocab["\u00c3"], vocab["\u00a9"]]  # "h", then é's bytes
    assert crop == {"height": 32, "width": 32}
    # The reference: the served files loaded here, from a folder of their own (transformers
    # renames some checkpoint keys on load, e.g. DINOv2's query/key/value to q/k/v_proj).
    for name, repo in (("gpt2", gpt2_repo), ("dinov2", dinov2_repo)):
        served = tmp_path / "served" / name
        for file, data in fetched(repo).items():
            (served / file).parent.mkdir(parents=True, exist_ok=True)
            (served / file).write_bytes(data)
        reference = transformers.AutoModel.from_pretrained(served).state_dict()
        loaded = load_file(tmp_path / f"{name}.safetensors")
        assert set(loaded) == set(reference), name
        for key, tensor in reference.items():
            assert torch.equal(loaded[key], tensor), (name, key)


def snakemake(
    workdir: Path, env: dict[str, str], edit: str, *args: str
) -> subprocess.CompletedProcess:
    """snakemake on the mini preset with ``edit`` (YAML) merged over it, in ``workdir``."""
    configfile = workdir.parent / "hf.yaml"
    configfile.write_text(edit)
    return workflow.snakemake(workdir, *args, extra_configfiles=(configfile,), env=env)


REFERENCE_TEXT = "".join(f"Document {i}: the quick brown fox, {i * 7} times.\n" for i in range(8))


@pytest.mark.slow
def test_snapshot_weights_stage_end_to_end(
    hub: FakeHub, gpt2_repo: dict[str, bytes], dinov2_repo: dict[str, bytes], tmp_path: Path
) -> None:
    """Through snakemake: one weights_snapshot job per transformers model fetches its snapshot;
    then a text plasticity job (GPT2, its tokenizer from the folder), and the DINOv2's
    plasticity, a finetuning run and recommend (its image processor from the folder) run with
    the hub gone and an empty cache, and record each file's sha256 and the hub commit."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    reference = tmp_path / "wiki.txt"
    reference.write_text(REFERENCE_TEXT)
    edit = f"""
models:
  hub_gpt2: {{family: transformers, hf_id: {GPT2_REPO}}}
  hub_dino: {{family: transformers, hf_id: {DINOV2_REPO}}}
plasticity:
  models: [hub_dino]
  datasets: [demo-stripes]
experiments:
  sgd: {{models: [hub_dino], datasets: [demo-stripes], configurations: [mha]}}
  adam: {{enabled: false}}
recommend: {{enabled: true, models: [hub_dino], datasets: [demo-stripes]}}
datasets:
  wiki: {{source: text_file, path: {reference}, sequence_length: 16, steps: 10, val_every: 5}}
text_plasticity:
  enabled: true
  run_models: [hub_gpt2]
  reference: wiki
  datasets: [wiki]
  n_pairs: 4
"""
    online = hub_env(hub.url, tmp_path / "hf-login")
    result = snakemake(workdir, online, edit, "weights_all")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    folders = {name: workdir / "resources/demo/weights" / name for name in ("hub_gpt2", "hub_dino")}
    for name, repo in (("hub_gpt2", gpt2_repo), ("hub_dino", dinov2_repo)):
        record = json.loads((folders[name] / RECORD_FILENAME).read_text())
        expected = fetched(repo)
        assert record["commit"] == COMMIT
        assert {f["path"]: f["sha256"] for f in record["files"]} == {
            n: hashlib.sha256(d).hexdigest() for n, d in expected.items()
        }
        assert set(folder_files(folders[name])) == {*expected, RECORD_FILENAME}

    # Fetched once: nothing to redo; a new revision fetches again.
    assert planned_jobs(snakemake(workdir, online, edit, "-n", "weights_all")) == {}
    pinned = edit.replace(f"hf_id: {DINOV2_REPO}}}", f"hf_id: {DINOV2_REPO}, revision: {COMMIT}}}")
    assert (
        planned_jobs(snakemake(workdir, online, pinned, "-n", "weights_all")).get(
            "weights_snapshot"
        )
        == 1
    )

    # The compute jobs: hub stopped, a fresh HF_HOME (no cache to fall back on).
    hub.stop()
    offline = hub_env(hub.url, tmp_path / "hf-compute")
    targets = [
        "results/demo/plasticity_text/hub_gpt2/wiki.parquet",
        "results/demo/plasticity/hub_dino/demo-stripes.parquet",
    ]
    run = "results/demo/finetune/sgd/hub_dino/demo-stripes/mha/lr0.05_seed0"
    recommendation = "results/demo/recommend/hub_dino/demo-stripes"
    result = snakemake(
        workdir, offline, edit, *targets, f"{run}/summary.json", f"{recommendation}.json"
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    # The DINOv2 finetuned (configuration mha: its attention, the new head and final norm)
    # and ranked, from the same offline snapshot.
    summary = json.loads((workdir / run / "summary.json").read_text())
    assert summary["status"] == "completed"
    weights = summary["weights"]
    assert weights["source"] == "folder" and weights["hub"]["commit"] == COMMIT
    export = json.loads((workdir / f"{recommendation}.json").read_text())
    assert export["model"]["name"] == "hub_dino"
    assert export["model"]["class"].endswith("Dinov2ForImageClassification")
    for target, name in zip(targets, ("hub_gpt2", "hub_dino"), strict=True):
        found = read_parquet_metadata(workdir / target)["provenance"]
        record = json.loads((folders[name] / RECORD_FILENAME).read_text())
        assert found["weights"]["source"] == "folder"
        assert [(f["path"], f["sha256"]) for f in found["weights"]["files"]] == [
            (f["path"], f["sha256"]) for f in record["files"]
        ]
        assert found["weights"]["hub"]["commit"] == COMMIT
        spec = found["settings"]["model_spec"]
        assert spec["weights"] == f"resources/demo/weights/{name}" and "revision" not in spec
    text_settings = read_parquet_metadata(workdir / targets[0])["provenance"]["settings"]
    assert text_settings["tokenizer"] == "resources/demo/weights/hub_gpt2"
