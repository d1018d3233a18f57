"""A model family is one file: a toy family, declared and registered from this module alone,
runs through plasticity, finetuning and recommend.

The family is a hand-written pre-norm ViT (:class:`ToyViT`), its architecture
(:class:`ToyArchitecture`: where the five components are, what the embedding and head are) and
its ``models:`` entry (:class:`ToySpec`, ``family: toy``, naming the functions that build and preprocess
it). The :func:`toy_family` fixture registers both through the public registration
functions and removes them afterwards; no other file knows the family.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.images import write_reference
from tests.helpers.tiny_finetune import cli_args
from vitplasticity.cli import main
from vitplasticity.data.preprocessing import IMAGENET_MEAN, IMAGENET_STD, Preprocessing
from vitplasticity.models.architectures import (
    ARCHITECTURES,
    Architecture,
    Embedded,
    Owned,
    architecture_for,
    parameter_map,
    register_architecture,
    unregister_architecture,
)
from vitplasticity.models.build import build_model, preprocessing
from vitplasticity.models.spec import FAMILIES, ModelSpec, register_family, unregister_family

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# --- the model: a tiny pre-norm ViT written by hand ----------------------------------------------


class ToyAttention(nn.Module):
    """Multi-head softmax attention with separate q, k, v and output projections."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, n, width = x.shape
        q, k, v = (  # (B, h, n, d_h)
            proj(x).view(batch, n, self.heads, width // self.heads).transpose(1, 2)
            for proj in (self.q, self.k, self.v)
        )
        weights = torch.softmax(q @ k.transpose(-2, -1) / (width // self.heads) ** 0.5, dim=-1)
        return self.o((weights @ v).transpose(1, 2).reshape(batch, n, width))


class ToyBlock(nn.Module):
    """``x + attn(norm1(x))`` then ``x + fc2(gelu(fc1(norm2(x))))``."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = ToyAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ToyViT(nn.Module):
    """8 px patches and a cls token, ``depth`` blocks, a final norm and a linear head on the
    cls token (none with 0 classes: the features)."""

    def __init__(self, width: int, depth: int, heads: int, image_size: int) -> None:
        super().__init__()
        self.image_size = image_size
        self.patch = nn.Conv2d(3, width, kernel_size=8, stride=8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, width) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 1 + (image_size // 8) ** 2, width) * 0.02)
        self.blocks = nn.ModuleList(ToyBlock(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head: nn.Module = nn.Identity()

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        patches = self.patch(images).flatten(2).transpose(1, 2)  # (B, n, d)
        cls = self.cls_token.expand(len(images), -1, -1)
        return torch.cat([cls, patches], dim=1) + self.pos  # (B, 1 + n, d)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(images)
        for block in self.blocks:
            tokens = block(tokens)
        return self.head(self.norm(tokens)[:, 0])


# --- the family: its architecture and its config entry -------------------------------------------


class ToyArchitecture(Architecture):
    """Where :class:`ToyViT`'s components, embedding and head are."""

    name = "toy_vit"
    title = "toy ViT (tests/models/test_toy_family.py)"

    def matches(self, model: nn.Module) -> bool:
        return isinstance(model, ToyViT)

    def block_list(self, model: nn.Module) -> Sequence[nn.Module]:
        return model.blocks

    def components(self, block: nn.Module, fc1: str = "stage") -> dict[str, tuple[nn.Module, ...]]:
        return {
            "ln1": (block.norm1,),
            "mha": (block.attn,),
            "ln2": (block.norm2,),
            "fc1": (block.fc1,),
            "fc2": (block.fc2,),
        }

    def embedding(self, model: nn.Module) -> Owned:
        return Owned(modules=(model.patch,), parameters=(model.cls_token, model.pos))

    def head(self, model: nn.Module) -> Owned:
        return Owned(modules=(model.norm, model.head))

    def classifier(self, model: nn.Module) -> nn.Module:
        return model.head

    def embed(self, model: nn.Module, inputs: torch.Tensor) -> Embedded:
        return Embedded(model.embed(inputs))

    def mlp(
        self,
        block: nn.Module,
        fc1: tuple[nn.Module, ...],
        fc2: tuple[nn.Module, ...],
        x: torch.Tensor,
    ) -> torch.Tensor:
        return fc2[0](F.gelu(fc1[0](x)))


TOY_KEYS = frozenset({"family", "toy_id", "width", "depth", "heads", "image_size", "init_seed"})


@dataclasses.dataclass(frozen=True)
class ToySpec(ModelSpec):
    """A ``family: toy`` entry: the toy ViT's sizes and the seed of its random init."""

    id_key = "toy_id"
    builder = f"{__name__}:build_toy"
    preprocessor = f"{__name__}:toy_preprocessing"

    toy_id: str = "toy"
    family: str = "toy"
    width: int = 16
    depth: int = 2
    heads: int = 2
    image_size: int = 32
    init_seed: int = 0

    @classmethod
    def parse(cls, entry: dict[str, Any]) -> ToySpec:
        unknown = set(entry) - TOY_KEYS
        if unknown:
            raise ValueError(f"unknown model keys {sorted(unknown)} (family: toy)")
        return cls(**entry)


def build_toy(spec: ToySpec, num_classes: int) -> ToyViT:
    """The family's builder: the backbone from ``init_seed`` alone, the head from the caller's
    RNG (as timm's path)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        model = ToyViT(spec.width, spec.depth, spec.heads, spec.image_size)
    if num_classes:
        model.head = nn.Linear(spec.width, num_classes)
    return model.eval()


def toy_preprocessing(model: ToyViT, spec: ToySpec) -> Preprocessing:
    """The family's preprocessing: the model's side, ImageNet's normalisation."""
    return Preprocessing(
        input_size=model.image_size,
        crop_pct=1.0,
        interpolation="bicubic",
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )


@pytest.fixture
def toy_family() -> Iterator[dict[str, Any]]:
    """The toy family registered (its spec and its architecture) for one test; its entry."""
    register_family(ToySpec)
    register_architecture(ToyArchitecture())
    try:
        yield {"family": "toy", "width": 16, "depth": 2, "heads": 2, "init_seed": 3}
    finally:
        unregister_architecture(ToyArchitecture.name)
        unregister_family(ToySpec.family)


# --- the proof: every stage takes it -------------------------------------------------------------


def test_the_entry_builds_through_the_front_door(toy_family: Mapping[str, Any]) -> None:
    """The entry is parsed into its family's spec by family:, built and preprocessed by the
    front door, and the model is the registered architecture's, every parameter accounted."""
    spec = ModelSpec.from_config(toy_family)
    assert spec == ToySpec(init_seed=3)
    model = build_model(toy_family, num_classes=5)
    assert isinstance(model, ToyViT) and model.head.out_features == 5
    assert architecture_for(model).name == "toy_vit"
    assert set(parameter_map(model).owners) == {name for name, _ in model.named_parameters()}
    assert preprocessing(model, spec).input_size == 32
    with pytest.raises(ValueError, match=r"unknown model keys \['timm_id'\]"):
        ModelSpec.from_config({**toy_family, "timm_id": "x"})


def test_plasticity_measures_the_toy_family(
    toy_family: dict[str, Any], demo_dataset: Path, tmp_path: Path
) -> None:
    """The plasticity stage on a few pairs: a finite mean per block and component."""
    from vitplasticity.plasticity.images import measure_dataset
    from vitplasticity.plasticity.settings import PlasticitySettings

    reference = tmp_path / "reference.parquet"
    write_reference(reference, 4, seed=5)
    settings = PlasticitySettings(n_pairs=4, batch_size=2, device="cpu")
    measurement = measure_dataset("toy", toy_family, reference, demo_dataset, settings)
    summary = measurement.summary
    assert summary["component"].to_list() == ["ln1", "mha", "ln2", "fc1", "fc2"] * 2
    assert summary["block"].to_list() == [0] * 5 + [1] * 5
    assert (summary["n_pairs"] == 4).all() and summary["mean"].is_finite().all()


def test_finetuning_trains_the_toy_family(
    toy_family: dict[str, Any], demo_dataset: Path, tmp_path: Path
) -> None:
    """`vitplasticity finetune` with the toy entry: a completed run training mha's parameters
    (and the head and final norm, as every configuration)."""
    out = tmp_path / "run"
    args = cli_args(ToySpec(init_seed=3), demo_dataset, out)
    args[args.index("--model-spec") + 1] = json.dumps(toy_family)
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_step"] == 6
    torch.manual_seed(0)
    model = build_model(toy_family, num_classes=4)
    mha = [p for block in model.blocks for p in block.attn.parameters()]
    head = [*model.norm.parameters(), *model.head.parameters()]
    assert summary["trainable_parameters"] == sum(p.numel() for p in [*mha, *head])


def test_recommend_ranks_the_toy_family(toy_family: dict[str, Any], demo_dataset: Path) -> None:
    """The recommend stage end to end: every criterion measured and ranked."""
    from vitplasticity.recommend.pipeline import RecommendInputs, recommend
    from vitplasticity.recommend.settings import RecommendImageSettings

    inputs = RecommendInputs(
        model="toy",
        dataset="demo-stripes",
        model_spec=ModelSpec.from_config(toy_family),
        reference_fallback="synthetic",
    )
    settings = RecommendImageSettings(
        n_pairs=8, batch_size=4, batches=2, warmup_steps=2, device="cpu", demo=True
    )
    result = recommend(inputs, settings, demo_dataset)
    plasticity = result.table.filter(result.table["criterion"] == "plasticity")
    assert sorted(plasticity["rank"].to_list()) == list(range(1, plasticity.height + 1))
    assert result.recommendation.configuration in set(plasticity["configuration"])


def test_the_fixture_leaves_no_trace() -> None:
    """Without the fixture the family is unknown again: registration is the only link."""
    assert "toy" not in FAMILIES and ToyArchitecture.name not in ARCHITECTURES
    with pytest.raises(ValueError, match="model entry family 'toy'"):
        ModelSpec.from_config({"family": "toy"})
