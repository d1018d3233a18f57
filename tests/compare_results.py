"""Compare two results trees (e.g. the demo before and after a refactoring) for identical numbers.

Usage: ``python -m tests.compare_results BEFORE AFTER`` (exit status 0: identical, 1: not).

What counts as identical:

- Parquet files: the data exactly (polars ``equals``: same schema, same values, NaN = NaN),
  after dropping the columns that time a run (:data:`VOLATILE`); the footer metadata too
  (provenance included) minus the volatile keys, found at any depth.
- JSON files: equal after removing the volatile keys at any depth.
- Text files (.tex, .csv, .tsv, .txt): byte-identical text.
- Figures (.pdf, .png, .svg): present on both sides (their bytes hold timestamps and fonts).

Logs, benchmark timings and Snakemake's own folders are skipped. A file only in AFTER is
listed as added, not a difference (a new output); a file only in BEFORE is a difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl

VOLATILE: frozenset[str] = frozenset(
    {
        "created",  # when the file was written
        "host",  # where
        "gpu_slot",  # on which of its GPUs (vitplasticity.utils.gpu_slots)
        "git_commit",  # from which commit (the point of the comparison is that it changed)
        "wall_seconds",  # how long it took
        "steps_per_second",
        "images_per_second",
        # A finished run's kept copy (finetune.finished's record.json) holds its files'
        # SHA-256, which change with the timings above.
        "sha256",
    }
)
"""Keys and columns that legitimately differ between two runs of the same computation."""

SKIPPED_DIRS: frozenset[str] = frozenset({"logs", "benchmarks", ".snakemake"})
TEXT_SUFFIXES: frozenset[str] = frozenset({".tex", ".csv", ".tsv", ".txt"})
FIGURE_SUFFIXES: frozenset[str] = frozenset({".pdf", ".png", ".svg"})


def strip_volatile(value: Any, volatile: frozenset[str] = VOLATILE) -> Any:
    """``value`` with every ``volatile`` key removed from its dicts, at any depth."""
    if isinstance(value, dict):
        return {k: strip_volatile(v, volatile) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [strip_volatile(v, volatile) for v in value]
    return value


def result_files(root: Path) -> set[str]:
    """The compared files below ``root``, as POSIX paths relative to it."""
    found = set()
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if path.is_file() and not SKIPPED_DIRS & set(relative.parts[:-1]):
            found.add(relative.as_posix())
    return found


def _parquet_difference(before: Path, after: Path, volatile: frozenset[str]) -> str | None:
    from vitplasticity.utils.io import read_parquet_metadata

    frames = []
    for path in (before, after):
        frame = pl.read_parquet(path)
        frames.append(frame.drop([c for c in frame.columns if c in volatile]))
    if frames[0].schema != frames[1].schema:
        return f"schema {frames[0].schema} != {frames[1].schema}"
    if frames[0].height != frames[1].height:
        return f"{frames[0].height} rows != {frames[1].height} rows"
    differing = [c for c in frames[0].columns if not frames[0][c].equals(frames[1][c])]
    if differing:
        return f"data differ in column(s) {', '.join(differing)}"
    meta = [strip_volatile(read_parquet_metadata(p), volatile) for p in (before, after)]
    if meta[0] != meta[1]:
        return f"footer metadata differs: {_first_difference(meta[0], meta[1])}"
    return None


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    """Where two JSON-like values first differ (a dotted path and both values)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or a[key] != b[key]:
                if key in a and key in b:
                    return _first_difference(a[key], b[key], f"{where}.{key}")
                return f"{where}.{key}: {a.get(key, '<absent>')!r} != {b.get(key, '<absent>')!r}"
    return f"{where or '.'}: {a!r:.120} != {b!r:.120}"


def compare_file(before: Path, after: Path, volatile: frozenset[str] = VOLATILE) -> str | None:
    """None when the two files count as identical (``volatile`` keys and columns aside),
    else what differs."""
    suffix = before.suffix.lower()
    if suffix == ".parquet":
        return _parquet_difference(before, after, volatile)
    if suffix == ".json":
        a, b = (strip_volatile(json.loads(p.read_text()), volatile) for p in (before, after))
        return None if a == b else _first_difference(a, b)
    if suffix in FIGURE_SUFFIXES:
        return None
    if suffix in TEXT_SUFFIXES:
        return None if before.read_text() == after.read_text() else "text differs"
    return None if before.read_bytes() == after.read_bytes() else "bytes differ"


def compare_trees(
    before: Path, after: Path, volatile: frozenset[str] = VOLATILE
) -> Iterator[tuple[str, str]]:
    """(relative path, verdict) for every file of either tree; verdict ``same``, ``added`` or
    a difference (``missing``, or what :func:`compare_file` found)."""
    old, new = result_files(before), result_files(after)
    for name in sorted(old | new):
        if name not in new:
            yield name, "missing"
        elif name not in old:
            yield name, "added"
        else:
            yield name, compare_file(before / name, after / name, volatile) or "same"


def main(argv: list[str] | None = None) -> int:
    """Print one line per file that is not the same; return 0 when no file differs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the reference results tree")
    parser.add_argument("after", type=Path, help="the results tree to check")
    parser.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="KEY",
        help="also ignore this JSON key / Parquet column (repeatable), e.g. a provenance "
        "field that another change added",
    )
    args = parser.parse_args(argv)
    volatile = VOLATILE | set(args.ignore)
    for root in (args.before, args.after):
        if not root.is_dir():
            parser.error(f"not a folder: {root}")
    counts = {"same": 0, "added": 0, "different": 0}
    for name, verdict in compare_trees(args.before, args.after, volatile):
        if verdict == "same":
            counts["same"] += 1
            continue
        counts["added" if verdict == "added" else "different"] += 1
        print(f"{verdict:>8}  {name}" if verdict == "added" else f"DIFFERS   {name}: {verdict}")
    print(
        f"{counts['same']} files identical, {counts['different']} different, "
        f"{counts['added']} added (in {args.after} only)"
    )
    return 1 if counts["different"] else 0


if __name__ == "__main__":
    sys.exit(main())
