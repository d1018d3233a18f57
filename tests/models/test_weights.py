"""The weights stage: fetched once from a hub, loaded offline by compute jobs, in provenance.

A local HTTP server (tests/helpers/fake_hub.py) stands in for the hub. It serves a tiny
random-init ViT's state dict under the repo timm names for
``vit_tiny_patch16_224.augreg_in21k_ft_in1k`` (tests/models/test_hf_weights.py serves transformers
snapshots with it).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import workflow
from tests.helpers.fake_hub import COMMIT, FakeHub, hub_env
from tests.helpers.workflow import planned_jobs
from vitplasticity.models.build import build_model
from vitplasticity.models.hub_file import hub_file, safetensors_name
from vitplasticity.models.spec import ModelSpec
from vitplasticity.models.weights import RECORD_FILENAME, fetch
from vitplasticity.provenance import provenance, weights_record
from vitplasticity.utils.io import read_parquet_metadata

TIMM_ID = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
REPO_ID = f"timm/{TIMM_ID}"
KWARGS = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}


@pytest.fixture(scope="module")
def checkpoint() -> tuple[bytes, dict[str, torch.Tensor]]:
    """A tiny ViT's state dict (1000-class head, like the in1k checkpoint) as safetensors bytes."""
    import timm
    from safetensors.torch import save

    torch.manual_seed(3)
    model = timm.create_model(TIMM_ID, pretrained=False, num_classes=1000, **KWARGS)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    return save(state), state


@pytest.fixture(scope="module")
def transformers_checkpoint() -> bytes:
    """A tiny transformers ViTModel's state dict: another model's names, as safetensors bytes."""
    from safetensors.torch import save
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8
    )
    return save({k: v.contiguous() for k, v in ViTModel(config).state_dict().items()})


@pytest.fixture
def hub(checkpoint: tuple[bytes, dict], transformers_checkpoint: bytes) -> Iterator[FakeHub]:
    data, _ = checkpoint
    server = FakeHub(
        {
            REPO_ID: {"model.safetensors": data},
            "acme/bin-only": {"pytorch_model.bin": b"x"},
            "acme/transformers-vit": {"model.safetensors": transformers_checkpoint},
        },
        gated=("meta/gated",),
    )
    yield server
    server.stop()


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_hub_file_is_what_timm_would_load() -> None:
    assert hub_file(TIMM_ID) == hub_file("vit_tiny_patch16_224")  # the default tag
    assert hub_file(TIMM_ID).repo_id == REPO_ID
    assert hub_file(TIMM_ID).filename == "model.safetensors"
    assert hub_file(TIMM_ID, revision="v2").revision == "v2"
    pinned = hub_file(TIMM_ID, kwargs={"pretrained_cfg_overlay": {"hf_hub_id": "me/mine@v1"}})
    assert (pinned.repo_id, pinned.revision) == ("me/mine", "v1")
    assert safetensors_name("open_clip_pytorch_model.bin") == "open_clip_model.safetensors"
    assert safetensors_name("weights.npz") is None


def test_fetch_downloads_once_and_records_sha256(
    hub: FakeHub, checkpoint: tuple[bytes, dict], tmp_path: Path
) -> None:
    data, _ = checkpoint
    cache = tmp_path / "hf-cache"
    record = fetch("hub_vit", TIMM_ID, tmp_path / "a", endpoint=hub.url, cache_dir=cache)
    local = tmp_path / "a/model.safetensors"
    assert local.read_bytes() == data
    assert record["sha256"] == sha256_of(local) == hashlib.sha256(data).hexdigest()
    assert (record["repo_id"], record["filename"]) == (REPO_ID, "model.safetensors")
    assert (record["revision"], record["commit"], record["size"]) == ("main", COMMIT, len(data))
    assert record["url"] == f"{hub.url}/{REPO_ID}/resolve/{COMMIT}/model.safetensors"
    assert json.loads((tmp_path / "a" / RECORD_FILENAME).read_text()) == record
    assert hub.file_requests()[0] == ("HEAD", f"/{REPO_ID}/resolve/main/model.safetensors")
    assert len(hub.downloads()) == 1
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")], "temp files"

    # A second model folder from the same cache: one HEAD to resolve "main", no download.
    fetch("hub_vit", TIMM_ID, tmp_path / "b", endpoint=hub.url, cache_dir=cache)
    assert len(hub.file_requests()) == 3 and len(hub.downloads()) == 1
    # A pinned commit already in the cache needs no request at all.
    pinned = fetch(
        "hub_vit", TIMM_ID, tmp_path / "c", revision=COMMIT, endpoint=hub.url, cache_dir=cache
    )
    assert len(hub.file_requests()) == 3 and pinned["sha256"] == record["sha256"]


def test_a_cached_checkpoint_that_is_not_the_hubs_is_refused(
    hub: FakeHub, checkpoint: tuple[bytes, dict], tmp_path: Path
) -> None:
    """The cache names an LFS blob by its sha256: a blob whose bytes changed since stops the
    fetch, naming the model and the cached file, and leaves no model.safetensors behind."""
    data, _ = checkpoint
    cache = tmp_path / "cache"
    fetch("hub_vit", TIMM_ID, tmp_path / "a", endpoint=hub.url, cache_dir=cache)
    blob = (
        cache / f"models--{REPO_ID.replace('/', '--')}" / "blobs" / hashlib.sha256(data).hexdigest()
    )
    blob.write_bytes(data[:-1] + b"\0")
    with pytest.raises(
        RuntimeError, match=rf"models\.hub_vit .*has sha256 .*the hub says {blob.name}"
    ):
        fetch("hub_vit", TIMM_ID, tmp_path / "b", revision=COMMIT, cache_dir=cache)
    assert not (tmp_path / "b" / "model.safetensors").exists()
    assert not (tmp_path / "b" / RECORD_FILENAME).exists()


def test_the_local_file_loads_the_served_tensors_and_is_in_provenance(
    hub: FakeHub, checkpoint: tuple[bytes, dict], tmp_path: Path
) -> None:
    _, state = checkpoint
    record = fetch("hub_vit", TIMM_ID, tmp_path, endpoint=hub.url, cache_dir=tmp_path / "cache")
    local = tmp_path / "model.safetensors"
    spec = {"timm_id": TIMM_ID, "weights": str(local), "kwargs": KWARGS}
    model = build_model(ModelSpec.from_config(spec), num_classes=0)
    loaded = model.state_dict()
    assert set(loaded) == {k for k in state if not k.startswith("head.")}
    for name, tensor in loaded.items():
        assert torch.equal(tensor, state[name]), name

    weights = provenance({"model_spec": spec})["weights"]
    assert weights["sha256"] == record["sha256"] == sha256_of(local)
    assert weights["size"] == local.stat().st_size
    assert weights["hub"]["commit"] == COMMIT and weights["hub"]["repo_id"] == REPO_ID
    # A file replaced after the fetch keeps its own sha256 and loses the stale hub record.
    other = tmp_path / "other" / "model.safetensors"
    other.parent.mkdir()
    other.write_bytes(local.read_bytes() + b" ")
    (other.parent / RECORD_FILENAME).write_text(json.dumps(record))
    replaced = weights_record({"weights": str(other)})
    assert replaced["sha256"] == sha256_of(other) != record["sha256"] and "hub" not in replaced
    assert weights_record({"weights": "random", "init_seed": 4}) == {
        "source": "random",
        "init_seed": 4,
    }
    assert weights_record({"hf_id": "gpt2"}) is None  # a spec without weights
    transformers_hub = {"family": "transformers", "hf_id": "gpt2", "weights": "hub"}
    assert weights_record(transformers_hub) == {
        "source": "hub",
        "repo_id": "gpt2",
        "revision": "main",
        "sha256": None,
    }


@pytest.mark.parametrize(
    ("timm_id", "revision", "overlay", "message"),
    [
        (TIMM_ID, "main", {"hf_hub_id": "nobody/missing"}, r"hub repo nobody/missing not found"),
        (TIMM_ID, "main", {"hf_hub_id": "meta/gated"}, r"meta/gated is gated.*HF_TOKEN"),
        (TIMM_ID, "v9", None, r"models\.hub_vit\.revision 'v9': no such revision"),
        (
            TIMM_ID,
            "main",
            {"hf_hub_id": "acme/bin-only"},
            r"acme/bin-only has no model\.safetensors",
        ),
        ("vit_huge_patch14_224.untrained", "main", None, r"no hub weights.*no hf_hub_id"),
        ("vit_nonesuch_patch16", "main", None, r"timm has no architecture 'vit_nonesuch_patch16'"),
    ],
)
def test_errors_name_the_model_and_repo(
    hub: FakeHub,
    tmp_path: Path,
    timm_id: str,
    revision: str,
    overlay: dict | None,
    message: str,
) -> None:
    kwargs = {"pretrained_cfg_overlay": overlay} if overlay else {}
    with pytest.raises(ValueError, match=message) as error:
        fetch(
            "hub_vit",
            timm_id,
            tmp_path / "out",
            revision=revision,
            kwargs=kwargs,
            endpoint=hub.url,
            cache_dir=tmp_path / "cache",
        )
    assert "models.hub_vit" in str(error.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_hub_that_is_down_is_named(tmp_path: Path) -> None:
    """Nothing listens on the port: huggingface_hub retries (about 20 s), then we say where."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.raises(RuntimeError, match=rf"cannot reach the hub at {endpoint}.*refused"):
        fetch("hub_vit", TIMM_ID, tmp_path / "out", endpoint=endpoint, cache_dir=tmp_path / "c")
    assert not (tmp_path / "out").exists()


def test_build_model_loads_the_hub_revision_strictly(
    hub: FakeHub, checkpoint: tuple[bytes, dict], tmp_path: Path
) -> None:
    """``weights: hub`` with a revision: that revision's file is fetched (through HF_ENDPOINT)
    and loaded, the provenance finds it in the huggingface_hub cache; a hub file that is not
    the model's is an error naming the cached file and its keys, as a local file is."""
    data, state = checkpoint
    script = (
        "import json, sys\n"
        "from safetensors.torch import save_file\n"
        "from vitplasticity.models.build import build_model\n"
        "from vitplasticity.models.spec import ModelSpec\n"
        "from vitplasticity.provenance import weights_record\n"
        "spec, other = json.loads(sys.argv[1]), json.loads(sys.argv[3])\n"
        "model = build_model(ModelSpec.from_config(spec), num_classes=0)\n"
        "save_file({k: v.contiguous() for k, v in model.state_dict().items()}, sys.argv[2])\n"
        "print(json.dumps(weights_record(spec)))\n"
        "try:\n"
        "    build_model(ModelSpec.from_config(other), num_classes=3)\n"
        "except ValueError as error:\n"
        "    print(json.dumps(str(error)))\n"
    )
    spec = {"timm_id": TIMM_ID, "weights": "hub", "revision": COMMIT, "kwargs": KWARGS}
    overlay = {"hf_hub_id": "acme/transformers-vit"}
    other = {**spec, "kwargs": {**KWARGS, "pretrained_cfg_overlay": overlay}}
    out = tmp_path / "loaded.safetensors"
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(spec), str(out), json.dumps(other)],
        env=hub_env(hub.url, tmp_path / "hf"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert hub.file_requests()[0][1] == f"/{REPO_ID}/resolve/{COMMIT}/model.safetensors"
    loaded = load_file(out)
    assert set(loaded) == {k for k in state if not k.startswith("head.")}
    for name, tensor in loaded.items():
        assert torch.equal(tensor, state[name]), name
    printed = result.stdout.strip().splitlines()
    record = json.loads(printed[-2])
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["commit"] == COMMIT
    error = json.loads(printed[-1])
    cached = tmp_path / f"hf/hub/models--acme--transformers-vit/snapshots/{COMMIT}"
    assert error.startswith(f"{cached}/model.safetensors does not match {TIMM_ID}: "), error
    assert "30 missing keys (cls_token, pos_embed, " in error, error
    assert "unexpected keys (embeddings.cls_token, " in error, error


HUB_PRESET = f"""
models:
  hub_vit:
    family: timm
    timm_id: {TIMM_ID}
    weights: hub
    normalize: pretrained
    kwargs: {json.dumps(KWARGS)}
plasticity:
  models: [hub_vit]
  datasets: [demo-stripes]
experiments:
  sgd:
    models: [hub_vit]
    datasets: [demo-stripes]
    configurations: [mha]
"""


def snakemake(
    workdir: Path, env: dict[str, str], *args: str, edits: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """snakemake on the mini preset with a hub model (hub_vit), plus config ``edits``."""
    configs = []
    for index, text in enumerate((HUB_PRESET, *edits)):
        configs.append(workdir.parent / f"config{index}.yaml")
        configs[-1].write_text(text)
    return workflow.snakemake(workdir, *args, extra_configfiles=tuple(configs), env=env)


@pytest.mark.slow
def test_weights_stage_end_to_end(
    hub: FakeHub, checkpoint: tuple[bytes, dict], tmp_path: Path
) -> None:
    """Through snakemake: the weights job fetches once; plasticity, bounds and finetune jobs
    then run with the hub gone and an empty cache, and record the file's sha256."""
    data, _ = checkpoint
    workdir = tmp_path / "work"
    online = hub_env(hub.url, tmp_path / "hf-login")
    # A plasticity job's memory comes from its checkpoint (vitplasticity.workflow.memory): until
    # the weights job has fetched it, Snakemake's <TBD>, evaluated again when the job is ready.
    plasticity = "results/demo/plasticity/hub_vit/demo-stripes.parquet"
    dry = snakemake(workdir, online, "-n", plasticity)
    assert dry.returncode == 0 and "mem_mb=<TBD>" in dry.stdout + dry.stderr, dry.stderr[-3000:]
    result = snakemake(workdir, online, "weights_all")
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    folder = workdir / "resources/demo/weights/hub_vit"
    record = json.loads((folder / RECORD_FILENAME).read_text())
    sha256 = hashlib.sha256(data).hexdigest()
    assert record["sha256"] == sha256_of(folder / "model.safetensors") == sha256
    assert record["commit"] == COMMIT
    assert len(hub.downloads()) == 1 and len(hub.file_requests()) == 2

    # Fetched once: nothing to redo, and editing a model key that does not decide the file
    # (normalize) plans no fetch, while a revision does.
    assert planned_jobs(snakemake(workdir, online, "-n", "weights_all")) == {}
    normalize = "models:\n  hub_vit:\n    normalize: imagenet\n"
    assert planned_jobs(snakemake(workdir, online, "-n", "weights_all", edits=(normalize,))) == {}
    revision = f"models:\n  hub_vit:\n    revision: {COMMIT}\n"
    jobs = planned_jobs(snakemake(workdir, online, "-n", "weights_all", edits=(revision,)))
    assert jobs.get("weights") == 1
    assert len(hub.file_requests()) == 2

    # The compute jobs: hub stopped, a fresh HF_HOME (no cache to fall back on).
    hub.stop()
    offline = hub_env(hub.url, tmp_path / "hf-compute")
    run = "results/demo/finetune/sgd/hub_vit/demo-stripes/mha/lr0.05_seed0"
    targets = [
        plasticity,
        "results/demo/bounds/hub_vit.parquet",
        f"{run}/summary.json",
    ]
    result = snakemake(workdir, offline, *targets)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    asked = r"rule plasticity:\n(?:\s+.*\n)*?\s+resources: .*\bmem_mb=\d+,"
    assert re.search(asked, result.stdout + result.stderr), result.stdout[-3000:]
    assert "weights" not in planned_jobs(snakemake(workdir, offline, "-n", *targets))
    local = "resources/demo/weights/hub_vit/model.safetensors"
    found = [
        read_parquet_metadata(workdir / targets[0])["provenance"],
        read_parquet_metadata(workdir / targets[1])["provenance"],
        json.loads((workdir / targets[2]).read_text()),
    ]
    for record_of_result in found:
        assert record_of_result["weights"]["sha256"] == sha256
        assert record_of_result["weights"]["hub"]["commit"] == COMMIT
        spec = record_of_result["settings"]["model_spec"]
        assert spec["weights"] == local and "revision" not in spec

    # Packed finetuning runs get the same local file, offline.
    pack = "finetune:\n  pack_runs: true\n"
    dry = snakemake(
        workdir, offline, "-n", "-p", "--forcerun", f"{run}/summary.json", edits=(pack,)
    )
    assert dry.returncode == 0, (dry.stdout + dry.stderr)[-4000:]
    printed = dry.stdout + dry.stderr
    assert "HF_HUB_OFFLINE=1 vitplasticity finetune" in printed
    assert "finetune_pack" in printed
    assert local in printed and "weights" not in planned_jobs(dry)
