"""The repository's root, for every test that reads or runs its files."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout: where the Snakefile, config.yaml, docs/ and src/ are."""
