"""The package version (pyproject.toml's), quoted in ``--version`` and in generated tables."""

__version__ = "0.1.0"
