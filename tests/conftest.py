"""Shared fixtures: a tiny random-init timm ViT and a small prepared dataset."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.helpers.tiny_vit import TINY_SPEC
from tests.helpers.xdist_scopes import SlurmApartScheduling, order_for_workers
from vitplasticity.models.build import build_model
from vitplasticity.models.spec import TimmSpec

# The real checkpoints' fixtures (minilm_folder), for every test module.
pytest_plugins = ["tests.helpers.real_checkpoints"]


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for a module's tests: tiny models run fastest so, and the machine's
    CPUs are shared (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order the xdist workers take the files in (tests/helpers/xdist_scopes.py); tests
    marked ``gpu`` are skipped, saying why, where torch sees no CUDA device."""
    order_for_workers(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: needs a CUDA device, none is visible to torch")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called where it runs the suite
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> SlurmApartScheduling | None:
    """``--dist loadfile`` keeps the local SLURM's files in one unit (xdist's own otherwise)."""
    if config.getvalue("dist") == "loadfile":
        return SlurmApartScheduling(config, log)
    return None


@pytest.fixture
def tiny_spec() -> TimmSpec:
    """The spec of a 3-block, 48-wide ViT at 32 px (16 patches + cls token)."""
    return TINY_SPEC


@pytest.fixture
def tiny_vit() -> torch.nn.Module:
    """A tiny random-init timm VisionTransformer in eval mode, seeded."""
    torch.manual_seed(0)
    return build_model(TINY_SPEC, num_classes=0).eval()


@pytest.fixture(scope="session")
def demo_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic dataset (4 classes, 64 pool + 32 test images at 32 px) in the store."""
    from vitplasticity.data.synthetic import prepare_synthetic

    out = tmp_path_factory.mktemp("store") / "demo-stripes"
    spec = {
        "style": "stripes",
        "num_classes": 4,
        "n_pool": 64,
        "n_test": 32,
        "image_size": 32,
        "seed": 1,
    }
    prepare_synthetic(out, "demo-stripes", spec)
    return out
