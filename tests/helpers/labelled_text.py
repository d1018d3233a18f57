"""A labelled real-text dataset every Debian machine can build: the paragraphs of licences in
/usr/share/common-licenses (base-files), each labelled by its licence. English prose of three
kinds, long enough to be worth classifying, small enough for a test. And a synthetic one a
tiny model learns in a few steps (:func:`write_first_byte_csv`)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

LICENCES_FOLDER = Path("/usr/share/common-licenses")
LICENCES = ("GFDL-1.3", "GPL-3", "MPL-2.0")
"""The licences whose paragraphs are the documents (49, 87 and 38 of 20 words or more)."""
MIN_WORDS = 20


def licence_paragraphs(licences: tuple[str, ...] = LICENCES) -> list[tuple[str, str]]:
    """(paragraph, licence) of every paragraph of ``MIN_WORDS`` words or more, whitespace
    folded, in file order."""
    rows = []
    for licence in licences:
        text = (LICENCES_FOLDER / licence).read_text(encoding="utf-8")
        for paragraph in re.split(r"\n\s*\n", text):
            words = paragraph.split()
            if len(words) >= MIN_WORDS:
                rows.append((" ".join(words), licence))
    return rows


def write_licence_csv(path: Path, licences: tuple[str, ...] = LICENCES) -> Path:
    """Write the paragraphs as a CSV with ``text`` and ``label`` columns; return ``path``."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(licence_paragraphs(licences))
    return path


def write_first_byte_csv(path: Path, rows: int = 60) -> Path:
    """Write a CSV of ``rows`` documents of two classes, ``odd`` and ``even``, that the first
    byte tells apart (``x`` or ``y``; the rest is noise of the same bytes for both); return
    ``path``."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(
            (("x" if i % 2 else "y") + "abcdefgh"[i % 5 :], "odd" if i % 2 else "even")
            for i in range(rows)
        )
    return path


if __name__ == "__main__":
    import sys

    print(write_licence_csv(Path(sys.argv[1])))
