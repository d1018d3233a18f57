"""The real dataset sources: one module per family, one registry of remote files.

``SOURCES[source].prepare(name, spec, out_dir, downloads)`` fetches (or finds) the files a
dataset entry needs, verifies them, parses the original formats and writes the prepared
store. Importing this package is cheap (no numpy, no torch): the Snakefile reads
:mod:`.registry` through it to wire the download jobs; a source's module is imported only
when it prepares.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitplasticity.data.sources.registry import FILES, KNOWN_COUNTS, RemoteFile, source_files

__all__ = ["FILES", "KNOWN_COUNTS", "SOURCES", "RemoteFile", "Source", "source_files"]


@dataclass(frozen=True)
class Source:
    """A source family: the module whose ``prepare`` parses its files."""

    name: str
    module: str

    def prepare(
        self, name: str, spec: dict[str, Any], out_dir: Path, downloads: Path, **options: Any
    ) -> dict[str, int]:
        """Prepare dataset ``name`` (config entry ``spec``) into ``out_dir``; return split sizes.

        ``options`` reach the module's ``prepare``: ``files`` (registry entries replacing
        the built-in ones) and ``expected`` (split sizes replacing the known ones), for
        tests and private mirrors.
        """
        module = importlib.import_module(f"vitplasticity.data.sources.{self.module}")
        return module.prepare(name, {**spec, "source": self.name}, out_dir, downloads, **options)


SOURCES: dict[str, Source] = {
    "cifar10": Source("cifar10", "cifar"),
    "cifar100": Source("cifar100", "cifar"),
    "cifar10c": Source("cifar10c", "cifar10c"),
    "domainnet": Source("domainnet", "domainnet"),
    "flowers102": Source("flowers102", "flowers"),
    "pet": Source("pet", "pet"),
}
