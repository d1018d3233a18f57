"""The streamed measurement (vitplasticity.plasticity.streamed): a model measured block by
block from its safetensors checkpoint gives the whole-model measurement's numbers exactly, in
float64, in both protocols, for every kind of family (a timm ViT, a timm Eva with rotary
tables, a transformers vision tower, decoder LMs, a mixture of experts, an encoder), and a
checkpoint it cannot read as it is named is refused by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.streamed import saved_checkpoint, tiny_model
from tests.helpers.tiny_models import perturbed
from vitplasticity.models.build import build_model
from vitplasticity.models.checkpoint_tensors import NotStreamable
from vitplasticity.models.stream_decision import verdict
from vitplasticity.models.streamed import open_streamed
from vitplasticity.plasticity.measure import measure_protocols

CASES = {
    "vit_tiny_patch16_224": "timm ViT",
    "vit_small_patch16_dinov3": "timm Eva: rotary tables as buffers, layer scales",
    "hf_vit": "a transformers vision tower",
    "gpt2_tiny": "a decoder with Conv1D linears and a causal-mask buffer",
    "llama_tiny": "a decoder with RMSNorm, rotary positions and grouped keys",
    "mixtral_tiny": "a mixture of experts: fused 3-D experts read through views",
    "bert_tiny": "an encoder with a pooler",
}
PROTOCOLS = ("embedding", "in_situ")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_streamed_measurement_is_the_whole_models_exactly(tmp_path: Path, case: str) -> None:
    entry = saved_checkpoint(tmp_path, case)
    inputs = tiny_model(case).inputs(6)
    reference, downstream = inputs[:4], inputs[4:]  # the downstream set cycles
    counts = {"protocols": PROTOCOLS, "batch_size": 3, "n_pairs": 4}

    whole = build_model(entry).eval().double()
    expected = measure_protocols(whole, reference, downstream, **counts)

    streamed = open_streamed(build_spec(entry)).to(torch.device("cpu"), torch.float64)
    done: list[int] = []
    found = measure_protocols(streamed, reference, downstream, progress=done.append, **counts)
    assert found.equals(expected), CASES[case]
    assert done[-1] == 4 and done == sorted(done)
    # Nothing of a block stays loaded after it is measured.
    assert all(p.device.type == "meta" for b in streamed.blocks for p in b.parameters())


def build_spec(entry: dict):
    from vitplasticity.models.spec import ModelSpec

    return ModelSpec.from_config(entry)


def test_a_checkpoint_named_otherwise_is_refused_naming_the_tensors(tmp_path: Path) -> None:
    """Original (non-timm) names need the family's renames, which only the whole-model
    loader applies: the streamed path names what it cannot find and says what to do."""
    entry = saved_checkpoint(tmp_path, "vit_tiny_patch16_224")
    from safetensors.torch import load_file, save_file

    state = load_file(entry["weights"])
    state["blocks.0.attn.qkv.w"] = state.pop("blocks.0.attn.qkv.weight")
    save_file(state, entry["weights"])
    with pytest.raises(NotStreamable) as error:
        open_streamed(build_spec(entry))
    message = str(error.value)
    assert "1 missing tensors (blocks.0.attn.qkv.weight)" in message
    assert "1 unexpected tensors (blocks.0.attn.qkv.w)" in message
    assert "stream: never" in message


@pytest.mark.parametrize(
    ("weights", "message"),
    [("random", "weights 'random' are not a local safetensors checkpoint"), ("hub", "'hub'")],
)
def test_weights_not_in_a_local_safetensors_file_are_refused(weights: str, message: str) -> None:
    entry = {"timm_id": "vit_tiny_patch16_224", "weights": weights}
    with pytest.raises(NotStreamable, match=message):
        open_streamed(build_spec(entry))


def test_auto_streams_a_checkpoint_larger_than_half_the_free_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision's arithmetic: the checkpoint's tensors in the measurement's dtype against
    half the device's free memory (the memory query replaced by a fixed figure here; the real
    query is tested under a cgroup limit below)."""
    from vitplasticity.models import checkpoint_tensors
    from vitplasticity.models import stream_decision as module

    entry = saved_checkpoint(tmp_path, "vit_tiny_patch16_224")
    spec = build_spec(entry)
    size = checkpoint_tensors.checkpoint_bytes(
        checkpoint_tensors.checkpoint_files(spec), torch.float64
    )
    cpu = torch.device("cpu")
    monkeypatch.setattr(module, "free_memory", lambda device: 2 * size - 1)
    stream, why = module.stream_decision("auto", spec, cpu, torch.float64)
    assert stream and why.startswith("its weights take")
    assert verdict(stream, why).startswith("streamed block by block (its weights take")
    monkeypatch.setattr(module, "free_memory", lambda device: 2 * size)
    stream, why = module.stream_decision("auto", spec, cpu, torch.float64)
    assert not stream and why.startswith("its weights take")
    # float32 halves the bytes: the same memory now holds it whole.
    monkeypatch.setattr(module, "free_memory", lambda device: 2 * size - 1)
    assert not module.stream_decision("auto", spec, cpu, torch.float32)[0]
    random = build_spec({"timm_id": "vit_tiny_patch16_224", "weights": "random"})
    assert module.stream_decision("auto", random, cpu, torch.float32) == (
        False,
        "model 'vit_tiny_patch16_224': weights 'random' are not a local safetensors "
        "checkpoint to stream from; measure it whole (stream: never)",
    )
    assert module.stream_decision("never", spec, cpu, torch.float64) == (False, "stream: never")
    assert module.stream_decision("always", random, cpu, torch.float64) == (True, "stream: always")


def test_on_a_gpu_auto_also_streams_what_the_host_could_not_build_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU measurement builds the whole model on the host first (in float32), so the host's
    free memory decides too, and the log names the memory that decided (the memory queries
    replaced by fixed figures: the host's and the GPU's)."""
    from vitplasticity.models import checkpoint_tensors
    from vitplasticity.models import stream_decision as module

    spec = build_spec(saved_checkpoint(tmp_path, "llama_tiny"))
    files = checkpoint_tensors.checkpoint_files(spec)
    f32 = checkpoint_tensors.checkpoint_bytes(files, torch.float32)
    bf16 = checkpoint_tensors.checkpoint_bytes(files, torch.bfloat16)
    gpu = torch.device("cuda")

    def free(host: int, card: int) -> None:
        monkeypatch.setattr(
            module, "free_memory", lambda device: card if device.type == "cuda" else host
        )

    free(host=2 * f32, card=2 * bf16)  # both hold it: float32 on the host, bf16 on the GPU
    stream, why = module.stream_decision("auto", spec, gpu, torch.bfloat16)
    assert not stream and why.startswith("its weights take")
    assert "in float32, at most half of" in why and "free on the host and" in why
    assert why.endswith(f"in bfloat16, at most half of {bf16 / 2**30:.2f} GiB free on cuda")
    free(host=2 * f32 - 1, card=10**15)  # a GPU with room, a host without
    stream, why = module.stream_decision("auto", spec, gpu, torch.bfloat16)
    assert stream and why.endswith(
        f"in float32, more than half of {(2 * f32 - 1) / 2**30:.2f} GiB free on the host"
    )
    free(host=10**15, card=2 * bf16 - 1)  # the other way round
    stream, why = module.stream_decision("auto", spec, gpu, torch.bfloat16)
    assert stream and why.endswith("free on cuda") and "in bfloat16" in why
    # On the CPU the host is the device: a bfloat16 measurement builds in float32 there.
    free(host=2 * f32 - 1, card=0)
    assert module.stream_decision("auto", spec, torch.device("cpu"), torch.bfloat16)[0]


CGROUP = Path("/sys/fs/cgroup/memory")


@pytest.mark.skipif(
    not (CGROUP / "cgroup.procs").is_file() or not os.access(CGROUP, os.W_OK),
    reason="needs a writable cgroup v1 memory controller (root in a container that has one)",
)
def test_the_free_memory_of_a_process_is_capped_by_its_cgroup_limit(tmp_path: Path) -> None:
    """A process in a cgroup of a 3 GiB limit (a SLURM job's, say) sees at most that limit
    less its usage as free, whatever the machine has; the page cache of a file it reads (its
    inputs: 1 GiB here), which its cgroup is charged for but the kernel reclaims, is not
    counted as used."""
    group = CGROUP / f"vitplasticity_test_{os.getpid()}"
    group.mkdir()
    data = tmp_path / "inputs.bin"
    with data.open("wb") as file:
        file.truncate(2**30)  # a sparse file: reading it fills the page cache with zeros
    try:
        (group / "memory.limit_in_bytes").write_text(str(3 * 2**30))
        code = (
            "import os, sys, torch\n"
            f"open('{group}/cgroup.procs', 'w').write(str(os.getpid()))\n"
            "from vitplasticity.models.stream_decision import free_memory\n"
            "before = free_memory(torch.device('cpu'))\n"
            f"with open('{data}', 'rb') as file:\n"
            "    while file.read(2**24): pass\n"
            "print(before, free_memory(torch.device('cpu')))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        before, after = map(int, result.stdout.split()[-2:])
        assert 0 < before <= 3 * 2**30
        # Without the page cache's reclaimable part the reading would take 1 GiB off.
        assert after > before - 2**28, (before, after)
    finally:
        group.rmdir()


def test_the_text_stage_streams_as_asked_and_records_it(tmp_path: Path) -> None:
    """The text plasticity stage with ``stream: always`` measures the saved Llama block by
    block: the same pairs as ``stream: never``, and its provenance says which it was."""
    from vitplasticity.plasticity.settings import TextPlasticitySettings
    from vitplasticity.plasticity.text import measure_text

    entry = saved_checkpoint(tmp_path, "llama_tiny")
    lines = "".join(f"line {i} of some plain text, {i * 3} words\n" for i in range(12))
    (tmp_path / "reference.txt").write_text(lines)
    (tmp_path / "notes.txt").write_text(lines.upper())
    found = {}
    for mode in ("always", "never"):
        settings = TextPlasticitySettings(
            tokenizer="bytes", sequence_length=8, n_pairs=4, batch_size=2,
            protocols=PROTOCOLS, device="cpu", dtype="float64", stream=mode,
        )  # fmt: skip
        found[mode] = measure_text(
            "llama", entry, tmp_path / "reference.txt", tmp_path / "notes.txt", settings
        )
    assert found["always"].pairs.equals(found["never"].pairs)
    recorded = {mode: found[mode].metadata["provenance"]["settings"] for mode in found}
    assert (recorded["always"]["streamed"], recorded["never"]["streamed"]) == (True, False)
    assert recorded["always"]["stream"] == "always"


def test_a_causal_lms_untied_head_is_never_read(tmp_path: Path) -> None:
    """A LlamaForCausalLM checkpoint (its lm_head untied: as large as the embedding) streams
    with its head left on the meta device, and measures as the whole model does."""
    import transformers

    from tests.helpers.tiny_models import HF_TEXT_TINY_CONFIG

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**HF_TEXT_TINY_CONFIG, tie_word_embeddings=False)
    perturbed(transformers.LlamaForCausalLM(config)).float().save_pretrained(tmp_path / "lm")
    entry = {"family": "transformers", "hf_id": "tiny/lm", "weights": str(tmp_path / "lm")}
    ids = torch.randint(0, 64, (6, 8), generator=torch.Generator().manual_seed(0))
    counts = {"protocols": PROTOCOLS, "batch_size": 2, "n_pairs": 3}
    expected = measure_protocols(build_model(entry).eval().double(), ids[:3], ids[3:], **counts)
    streamed = open_streamed(build_spec(entry)).to(torch.device("cpu"), torch.float64)
    assert measure_protocols(streamed, ids[:3], ids[3:], **counts).equals(expected)
    assert streamed.model.lm_head.weight.device.type == "meta"
    assert streamed.model.model.embed_tokens.weight.device.type == "cpu"
